"""Atomic writes, the one way the project writes a file a reader may open.

Every writer (stores, slides, candidate-cache entries, checkpoints, metrics, reports)
fills ``.{name}.{pid}.tmp`` beside its target, flushes and fsyncs it, and renames it into
place with ``os.replace``; on any failure the temporary is removed and the target is left
as it was, so a reader never sees a torn file. :func:`atomic_write` hands out an open
file, :func:`atomic_path` the temporary's path (for libraries that open files themselves:
h5py, tifffile, ``torch.save``), :func:`write_text` and :func:`write_json` cover the
common cases. A run killed mid-write (SIGKILL, out of memory, power loss) leaves its
temporary behind, hidden and possibly gigabytes large; :func:`remove_stale_temporaries`
removes those whose writer is gone, never one a live process may still be filling.

The PID test is local to this machine: on a filesystem shared between hosts, another
host's live writer looks dead from here. Run the sweep only on directories that one host
writes to.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import logging
import os
import re
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import IO, Any, ParamSpec, TypeVar

import psutil

from plumbing.refusals import naming

log = logging.getLogger(__name__)

_TEMPORARY = re.compile(r"\.(?P<target>.+)\.(?P<pid>[0-9]+)\.tmp")

PID_REUSE_MARGIN_S = 2.0
"""Slack when comparing a process's start with a file's modification: the kernel gives
the boot time in whole seconds, so a process's start time is off by up to 1 s."""


