"""The audit's processes (analysis.audit.workers) run one torch thread whatever the caller's,
so reference models trained in workers are those trained in the audit's own process, bit
for bit, on any machine; a worker's failure names the model it trained."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import numpy as np
import psutil
import pytest
import torch

from analysis.audit.references import ReferenceRecipe, ReferenceTrainingError, train_references
from analysis.audit.workers import AUDIT_THREADS, audit_processes
from tests.conftest import command_line

# cnn2: 128-channel convolutions, whose weight gradients are reductions split by thread
RECIPE = ReferenceRecipe("cnn2", 2, 16, epochs=2, batch_size=8, lr=3e-3, weight_decay=1e-4)


@pytest.fixture
def two_threads() -> Iterator[None]:
    """Two torch threads in the caller (torch's default on two cores), so that one thread
    in the audit's processes is theirs to set, not inherited."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _pool_workers() -> set[int]:
    """This process's spawned workers (not multiprocessing's resource tracker, which
    lives as long as this process, by design)."""
    return {child.pid for child in psutil.Process().children()
            if "spawn_main" in " ".join(command_line(child))}  # fmt: skip


def _patches() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    return rng.integers(0, 256, (40, 16, 16, 3), dtype=np.uint8), rng.integers(0, 2, 40)


def test_reference_models_in_workers_are_those_trained_here(two_threads: None) -> None:
    images, labels = _patches()
    with audit_processes(1) as none:
        assert none is None and torch.get_num_threads() == AUDIT_THREADS
        here = train_references(RECIPE, images, labels, count=4, seed=7)
    assert torch.get_num_threads() == 2  # the caller's count, back
    with audit_processes(2) as pool:
        assert pool is not None and torch.get_num_threads() == AUDIT_THREADS
        assert {pool.submit(torch.get_num_threads).result() for _ in range(4)} == {1}
        there = train_references(RECIPE, images, labels, count=4, seed=7, pool=pool)
        assert len(_pool_workers()) == 2
    assert not _pool_workers()  # none outlives the block
    np.testing.assert_array_equal(there.trained_on, here.trained_on)
    assert there.logits.tobytes() == here.logits.tobytes()
    # and the thread count is what pins the bits: two threads here train other ones
    other = train_references(RECIPE, images, labels, count=4, seed=7)
    assert other.logits.tobytes() != here.logits.tobytes()


def test_a_reference_model_that_fails_in_a_worker_is_named() -> None:
    images, labels = _patches()
    unknown = ReferenceRecipe("no-such-model", 2, 16, 1, 8, 1e-3, 0.0)
    with (pytest.raises(ReferenceTrainingError, match=r"reference model 1/2 \(no-such-model, "
                        r"centre\(s\) \[0\]\): training failed: KeyError"),
          audit_processes(2) as pool):  # fmt: skip
        train_references(unknown, images, labels, count=2, seed=0, pool=pool,
                         where="centre(s) [0]")  # fmt: skip


def test_a_worker_killed_outright_fails_the_audit_naming_the_model() -> None:
    """A worker that dies (the OOM killer's SIGKILL), while training or between two groups
    of models, breaks the pool: the audit stops with the model named, and the other
    worker does not outlive the block."""
    images, labels = _patches()
    slow = ReferenceRecipe("cnn2", 2, 16, epochs=200, batch_size=8, lr=3e-3, weight_decay=0.0)
    named = (r"reference model 1/2 \(cnn2\): training failed: "
             r".*(terminated abruptly|BrokenProcessPool)")  # fmt: skip
    for when in ("training", "idle"):
        with pytest.raises(ReferenceTrainingError, match=named), audit_processes(2) as pool:
            assert pool.submit(int).result() == 0  # the workers are up
            victim = min(_pool_workers())
            if when == "training":
                pool.submit(os.kill, victim, signal.SIGKILL)  # in a worker, before the models
            else:
                os.kill(victim, signal.SIGKILL)
                while pool.submit(int).exception() is None:  # until the pool knows
                    time.sleep(0.05)
            train_references(slow, images, labels, count=2, seed=0, pool=pool)
        assert not _pool_workers(), when
