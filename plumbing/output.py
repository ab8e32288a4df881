"""Output that goes around a launcher: a process writes straight to what its starter gave it.

MPICH's fork launcher (``mpiexec.gforker``, the one that needs no network socket) relays
its ranks' output, but stops at the first byte above 127 (a UTF-8 "ε" ends a rank's
output, and the rank's next write fails). So the process that starts the launcher passes
file descriptors down to the ranks (``subprocess``'s ``pass_fds``, named in the
environment by :func:`passing_output`), and each rank calls :func:`adopt_passed_output`
first thing: its stdout and stderr become those descriptors, line-buffered, so that each
line reaches a shared pipe in one ``write`` and lines of different ranks never interleave
(up to ``PIPE_BUF``, 4 KiB, per line).
"""

from __future__ import annotations

import io
import os
import stat
import sys

OUTPUT_FDS = "PLUMBING_OUTPUT_FDS"


def passing_output(stdout_fd: int, stderr_fd: int) -> dict[str, str]:
    """The environment entry that hands ``stdout_fd`` and ``stderr_fd`` (inherited: pass
    them in ``pass_fds``) to every process that calls :func:`adopt_passed_output`."""
    return {OUTPUT_FDS: f"{stdout_fd},{stderr_fd}"}


def _usable(fd: int) -> bool:
    """An open pipe or file (not a descriptor number inherited by accident)."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def _line_buffered(fd: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        open(fd, "wb", closefd=False),
        encoding="utf-8", errors="backslashreplace", line_buffering=True,
    )  # fmt: skip


def adopt_passed_output() -> bool:
    """Point stdout and stderr (the descriptors, 1 and 2, and ``sys.stdout``/``sys.stderr``)
    at the descriptors :func:`passing_output` named, if any; whether it did. The entry is
    removed from the environment, so this process's own children write to 1 and 2."""
    value = os.environ.pop(OUTPUT_FDS, None)
    if not value:
        return False
    fds = [int(part) for part in value.split(",")]
    if len(fds) != 2 or not all(map(_usable, fds)):
        return False
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in set(fds) - {1, 2}:
        os.close(fd)
    sys.stdout, sys.stderr = _line_buffered(1), _line_buffered(2)
    return True