def temporary_path(path: str | os.PathLike[str], pid: int | None = None) -> Path:
    """Where process ``pid`` (this one by default) writes ``path`` before renaming it."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid() if pid is None else pid}.tmp")


def parse_temporary(path: str | os.PathLike[str]) -> tuple[str, int] | None:
    """(target file name, writer's PID) of a temporary's path, ``None`` for another file."""
    match = _TEMPORARY.fullmatch(Path(path).name)
    if match is None:
        return None
    return match["target"], int(match["pid"])


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (any user's; a zombie counts)."""
    return pid > 0 and psutil.pid_exists(pid)


def process_start_time(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, to within about a second:
    psutil's ``create_time``); ``None`` where that cannot be read."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def may_be_written(path: Path, pid: int) -> bool:
    """Whether process ``pid`` may still be writing ``path``: it is alive, and (where the
    start time is known) it started before the file was last modified; a process started
    later holds a reused PID and cannot have written the file."""
    if not process_alive(pid):
        return False
    started = process_start_time(pid)
    if started is None:
        return True  # alive and nothing more known: keep the file
    try:
        modified = path.stat().st_mtime
    except FileNotFoundError:
        return True  # gone already: nothing to decide
    return started <= modified + PID_REUSE_MARGIN_S


def remove_stale_temporaries(
    directory: str | os.PathLike[str], *, targets: Collection[str] | None = None
) -> list[Path]:
    """Remove the temporaries (``.{name}.{pid}.tmp``) in ``directory`` left by dead writers.

    A temporary is stale when its PID is not a live process here, or is the PID of a
    process started after the file was last modified (the PID was reused). Files of live
    writers, this process's included, are kept. ``targets`` limits the sweep to the
    temporaries of those file names (e.g. ``{"center_0.h5"}``); by default all are swept.
    The directory itself is not descended into. Returns the files removed, sorted; a
    missing directory has none.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for path in sorted(directory.iterdir()):
        parsed = parse_temporary(path)
        if parsed is None or (targets is not None and parsed[0] not in targets):
            continue
        if not path.is_file() or path.is_symlink() or may_be_written(path, parsed[1]):
            continue
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:  # removed meanwhile, e.g. by another sweep
            continue
        log.info(
            "removed %s (%d bytes) left by process %d, no longer running", path, size, parsed[1]
        )
        removed.append(path)
    return removed


def commit(temporary: Path, path: Path) -> None:
    """Make a fully written ``temporary`` durable and rename it onto ``path``: fsync the
    file, ``os.replace``, fsync the directory (so the rename survives a power loss)."""
    with temporary.open("rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    _sync_directory(path.parent)


P = ParamSpec("P")
R = TypeVar("R")
# the writes of an all_or_nothing block: path -> its written temporary, committed together
_WRITTEN_TOGETHER: contextvars.ContextVar[dict[Path, Path] | None] = contextvars.ContextVar(
    "written_together", default=None
)


@contextlib.contextmanager
def all_or_nothing() -> Iterator[None]:
    """Every atomic write in the block (this thread's, and its context's copies') is
    committed when the block ends normally, all together, or none is: a block that raises
    (a full disk half-way, Ctrl-C) removes what it wrote and leaves every earlier file as
    it was, never a set of outputs half new and half old. The files are written and synced
    as the block goes; only their renames wait for its end, which need no space. (A power
    loss during those renames may still leave some renamed: each file is whole either way.)

    >>> with all_or_nothing():
    ...     write_text(tables / "accuracy.md", table)
    ...     write_text(out / "report.html", page)
    """
    if _WRITTEN_TOGETHER.get() is not None:  # nested: the outer block commits
        yield
        return
    written: dict[Path, Path] = {}
    token = _WRITTEN_TOGETHER.set(written)
    try:
        yield
    except BaseException:
        for temporary in written.values():
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
        raise
    finally:
        _WRITTEN_TOGETHER.reset(token)
    for path, temporary in written.items():
        os.replace(temporary, path)
    for folder in {path.parent for path in written}:
        _sync_directory(folder)


def written_together(function: Callable[P, R]) -> Callable[P, R]:
    """``function`` with every atomic write it makes in one :func:`all_or_nothing` block."""

    @functools.wraps(function)
    def together(*args: P.args, **kwargs: P.kwargs) -> R:
        with all_or_nothing():
            return function(*args, **kwargs)

    return together


def read_written(path: str | os.PathLike[str]) -> bytes:
    """``path``'s bytes as this block wrote them: inside :func:`all_or_nothing`, a file
    written in the block is still its temporary until the block ends."""
    together = _WRITTEN_TOGETHER.get() or {}
    return together.get(Path(path).absolute(), Path(path)).read_bytes()


def _sync_directory(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be opened
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """The :func:`temporary_path` of ``path`` for a library to write; committed onto
    ``path`` when the block ends normally (inside :func:`all_or_nothing`: when that block
    does), removed when it raises (anything, Ctrl-C too).

    >>> with atomic_path(path) as temporary:
    ...     torch.save(state, temporary)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_path(path)
    together = _WRITTEN_TOGETHER.get()
    try:
        with naming(path):  # a write's ENOSPC names no file: say which
            yield temporary
            if together is None:
                commit(temporary, path)
            else:  # synced now, renamed with the others at the end of the block
                with temporary.open("rb+") as handle:
                    os.fsync(handle.fileno())
                together[path.absolute()] = temporary
    except BaseException:
        # a folder that refused the write may refuse the clean-up too: the first error says it
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """Open the temporary of ``path`` for writing (``mode`` ``"w"`` writes UTF-8 text);
    committed onto ``path`` when the block ends normally, removed when it raises.

    >>> with atomic_write(path, "w") as handle:
    ...     handle.write(text)
    """
    encoding = None if "b" in mode else "utf-8"
    with atomic_path(path) as temporary, temporary.open(mode, encoding=encoding) as handle:
        yield handle


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_write(path, "wb") as handle:
        handle.write(data)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_write(path, "w") as handle:
        handle.write(text)


def write_json(path: str | os.PathLike[str], payload: Any, *, sort_keys: bool = False) -> None:
    """Write ``payload`` as indented JSON (and a final newline) to ``path`` atomically."""
    write_text(path, json.dumps(payload, indent=2, sort_keys=sort_keys) + "\n")


def blocking_write(folder: str | os.PathLike[str]) -> Path | None:
    """The existing directory that keeps files from being written in ``folder`` (itself,
    or its nearest existing parent where it is still to be made): read-only, another
    user's, or not a directory; ``None`` when ``folder`` can be written."""
    folder = Path(folder)
    existing = next((p for p in (folder, *folder.absolute().parents) if p.exists()), None)
    if existing is None:
        return None
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return existing
    return None


def unwritable_reason(folder: str | os.PathLike[str], writes: str) -> str | None:
    """``"FOLDER: cannot be written (...)"`` with what ``writes`` there, or ``None``."""
    blocking = blocking_write(folder)
    if blocking is None:
        return None
    why = "not a directory" if not blocking.is_dir() else "read-only, or not yours"
    return f"{folder}: cannot be written ({blocking} is {why}): {writes}"
