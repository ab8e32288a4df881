"""Prefect's process pool, with workers that do not outlive the flow that started them.

Each worker asks the kernel for SIGKILL when its parent dies
(:func:`plumbing.processes.die_with_parent`), so a flow killed outright (SIGKILL) takes
its workers with it. Dask's local cluster needs nothing of the kind: each worker process
of ``distributed``'s nanny exits by itself when its parent goes away (it blocks on a pipe
whose other end only the parent holds). The pool forks from its own executor threads,
which outlive its workers.
"""

from __future__ import annotations

import os
from typing import Self

from prefect.task_runners import ProcessPoolTaskRunner

from plumbing.processes import die_with_parent


class ParentBoundProcessPool(ProcessPoolTaskRunner):
    """Prefect's process-pool task runner, whose workers die with the process that started
    the pool (see the module's docstring)."""

    def __enter__(self) -> Self:
        # Bound on entry, not construction: a copy of the runner entered in another process
        # (Prefect duplicates it into every worker) binds to that process.
        self._initializer = die_with_parent
        self._initargs = (os.getpid(),)
        return super().__enter__()
