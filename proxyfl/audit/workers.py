"""Worker processes for the audit's reference models, which train with the thread count of
the process that starts them, so that they give the same bits as training in it.

The reference models of LiRA offline are independent of each other (each one seeded by
:func:`proxyfl.engine.runtime.derived_seed`), so W workers train W of them side by side.
What they compute must not depend on where: a model trained on the CPU depends, in its
last bits, on torch's intra-op thread count T, because its kernels (a convolution's weight
gradient summed over the batch, a matrix product) split each reduction into T partial
sums, and floating-point addition rounds differently for every split (1 and 2 threads give
different logits). Each worker therefore runs with the T of the audit's own process
(torch's default there: the machine's cores), so every reference model, hence
``audit.json``, is the same bit for bit for any number of workers; W changes the time only.
W × T threads may exceed the cores (two workers of two threads on two cores), so the
workers' OpenMP threads wait for work asleep (``OMP_WAIT_POLICY=PASSIVE``) rather than
spinning for the cores the other worker's threads need; the wait policy changes when a
thread runs, never how a reduction is split.

Workers are started with ``spawn`` (no copy of the parent's threads or torch state) and
are bound to the process that started them (:func:`plumbing.processes.die_with_parent`),
so that none outlives the audit even when it is killed outright.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor

import torch

from plumbing.processes import die_with_parent


@contextlib.contextmanager
def _environment_default(name: str, value: str) -> Iterator[None]:
    """``name`` set to ``value`` (unless already set) for the processes started meanwhile."""
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


def _start_worker(parent_pid: int, threads: int) -> None:
    die_with_parent(parent_pid)
    torch.set_num_threads(threads)


@contextlib.contextmanager
def reference_workers(workers: int, threads: int | None = None) -> Iterator[Executor | None]:
    """A pool of ``workers`` processes, each with ``threads`` torch threads (default, and
    for the same bits: this process's count), shut down on exit (pending work cancelled
    when the block fails); ``None`` for one worker: the models then train in this
    process."""
    if workers <= 1:
        yield None
        return
    context = multiprocessing.get_context("spawn")
    # libgomp reads its wait policy once, as torch loads it: a worker (spawned at the first
    # submit, inside this block) takes it from the environment it inherits; this process,
    # whose OpenMP runs already, keeps its own
    with _environment_default("OMP_WAIT_POLICY", "PASSIVE"), ProcessPoolExecutor(
        workers, mp_context=context, initializer=_start_worker,
        initargs=(os.getpid(), threads or torch.get_num_threads()),
    ) as pool:  # fmt: skip
        try:
            yield pool
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
