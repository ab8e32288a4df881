"""Training learns: every algorithm beats the majority class clearly, and a no-op does not.

Each algorithm trains 3 rounds under real mpiexec (4 ranks; Joint 1) on four small stores
whose classes differ in the mean of the red channel, with DP-SGD on (σ = 0.3, C = 1). The
evaluated (primary) model of every client must then score at least ``MARGIN`` above the
majority-class rate of the merged test set. The same check must fail when the update is
broken (a learning rate of 1e-12: the models stay at their random initialisation), so the
check cannot pass by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wsi.store.reader import PatchSplitReader
from wsi.store.schema import store_path

ALGORITHMS = ("ProxyFL", "FML", "FedAvg", "AvgPush", "CWT", "Regular", "Joint")
CENTERS = (0, 1, 2, 3)
ROUNDS = 3
MARGIN = 0.2
# 96 training patches per client: 6 Poisson batches of 16 per round.
N_TRAIN, N_TEST = 96, 24
# Little noise: the test is about the update reaching the model, not about DP's cost.
OPTIONS = {"rounds": ROUNDS, "sigma": 0.3, "batch_size": 16, "keep_final_checkpoints": False,
           "dp_engine": "func"}  # fmt: skip


@pytest.fixture(scope="module")
def learnable(helpers: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return helpers.write_stores(
        tmp_path_factory.mktemp("learnable"), CENTERS, n_train=N_TRAIN, n_test=N_TEST, seed=3
    )


def majority_rate(data: Path, centers: Sequence[int]) -> float:
    """The accuracy of always predicting the most frequent class of the merged test set."""
    labels = np.concatenate([PatchSplitReader(store_path(data, c), "test").labels for c in centers])
    return float(np.bincount(labels).max() / len(labels))


def final_primary_accuracies(rows: Sequence[dict[str, Any]]) -> dict[int, float]:
    """Each client's accuracy of the evaluated (primary) model at the last round."""
    last = max(row["round"] for row in rows)
    return {
        row["client"]: row["accuracy"] for row in rows if row["round"] == last and row["primary"]
    }


def assert_learned(rows: Sequence[dict[str, Any]], majority: float, algorithm: str) -> None:
    """Every client's evaluated model beats the majority-class rate by ``MARGIN``."""
    accuracies = final_primary_accuracies(rows)
    assert accuracies, f"{algorithm}: no final-round rows"
    short = {c: a for c, a in accuracies.items() if a < majority + MARGIN}
    assert not short, (
        f"{algorithm}: clients {short} below the majority-class rate {majority:.3f} + {MARGIN}"
    )


# a run's metrics by (algorithm, options): the module's tests share a run where they ask
# for the same one (ProxyFL with the func engine is both a learner and an engine compared)
_TRAINED: dict[tuple[Path, str, tuple[tuple[str, Any], ...]], Path] = {}


def train(helpers: Any, data: Path, out: Path, algorithm: str, **options: Any) -> Path:
    settings: dict[str, Any] = {**OPTIONS, **options}
    key = (data, algorithm, tuple(sorted(settings.items())))
    if key in _TRAINED:
        return _TRAINED[key]
    ranks = 1 if algorithm == "Joint" else len(CENTERS)
    if algorithm == "Joint":
        settings["centers"] = list(CENTERS)
    result = helpers.run_mpi(ranks, helpers.train_args(data, out, algorithm, **settings))
    assert result.returncode == 0, helpers.explain(result)
    _TRAINED[key] = out / "metrics.jsonl"
    return _TRAINED[key]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_learns(
    helpers: Any, learnable: Path, tmp_path: Path, algorithm: str
) -> None:
    metrics = train(helpers, learnable, tmp_path / algorithm, algorithm)
    assert_learned(helpers.read_jsonl(metrics), majority_rate(learnable, CENTERS), algorithm)


@pytest.mark.parametrize("algorithm", ["ProxyFL", "FedAvg"])
def test_a_no_op_update_fails_the_learning_check(
    helpers: Any, learnable: Path, tmp_path: Path, algorithm: str
) -> None:
    metrics = train(helpers, learnable, tmp_path / algorithm, algorithm, lr=1e-12)
    rows = helpers.read_jsonl(metrics)
    with pytest.raises(AssertionError, match="below the majority-class rate"):
        assert_learned(rows, majority_rate(learnable, CENTERS), algorithm)


def test_both_dp_engines_learn_alike(helpers: Any, learnable: Path, tmp_path: Path) -> None:
    """ProxyFL under the func engine (the default) and under Opacus' hooks: the same ε for
    every client and round (the same accountant steps), and both learn, to accuracies
    within a seed's spread of each other (the engines sum in another order, so the runs
    part in late digits and then by the chaos of training)."""
    rows = {engine: helpers.read_jsonl(train(helpers, learnable, tmp_path / engine, "ProxyFL",
                                             dp_engine=engine))
            for engine in ("func", "opacus")}  # fmt: skip
    majority = majority_rate(learnable, CENTERS)
    for engine, engine_rows in rows.items():
        assert_learned(engine_rows, majority, f"ProxyFL ({engine})")

    def epsilons(engine: str) -> dict[tuple[int, int], float]:
        return {(r["client"], r["round"]): r["epsilon"] for r in rows[engine] if r["primary"]}

    assert epsilons("func") == epsilons("opacus") and len(epsilons("func")) == 4 * ROUNDS
    final = {engine: np.mean(list(final_primary_accuracies(rows[engine]).values()))
             for engine in rows}  # fmt: skip
    assert abs(final["func"] - final["opacus"]) < 0.15, final
