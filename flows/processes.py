"""Prefect's process pool, with workers that start cheaply and do not outlive the flow that
started them.

Prefect's pool spawns each worker: a fresh interpreter that imports Prefect and the task's
modules again (about 2 s of CPU a worker, most of a small task's cost). This pool forks its
workers from a fork server that imported them once (:mod:`plumbing.forkserver`: how a
worker still starts as a spawned one would, and how it dies with the flow, even one killed
outright). Dask's local cluster needs nothing of the kind: each worker process of
``distributed``'s nanny exits by itself when its parent goes away (it blocks on a pipe
whose other end only the parent holds).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Self

from prefect.task_runners import ProcessPoolTaskRunner, _initialize_process_pool_worker

from plumbing import forkserver

# what every worker imports to run a task (prefect.task_runners imports it per task)
_TASK_MODULES = ("prefect.task_engine",)


class ParentBoundProcessPool(ProcessPoolTaskRunner):
    """Prefect's process-pool task runner, whose workers fork from a fork server that has
    imported Prefect's task engine and ``preload``, and die with the process that started
    the pool (see the module's docstring)."""

    def __init__(self, max_workers: int | None = None, preload: Sequence[str] = ()) -> None:
        super().__init__(max_workers=max_workers)
        self._preload = tuple(preload)

    def duplicate(self) -> Self:  # Prefect runs a flow on a duplicate of its runner
        duplicate_runner = super().duplicate()
        duplicate_runner._preload = self._preload
        return duplicate_runner

    def __enter__(self) -> Self:
        # Prefect 3.8's __enter__ with the workers' start method changed (it spawns). Bound
        # on entry, not construction: a copy of the runner entered in another process
        # (Prefect duplicates it into every worker) binds to that process.
        self._initializer = forkserver.start_worker
        self._initargs = (os.getpid(), dict(os.environ))
        super(ProcessPoolTaskRunner, self).__enter__()
        context = forkserver.worker_context([*_TASK_MODULES, *self._preload])
        self._subprocess_message_queue = context.Queue()
        self._message_forwarding_thread = threading.Thread(
            target=self._forward_subprocess_messages,
            name="ProcessPoolTaskRunnerMessageForwarder",
            daemon=True,
        )
        self._message_forwarding_thread.start()
        try:
            self._executor = ProcessPoolExecutor(
                max_workers=self._max_workers,
                mp_context=context,
                initializer=_initialize_process_pool_worker,
                initargs=(self._subprocess_message_queue, self._initializer, self._initargs),
            )
            self._resolver_executor = ThreadPoolExecutor(max_workers=self._max_workers)
        except Exception:
            if self._executor is not None:
                self._executor.shutdown(cancel_futures=True, wait=True)
                self._executor = None
            self._stop_message_forwarding()
            raise
        return self

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        # The fork server started (or found running) in the thread that submits, the
        # flow's, not in the short-lived threads Prefect starts workers from; and not on
        # entry: Prefect enters a copy of the runner in every worker, which submits nothing
        forkserver.ensure_running()
        return super().submit(*args, **kwargs)
