"""Batches read ahead by a thread: the same batches in the same order, a source's failure
raised in the consumer, no thread left when the consumer stops, the wait counted."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch

from proxyfl.engine.prefetch import Prefetcher


def _batches(n: int, seconds: float = 0.0) -> Iterator[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)  # drawn in the reading thread, in order
    for _ in range(n):
        time.sleep(seconds)
        yield [torch.randint(0, 255, (4, 3, 8, 8), generator=generator, dtype=torch.uint8),
               torch.randint(0, 2, (4,), generator=generator)]  # fmt: skip


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "batch-prefetch"]


@pytest.mark.parametrize("depth", [0, 1, 2, 5])
def test_the_batches_and_their_order_are_the_sources(depth: int) -> None:
    expected = list(_batches(7))
    got = list(Prefetcher(_batches(7), depth))
    assert len(got) == 7
    for (a, b), (c, d) in zip(got, expected, strict=True):
        assert torch.equal(a, c) and torch.equal(b, d)
    assert not _prefetch_threads()


class _BadStore(Exception):
    pass


def _failing_after(n: int) -> Iterator[list[torch.Tensor]]:
    yield from _batches(n)
    raise _BadStore("patch 12 of center_0.h5 cannot be decoded")


@pytest.mark.parametrize("depth", [0, 2])
def test_a_source_that_fails_fails_the_consumer_after_its_good_batches(depth: int) -> None:
    seen = []
    with pytest.raises(_BadStore, match="cannot be decoded"):
        for batch in Prefetcher(_failing_after(3), depth):
            seen.append(batch)
    assert len(seen) == 3
    assert not _prefetch_threads()


def test_a_consumer_that_stops_early_leaves_no_thread_reading() -> None:
    batches = iter(Prefetcher(_batches(1000), depth=2))
    next(batches)
    assert _prefetch_threads()  # reading ahead, blocked on the full queue
    batches.close()  # what a step that raises does to the loop's iterator
    assert not _prefetch_threads()


def test_the_wait_is_what_the_reading_did_not_hide() -> None:
    """A source of 0.05 s a batch and a consumer of 0.05 s a step: read ahead, the wait is
    about the first batch; read inline, it is every batch."""
    waits = {}
    for depth in (0, 2):
        prefetcher = Prefetcher(_batches(6, seconds=0.05), depth)
        for _ in prefetcher:
            time.sleep(0.05)
        waits[depth] = prefetcher.wait_seconds
    assert waits[0] >= 6 * 0.05
    assert waits[2] < waits[0] / 2


def test_pinned_batches_keep_their_structure() -> None:
    if not torch.cuda.is_available():
        pytest.skip("page-locked memory needs CUDA")
    (images, labels), *_ = list(Prefetcher(_batches(1), 2, pin=True))
    assert images.is_pinned() and labels.is_pinned()
