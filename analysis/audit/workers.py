"""The audit's processes: one torch thread each, and worker processes for the reference
models.

A model trained or scored on the CPU depends, in its last bits, on torch's intra-op
thread count T: its kernels (a convolution's weight gradient summed over the batch, a
matrix product) split each reduction into T partial sums, and floating-point addition
rounds differently for every split (1 and 2 threads give logits up to 2e-7 apart). So the
audit runs every model with :data:`AUDIT_THREADS` threads, as each training rank does
(:func:`proxyfl.engine.runtime.make_runtime`), whatever the machine: ``audit.json`` is the
same bytes on 2 cores or 64 (with torch's default, the machine's core count, it was not).

The reference models of LiRA offline are independent of each other (each one seeded by
:func:`proxyfl.engine.runtime.derived_seed`), so W workers train W of them side by side:
with one thread each, the W processes are what uses the cores. W changes the time only.

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

from plumbing.errors import PipelineError
from plumbing.processes import die_with_parent

AUDIT_THREADS = 1


class ReferenceTrainingError(PipelineError):
    """A reference model that could not be trained (its worker failed or died)."""


def _start_worker(parent_pid: int) -> None:
    import torch

    die_with_parent(parent_pid)
    torch.set_num_threads(AUDIT_THREADS)


@contextlib.contextmanager
def audit_processes(workers: int) -> Iterator[Executor | None]:
    """This process at :data:`AUDIT_THREADS` torch threads for the block (restored after),
    and a pool of ``workers`` processes at the same count for the reference models, shut
    down on exit (pending work cancelled when the block fails); ``None`` for one worker:
    the models then train in this process."""
    # torch when the audit runs, not when its command starts: an audit found up to date,
    # its --help and its refusals start in ~3 s, not ~7 (torch's import on 2 cores)
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(AUDIT_THREADS)
    try:
        if workers <= 1:
            yield None
            return
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                 initargs=(os.getpid(),)) as pool:  # fmt: skip
            try:
                yield pool
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    finally:
        torch.set_num_threads(previous)
