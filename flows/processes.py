"""Child processes that do not outlive the process that started them.

A flow killed with SIGKILL runs no cleanup, so its process-pool workers and its Prefect
server would otherwise live on with PPID 1 (the workers still publishing stores). On Linux
each such child asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``):

- process-pool workers call :func:`die_with_parent` as their initializer
  (:class:`ParentBoundProcessPool`);
- programs started with ``subprocess`` are wrapped by :func:`parent_bound_command`.

Dask's local cluster needs neither: each worker process of ``distributed``'s nanny exits by
itself when its parent goes away (it blocks on a pipe whose other end only the parent
holds). The kernel sends the signal when the *thread* that forked the child exits, so the
children must be forked from threads that live as long as they do: the process pool forks
from its own executor threads, which outlive its workers, and :mod:`flows.server` starts the
server from the thread that then waits on it. Elsewhere than on Linux this module does
nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence
from typing import Self

from prefect.task_runners import ProcessPoolTaskRunner

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# What parent_bound_command runs before the program: the same steps as die_with_parent,
# then exec (the death signal survives execve). Inline rather than `-m flows.processes`
# so that it needs nothing importable; no preexec_fn, which is unsafe once threads run.
_EXEC_BOUND = (
    "import ctypes, os, signal, sys\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0) != 0:\n"
    "    raise OSError(ctypes.get_errno(), 'prctl(PR_SET_PDEATHSIG) failed')\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def binds_children() -> bool:
    """Whether children can be bound to their parent here (Linux only)."""
    return sys.platform.startswith("linux")


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL the calling process when its parent dies.

    ``parent_pid`` is the parent that started us: if it is no longer our parent, it died
    before the request took effect, and we exit at once. Does nothing off Linux.
    """
    if not binds_children():
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if os.getppid() != parent_pid:
        os._exit(1)


def parent_bound_command(argv: Sequence[str]) -> list[str]:
    """``argv`` (an executable's path, then its arguments) as a command whose process gets
    SIGKILL when the calling process dies; ``argv`` itself off Linux."""
    if not binds_children():
        return list(argv)
    return [sys.executable, "-c", _EXEC_BOUND, str(os.getpid()), *argv]


class ParentBoundProcessPool(ProcessPoolTaskRunner):
    """Prefect's process-pool task runner, whose workers die with the process that started
    the pool (see the module's docstring)."""

    def __enter__(self) -> Self:
        # Bound on entry, not construction: a copy of the runner entered in another process
        # (Prefect duplicates it into every worker) binds to that process.
        self._initializer = die_with_parent
        self._initargs = (os.getpid(),)
        return super().__enter__()
