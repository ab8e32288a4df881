"""One writer per artefact: an exclusive, non-blocking lock beside each file or directory a
run writes (a centre's store, a run directory), so that a second run aimed at the same
artefact is refused at once instead of racing the first (the last writer would win).

The lock is the kernel's (``flock``, through :mod:`filelock`), so it is released when its
holder exits, however it exits: a killed run leaves no stale lock. The lock files
(``.{name}.lock``) stay beside their targets, empty; ``.dvcignore`` ignores them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from filelock import FileLock, Timeout

from plumbing.errors import PipelineError


class Busy(PipelineError):
    """Another process holds the lock of an artefact this run would write."""


def lock_path(target: str | os.PathLike[str]) -> Path:
    """The lock file of ``target``: ``.{name}.lock`` beside it."""
    target = Path(target)
    return target.parent / f".{target.name}.lock"


@contextlib.contextmanager
def exclusive(targets: Sequence[str | os.PathLike[str]], doing: str) -> Iterator[None]:
    """Hold the lock of every one of ``targets`` for the block, or raise :class:`Busy`
    naming the first that another process holds (``doing``: what this run would do to it,
    for the message)."""
    with contextlib.ExitStack() as stack:
        for target in targets:
            path = lock_path(target)
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                stack.enter_context(FileLock(path, timeout=0))
            except Timeout:
                raise Busy(target, f"another run is {doing} it (it holds {path}); wait for "
                           "it to finish, or stop it") from None  # fmt: skip
        yield
