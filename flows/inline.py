"""A task runner without a pool: each task runs where it is submitted, in the flow's own
thread, one after the other, as joblib runs ``n_jobs=1``.

A pool of one worker parallelises nothing and costs a process that imports the tasks'
modules and Prefect's engine again: about 4 CPU-s of a tiny preprocessing command on the
faster machine kind, 8 on the slower. A thread pool of one would keep a slide running
after Ctrl-C: only the main thread receives the signal, and the interpreter waits for the
pool's thread as it exits. Here the task runs in the main thread, so Ctrl-C stops it where
it is.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, Self

from prefect.task_runners import ThreadPoolTaskRunner


class CallingThreadExecutor(Executor):
    """An executor whose ``submit`` runs the call at once, in the calling thread, and
    returns its future already done: the call's result, or the exception it raised. A
    ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``)
    is not kept in the future: it goes on up the caller's stack, as it would have."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            result = fn(*args, **kwargs)
        except Exception as error:  # the future holds it, as a pool's does
            future.set_exception(error)
        else:
            future.set_result(result)
        return future


class InlineTaskRunner(ThreadPoolTaskRunner):
    """Prefect's thread-pool task runner with the calling thread for its pool
    (:class:`CallingThreadExecutor`): everything Prefect records of a task run is
    recorded as from a pool; ``submit`` returns once the task has finished."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)

    def duplicate(self) -> InlineTaskRunner:
        return type(self)()

    def __enter__(self) -> Self:
        super().__enter__()
        assert self._executor is not None  # the pool Prefect made (no thread started yet)
        self._executor.shutdown(wait=False)
        self._executor = CallingThreadExecutor()  # type: ignore[assignment]
        return self
