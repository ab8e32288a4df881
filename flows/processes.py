"""Prefect's process pool, with workers that start cheaply and do not outlive the flow that
started them.

**Start-up.** Prefect's pool spawns each worker: a fresh interpreter that imports Prefect
and the task's modules again (about 2 s of CPU a worker, most of a small task's cost). This
pool forks its workers from a fork server instead (:mod:`multiprocessing`'s
``forkserver``: a single-threaded process started once per process that opens a pool,
which imports ``preload`` once). A worker starts as a spawned one would: with the
starting process' working folder, ``sys.path`` and environment (the server's own
environment is replaced by the one the pool was opened under).

**Lifetime.** Each worker asks the kernel for SIGKILL when its parent, the fork server,
dies (:func:`plumbing.processes.die_with_parent`), and the fork server exits when the
process that started it does (it reads end of file on a pipe only that process holds), so
a flow killed outright (SIGKILL) takes its workers with it. A worker that finds the flow
already gone exits at once. Dask's local cluster needs nothing of the kind: each worker
process of ``distributed``'s nanny exits by itself when its parent goes away (it blocks on a
pipe whose other end only the parent holds).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Self

from prefect.task_runners import ProcessPoolTaskRunner, _initialize_process_pool_worker

from flows import fork_server
from plumbing.processes import die_with_parent

# what the fork server imports first: the binding to its starter (flows.fork_server; it
# does nothing here), then what every worker imports to run a task (prefect.task_runners
# imports it per task)
_FORK_SERVER_MODULES = (fork_server.__name__, "prefect.task_engine")


def _start_worker(flow_pid: int, environment: Mapping[str, str]) -> None:
    """A worker's first step: bound to the fork server, gone if the flow is, and given the
    environment the pool was opened under."""
    die_with_parent(os.getppid())
    try:
        os.kill(flow_pid, 0)
    except ProcessLookupError:  # the flow died before the binding: so did its server
        os._exit(1)
    os.environ.clear()
    os.environ.update(environment)


def _worker_context(preload: Sequence[str]) -> multiprocessing.context.BaseContext:
    """Fork-server workers with ``preload`` imported where the platform has them; spawned
    ones elsewhere. The fork server is one per process: the first pool's ``preload`` is
    what it imports."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([*_FORK_SERVER_MODULES, *preload])
    return context


class ParentBoundProcessPool(ProcessPoolTaskRunner):
    """Prefect's process-pool task runner, whose workers fork from a fork server that has
    imported ``preload`` and die with the process that started the pool (see the module's
    docstring)."""

    def __init__(self, max_workers: int | None = None, preload: Sequence[str] = ()) -> None:
        super().__init__(max_workers=max_workers)
        self._preload = tuple(preload)
        self._forks = False  # workers fork from a fork server (set on entry)

    def duplicate(self) -> Self:  # Prefect runs a flow on a duplicate of its runner
        duplicate_runner = super().duplicate()
        duplicate_runner._preload = self._preload
        return duplicate_runner

    def __enter__(self) -> Self:
        # Prefect 3.8's __enter__ with the workers' start method changed (it spawns). Bound
        # on entry, not construction: a copy of the runner entered in another process
        # (Prefect duplicates it into every worker) binds to that process.
        self._initializer = _start_worker
        self._initargs = (os.getpid(), dict(os.environ))
        super(ProcessPoolTaskRunner, self).__enter__()
        context = _worker_context(self._preload)
        self._forks = context.get_start_method() == "forkserver"
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
        if self._forks:
            # The fork server started (or found running) in the thread that submits, the
            # flow's: the kernel binds the server to the thread that started it
            # (flows.fork_server), and Prefect starts workers from short-lived threads of
            # its own. Not on entry: Prefect enters a copy of the runner in every worker,
            # which submits nothing.
            multiprocessing.forkserver.ensure_running()
        return super().submit(*args, **kwargs)
