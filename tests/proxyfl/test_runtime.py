"""A rank's runtime: its threads by placement, and deterministic mode without its fill.

The launchers' ranks are in test_launch_mpi.py (the fork launcher, hydra, an override);
here the rule itself, and the claim that turning the fill off changes no bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from proxyfl.engine.runtime import configure_torch, threads_by_placement


@pytest.mark.parametrize(
    ("ranks", "cores", "node_cores", "threads"),
    [
        (1, 2, 2, 2),  # a 1-rank job on this 2-core machine: both cores
        (2, 2, 2, 1),  # a 2-rank job: one each
        (4, 2, 2, 1),  # more ranks than cores: still one
        (4, 16, 16, 4),  # four CUDA ranks on a 16-core node: 4 each, not 16
        (3, 16, 16, 5),  # the share rounds down
        (4, 3, 16, 3),  # bound by its launcher to 3 of the node's 16 cores: those 3
        (1, 1, 16, 1),  # bound to one core
    ],
)
def test_a_rank_takes_its_share_of_the_node_or_the_cores_it_was_bound_to(
    ranks: int, cores: int, node_cores: int, threads: int
) -> None:
    assert threads_by_placement(ranks, cores, node_cores) == threads


def _round_with_fill(tmp_path: Path, helpers: Any, fill: bool) -> list[torch.Tensor]:
    """One deterministic round of one ProxyFL client (func engine, Poisson batches of
    mean 8), with torch's fill of uninitialised memory as ``fill`` says; its weights."""
    configure_torch(deterministic=True)
    torch.utils.deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]
    try:
        trainer = helpers.one_client(tmp_path, batch_size=8, private_model=["cnn2"])
        losses = trainer.train_round()
        assert losses.steps > 0
        return [p.detach().clone() for model in (trainer.private, trainer.dp.model)
                for p in model.parameters()]  # fmt: skip
    finally:
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]


def test_deterministic_mode_gives_the_same_bits_without_its_fill(
    tmp_path: Path, helpers: Any
) -> None:
    """The fill writes NaN into fresh tensors: a step that read one before writing it
    would differ (NaN, or another value) between the two; every weight is bit-identical,
    and training moved them."""
    filled = _round_with_fill(tmp_path / "filled", helpers, fill=True)
    unfilled = _round_with_fill(tmp_path / "unfilled", helpers, fill=False)
    initial = helpers.one_client(tmp_path / "initial", batch_size=8, private_model=["cnn2"])
    start = [p.detach() for model in (initial.private, initial.dp.model)
             for p in model.parameters()]  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(filled, unfilled, strict=True))
    assert all(torch.isfinite(a).all() for a in unfilled)
    assert any(not torch.equal(a, b) for a, b in zip(start, unfilled, strict=True))
