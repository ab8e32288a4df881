"""Failing together: every rank learns every other rank's setup errors, then all exit.

Each setup phase runs on every rank without collectives inside; its outcome (an error
message or ``None``) is then shared with one ``allgather``, so no rank is ever left waiting
in a collective that a failed rank will not reach. If anyone failed, rank 0 prints every
message (prefixed with the failing rank) and all ranks exit with status 2.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Literal, NoReturn, TypeVar

from pydantic import BaseModel, Field

from plumbing.atomic import write_text
from plumbing.errors import PipelineError
from proxyfl.comm.control import allgather_json
from proxyfl.results import RUN_FILE

logger = logging.getLogger(__name__)
T = TypeVar("T")
EXIT_BAD_INPUT = 2
EXIT_STOPPED = 128 + signal.SIGINT
"""A rank's status when its launcher stopped it (the shell's for a command ended by SIGINT):
never the cause of a failed job (proxyfl.launch.job), which another rank or the launcher
says."""


class SetupError(PipelineError):
    """Bad input found before training (the message is shown to the user as is)."""

    def __init__(self, reason: str) -> None:
        super().__init__(None, reason)


FAILURES_DIR = "failures"


class RankFailure(BaseModel):
    """What a rank that fails leaves in ``RUN_DIR/failures/rank_{k}.json`` for the launcher
    (:mod:`proxyfl.launch.job`) to name it: which rank, at which phase, and why."""

    rank: int = Field(ge=0)
    client: str = Field(description="the rank as the user knows it: 'rank 1 (centre 1)'")
    phase: Literal["setup", "training"]
    error: str
    time: float = Field(default_factory=time.time, description="when it failed (epoch s)")


def failure_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / FAILURES_DIR / f"rank_{rank}.json"


def record_failure(run_dir: Path, failure: RankFailure) -> None:
    """Leave ``failure`` for the launcher; never raises (the rank is failing already)."""
    try:
        write_text(failure_path(run_dir, failure.rank), failure.model_dump_json(indent=2) + "\n")
    except OSError as error:
        logger.warning("could not record the failure in %s: %s", run_dir, error)


def fault_path(run_dir: Path, rank: int) -> Path:
    """The fault record of the job's process ``rank`` (an MPI rank, whatever clients it
    hosts: :class:`FatalSignalRecord`)."""
    return Path(run_dir) / FAILURES_DIR / f"rank_{rank}.fault"


def rank_name(run_dir: Path, rank: int) -> str:
    """How process ``rank`` named itself in its fault record (``rank 1 (centre 1)``,
    ``rank 1 (clients 2, 3)``), for a rank a signal ended before it could say more;
    ``rank R`` where it left none."""
    try:
        with open(fault_path(run_dir, rank), encoding="utf-8", errors="replace") as record:
            header = record.readline().strip()
    except OSError:
        header = ""
    return header if header.startswith(f"rank {rank}") else f"rank {rank}"


class FatalSignalRecord:
    """Where a rank's fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL: a crash in
    native code, or a full /dev/shm) is written, by :mod:`faulthandler`, with every
    thread's stack: ``failures/rank_{k}.fault``, whose first line names the rank. A rank
    ended so runs no Python and leaves no :class:`RankFailure`; :func:`read_failures`
    reads this instead. :meth:`close` (a rank that ends normally) removes it."""

    def __init__(self, run_dir: Path, rank: int, client: str) -> None:
        self.path = fault_path(run_dir, rank)
        self._file: IO[str] | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (for the process's life)
            self._file.write(client + "\n")
            self._file.flush()
        except OSError as error:  # the run goes on; only a crash would go unnamed
            logger.warning("no fault record in %s: %s", self.path.parent, error)
            return
        faulthandler.enable(self._file, all_threads=True)

    def close(self) -> None:
        if self._file is None:
            return
        faulthandler.disable()
        self._file.close()
        self._file = None
        self.path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # only when no other rank left anything there
            self.path.parent.rmdir()


def _read_fault(run_dir: Path, path: Path) -> RankFailure | None:
    """The failure a fault record holds, or ``None`` while it holds only its header."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    if len(lines) < 2:
        return None
    fatal = next((line for line in lines[1:] if line.startswith("Fatal Python error")),
                 lines[1])  # fmt: skip
    return RankFailure(
        rank=int(path.stem.removeprefix("rank_")),
        client=lines[0],
        # run.json is written once every rank has finished its setup
        phase="training" if (Path(run_dir) / RUN_FILE).is_file() else "setup",
        error=f"ended by a fatal signal ({fatal.strip()}; its stack: {path})",
        time=path.stat().st_mtime,
    )


