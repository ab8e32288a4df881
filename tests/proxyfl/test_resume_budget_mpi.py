"""Under real mpiexec: a killed and resumed run equals an uninterrupted one; privacy budgets;
the GroupNorm ResNet-18 end to end."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from proxyfl.engine.checkpoint import available_rounds, load_checkpoint
from proxyfl.privacy.accounting import planned_epsilon


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_killed_and_resumed_run_matches_uninterrupted(
    helpers: Any, stores: Path, tmp_path: Path
) -> None:
    # Two clients, PushSum with uneven weights so the de-biasing weight is state too.
    options = {"rounds": 3, "graph": "exponential_uneven", "batch_size": 4, "centers": [0, 1]}
    whole = tmp_path / "whole"
    result = helpers.run_mpi(2, helpers.train_args(stores, whole, "ProxyFL", **options))
    assert result.returncode == 0, helpers.explain(result)

    broken = tmp_path / "broken"
    args = helpers.train_args(stores, broken, "ProxyFL", **options)
    killed = helpers.run_mpi(2, [*args, "--stop-after-round", "1"])
    assert killed.returncode != 0, helpers.explain(killed)
    assert {r["round"] for r in _metrics(broken)} == {1}
    assert all(available_rounds(broken, rank) == [1] for rank in range(2))

    resumed = helpers.run_mpi(2, [*args, "--resume"])
    assert resumed.returncode == 0, helpers.explain(resumed)
    assert "resuming after round 1" in resumed.stderr

    assert _metrics(broken) == _metrics(whole)  # rows hold no time: equal, byte for byte
    for rank in range(2):
        a, b = load_checkpoint(whole, rank, 3), load_checkpoint(broken, rank, 3)
        for part in ("shared_model", "private_model"):
            assert a[part].keys() == b[part].keys()
            for key in a[part]:
                assert torch.equal(a[part][key], b[part][key]), (rank, part, key)
        assert a["accountant"] == b["accountant"]
        assert a["exchange"] == b["exchange"] and a["exchange"]["weight"] != 1.0
        assert torch.equal(a["noise_generator"], b["noise_generator"])
    run = json.loads((broken / "run.json").read_text())
    assert run["status"] == "finished"


def test_a_damaged_checkpoint_is_skipped_and_the_run_resumes_from_an_intact_one(
    helpers: Any, stores: Path, tmp_path: Path
) -> None:
    """The issue's case: killed after round 2, rank 0's checkpoint of round 2 truncated.
    The resume says which checkpoint it skipped and why, goes back to round 1 (every rank
    holds it intact) and ends as the uninterrupted run does."""
    options = {"rounds": 3, "batch_size": 4, "centers": [0, 1]}
    whole = tmp_path / "whole"
    result = helpers.run_mpi(2, helpers.train_args(stores, whole, "ProxyFL", **options))
    assert result.returncode == 0, helpers.explain(result)

    broken = tmp_path / "broken"
    args = helpers.train_args(stores, broken, "ProxyFL", **options)
    killed = helpers.run_mpi(2, [*args, "--stop-after-round", "2"])
    assert killed.returncode != 0, helpers.explain(killed)
    assert all(available_rounds(broken, rank) == [1, 2] for rank in range(2))
    damaged = broken / "checkpoints" / "rank_0" / "round_0002.pt"
    os.truncate(damaged, 5000)

    resumed = helpers.run_mpi(2, [*args, "--resume"])
    assert resumed.returncode == 0, helpers.explain(resumed)
    assert (
        f"checkpoint of round 2 skipped: {damaged}: its bytes are not those written "
        "(5000 bytes" in resumed.stderr
    ), helpers.explain(resumed)
    assert "resuming after round 1" in resumed.stderr
    assert _metrics(broken) == _metrics(whole)
    assert json.loads((broken / "run.json").read_text())["status"] == "finished"


def test_client_over_budget_stops_and_protocol_goes_on(helpers: Any, tmp_path: Path) -> None:
    # Clients 0 and 2 have 40 examples (ε 4.54 after one round, 5.75 after two); clients
    # 1 and 3 have 80 (ε 4.85 after three rounds). Budget 5: 0 and 2 stop after round 1.
    data = helpers.write_stores(tmp_path / "stores", n_train=[40, 80, 40, 80])
    out = tmp_path / "run"
    args = helpers.train_args(data, out, "ProxyFL", rounds=3, epsilon_budget=5.0)
    result = helpers.run_mpi(4, args)
    assert result.returncode == 0, helpers.explain(result)
    rows = [r for r in _metrics(out) if r["evaluated_model"] == "private"]
    assert len(rows) == 12
    small = planned_epsilon(40, 8, 1.0, 1, 1e-5)
    large = planned_epsilon(80, 8, 1.0, 3, 1e-5)
    for row in rows:
        if row["client"] in (0, 2):
            assert row["active"] == (row["round"] == 1)
            assert row["epsilon"] == pytest.approx(small, rel=1e-12)
            if row["round"] > 1:
                assert row["train_loss"] is None
        else:
            assert row["active"]
        assert row["epsilon"] <= 5.0
    assert [r["epsilon"] for r in rows if r["client"] == 1 and r["round"] == 3] == [
        pytest.approx(large, rel=1e-12)
    ]
    # The stopped clients send nothing after round 1; the others keep exchanging.
    for rank in range(4):
        record = json.loads((out / "ranks" / f"rank_{rank}.json").read_text())
        rounds = {e["round"] for e in record["sent"]}
        assert rounds == ({1} if rank in (0, 2) else {1, 2, 3})
        peers = {e["peer"] for e in record["sent"] if e["round"] > 1}
        assert peers <= {1, 3}


def test_resnet18_gn_proxyfl_round(helpers: Any, tmp_path: Path) -> None:
    data = helpers.write_stores(tmp_path / "stores", centers=(0, 1), n_train=12, n_test=4, size=32)
    out = tmp_path / "run"
    args = helpers.train_args(
        data, out, "ProxyFL", rounds=1, batch_size=4,
        proxy_model="resnet18_gn", private_model="resnet18_gn",
    )  # fmt: skip
    result = helpers.run_mpi(2, args, timeout=300)
    assert result.returncode == 0, helpers.explain(result)
    rows = _metrics(out)
    assert {(r["client"], r["evaluated_model"]) for r in rows} == {
        (c, m) for c in (0, 1) for m in ("private", "proxy")
    }
    record = json.loads((out / "ranks" / "rank_0.json").read_text())
    assert record["proxy_parameters"] == 11_177_538  # ResNet-18, 2 outputs
    sent = [e for e in record["sent"] if e["kind"] == "model"]
    assert [e["values"] for e in sent] == [11_177_538]
