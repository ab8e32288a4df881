"""Batches read ahead of the step: the host's work overlapped with the device's.

A 512 px batch of 32 patches costs 35-55 ms of one host thread (the HDF5 read 18 ms, HWC to
CHW 16 ms, the collate 7 ms; ``../shared/gpu``), in which a GPU waited. :class:`Prefetcher`
runs its source (a DataLoader, or any iterable of ``(images, labels)``) in a thread,
``depth`` batches ahead of the consumer, and pins each batch's memory when it is bound for
a GPU, so that the copy the consumer then starts with ``non_blocking=True`` overlaps the
device's work too. Images stay uint8 on the host and cross as uint8 (four times fewer bytes
than float32); the consumer normalises them on the device
(:func:`proxyfl.engine.data.prepare_images`).

The source is iterated by one thread, in order, to its end: a Poisson sampler draws from
its generator exactly as it would in the consumer's thread, so a run's batches, and the
generator's state a checkpoint keeps, are the same with and without prefetching. NumPy's
copies and torch's kernels release the GIL, and h5py's reads overlap with another thread's
Python (measured here: 0.26 s of 512 px reads and 0.19 s of a Python loop took 0.29 s
together), so the thread runs beside the step, not in turns with it.

``wait_seconds`` is the time the consumer waited for a batch: the part of the host's
work that the overlap did not hide (the rank record's ``data_wait_seconds``). ``depth`` 0
reads each batch when the consumer asks, in its thread, and counts the whole read as
waiting.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

_END = object()
_POLL_SECONDS = 0.1  # how often a blocked thread looks whether its consumer has gone


class _Failed:
    """The exception the source raised, to be raised again in the consumer."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def pinned(batch: Any) -> Any:
    """``batch`` (a tensor, or a tuple or list of them) in page-locked memory."""
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, (tuple, list)):
        return type(batch)(pinned(item) for item in batch)
    return batch


class Prefetcher:
    """One pass over ``source``, read ``depth`` batches ahead in a thread (pinned with
    ``pin``); ``wait_seconds`` is the consumer's wait."""

    def __init__(self, source: Iterable[Any], depth: int = 2, pin: bool = False) -> None:
        if depth < 0:
            raise ValueError(f"depth must be at least 0, got {depth}")
        self.source, self.depth, self.pin = source, depth, pin
        self.wait_seconds = 0.0

    def __iter__(self) -> Iterator[Any]:
        return self._inline() if self.depth == 0 else self._threaded()

    def _inline(self) -> Iterator[Any]:
        iterator = iter(self.source)
        while True:
            started = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                self.wait_seconds += time.perf_counter() - started
                return
            batch = pinned(batch) if self.pin else batch
            self.wait_seconds += time.perf_counter() - started
            yield batch

    def _threaded(self) -> Iterator[Any]:
        ready: queue.Queue[Any] = queue.Queue(maxsize=self.depth)
        stop = threading.Event()

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=_POLL_SECONDS)
                    return True
                except queue.Full:
                    continue
            return False

        def read() -> None:
            try:
                for batch in self.source:
                    if not put(pinned(batch) if self.pin else batch):
                        return
                put(_END)
            except BaseException as error:  # handed to the consumer, raised there
                put(_Failed(error))

        reader = threading.Thread(target=read, name="batch-prefetch", daemon=True)
        reader.start()
        try:
            while True:
                started = time.perf_counter()
                item = ready.get()
                self.wait_seconds += time.perf_counter() - started
                if item is _END:
                    return
                if isinstance(item, _Failed):
                    raise item.error
                yield item
        finally:  # the consumer finished, failed or stopped early: the thread ends too
            stop.set()
            reader.join()