def read_failures(run_dir: Path) -> list[RankFailure]:
    """The failures a job's ranks recorded (:func:`record_failure`, or a fatal signal's
    :class:`FatalSignalRecord`), the first to fail first."""
    failures = []
    folder = Path(run_dir) / FAILURES_DIR
    for path in sorted(folder.glob("rank_*.json")):
        try:
            failures.append(RankFailure.model_validate_json(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as error:
            logger.warning("unreadable failure record %s: %s", path, error)
    for path in sorted(folder.glob("rank_*.fault")):
        try:
            fault = _read_fault(run_dir, path)
        except (OSError, ValueError) as error:
            logger.warning("unreadable fault record %s: %s", path, error)
            continue
        if fault is not None:
            failures.append(fault)
    return sorted(failures, key=lambda failure: (failure.time, failure.rank))


def clear_failures(run_dir: Path) -> None:
    """Forget the failures of an earlier attempt (the launcher, before a job starts)."""
    shutil.rmtree(Path(run_dir) / FAILURES_DIR, ignore_errors=True)


def run_phase(action: Callable[[], T]) -> tuple[T | None, str | None]:
    """Run ``action`` locally; ``(result, None)`` or ``(None, error message)``."""
    try:
        return action(), None
    except SystemExit:
        raise
    except Exception as error:  # any failure must reach the agreement, never hang a peer
        message = str(error) or type(error).__name__
        if not isinstance(error, PipelineError | ValueError | KeyError | OSError):
            logger.exception("unexpected error during setup")
            message = f"{type(error).__name__}: {message}"
        return None, message


def agree(comm: Any, error: str | None, label: Callable[[int], str] | None = None) -> list[str]:
    """All ranks' error messages (one all-gather of JSON, :mod:`proxyfl.comm.control`), each
    prefixed with its rank."""
    errors = allgather_json(comm, error)
    unique: list[str] = []
    for rank, message in enumerate(errors):
        if message is None:
            continue
        prefix = label(rank) if label else f"rank {rank}"
        unique.append(f"{prefix}: {message}")
    return unique


def ending_together() -> None:
    """From here on this process ignores SIGINT, for it is ending with its peers.

    The first rank to exit non-zero makes the launcher stop the others (``python -m
    mpi4py`` ends a rank's ``SystemExit(2)`` by MPI_Abort, and MPICH's launcher then sends
    SIGINT), which may still be running their exit handlers: no ``KeyboardInterrupt``
    traceback from a handler follows the one error line. Only the main thread may set a
    handler: a hosted client's thread leaves it to its rank's (:mod:`proxyfl.hosted`)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def exit_together(comm: Any, messages: list[str], program: str = "proxyfl.run") -> NoReturn:
    """Rank 0 prints ``messages``; every rank exits with status 2, ignoring SIGINT from
    here on (:func:`ending_together`)."""
    ending_together()
    if comm.Get_rank() == 0:
        for message in _deduplicate(messages):
            print(f"{program}: error: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    raise SystemExit(EXIT_BAD_INPUT)


def _deduplicate(messages: list[str]) -> list[str]:
    """Collapse identical messages reported by several ranks into one line."""
    by_text: dict[str, list[str]] = {}
    for message in messages:
        prefix, _, text = message.partition(": ")
        by_text.setdefault(text, []).append(prefix)
    lines = []
    for text, prefixes in by_text.items():
        if len(prefixes) == 1:
            lines.append(f"{prefixes[0]}: {text}")
        elif all(p.startswith("rank ") for p in prefixes):
            lines.append(f"ranks {', '.join(p.removeprefix('rank ') for p in prefixes)}: {text}")
        else:  # clients that ranks host (proxyfl.hosted)
            clients = ", ".join(p.removeprefix("client ") for p in prefixes)
            lines.append(f"clients {clients}: {text}")
    return lines


def check_or_exit(comm: Any, error: str | None, program: str = "proxyfl.run") -> None:
    """Agree on ``error`` across ranks and exit together if any rank has one."""
    messages = agree(comm, error)
    if messages:
        exit_together(comm, messages, program)
