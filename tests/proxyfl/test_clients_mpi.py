"""Many clients on few ranks under real mpiexec (proxyfl.hosted): four clients give the same
bytes on four ranks (one client each), two and one; a run stopped on ranks that host two
clients each resumes to the same bytes on another placement; a centre evaluated on only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

ALGORITHMS = ("ProxyFL", "FML", "FedAvg", "AvgPush", "CWT", "Regular", "PrivateKT")
CENTERS = [0, 1, 2, 3]


def _options(algorithm: str, **more: Any) -> dict[str, Any]:
    options: dict[str, Any] = {"centers": CENTERS, **more}
    if algorithm == "ProxyFL":  # heterogeneous private models
        options["private_model"] = ["cnn1", "mlp", "lenet5", "cnn2"]
    if algorithm == "PrivateKT":
        options.update(kt_samples=2, self_train_samples=4)
    return options


def _train(helpers: Any, ranks: int, stores: Path, out: Path, algorithm: str,
           **options: Any) -> str:  # fmt: skip
    result = helpers.run_mpi(ranks, helpers.train_args(stores, out, algorithm, **options))
    assert result.returncode == 0, helpers.explain(result)
    return result.stderr


def _machine_records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads((run_dir / "ranks" / f"rank_{c}.machine.json").read_text())
            for c in range(len(CENTERS))]  # fmt: skip


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_four_clients_write_the_same_bytes_on_four_two_and_one_rank(
    algorithm: str, stores: Path, tmp_path: Path, helpers: Any
) -> None:
    runs, logs = {}, {}
    for ranks in (4, 2, 1):
        runs[ranks] = tmp_path / f"ranks_{ranks}"
        logs[ranks] = _train(helpers, ranks, stores, runs[ranks], algorithm, **_options(algorithm))
    reference = helpers.dvc_hashed_files(runs[4])
    assert any(name.startswith("models/client_3/") for name in reference)
    for ranks in (2, 1):  # metrics, kept models, ε and send logs (ranks/), predictions
        helpers.same_run(reference, helpers.dvc_hashed_files(runs[ranks]), runs[4], runs[ranks])
    # who ran each client is recorded; each client opened its own centre's training split
    # only, wherever it ran (PrivateKT's public pool reads the others' images, no labels)
    hosts = {4: [None] * 4, 2: [0, 0, 1, 1], 1: [0, 0, 0, 0]}
    for ranks, run_dir in runs.items():
        records = _machine_records(run_dir)
        assert [record["host_rank"] for record in records] == hosts[ranks]
        for client, record in enumerate(records):
            trained = [Path(entry["path"]).name for entry in record["opened"]
                       if entry["split"] == "train" and not entry.get("images_only")]  # fmt: skip
            assert trained == [f"center_{client}.h5"], (ranks, client, record["opened"])
    # a hosting rank's lines name the client they are about
    assert "[rank 1 client 3]" in logs[2] and "[rank 0 client 3]" in logs[1]
    assert "client" not in logs[4].split("[rank 3")[1].split("]")[0]


def test_a_run_stopped_on_ranks_of_two_clients_resumes_on_one_rank_to_the_same_bytes(
    stores: Path, tmp_path: Path, helpers: Any
) -> None:
    options = _options("ProxyFL", rounds=3)
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    _train(helpers, 2, stores, whole, "ProxyFL", resume=True, **options)  # from round 1
    args = helpers.train_args(stores, stopped, "ProxyFL", **options)
    killed = helpers.run_mpi(2, [*args, "--stop-after-round", "1"])
    assert killed.returncode == 3, helpers.explain(killed)
    assert not (stopped / "models").exists()
    resumed = helpers.run_mpi(1, [*args, "--resume"])
    assert resumed.returncode == 0, helpers.explain(resumed)
    assert "resuming after round 1" in resumed.stderr
    helpers.same_run(helpers.dvc_hashed_files(whole), helpers.dvc_hashed_files(stopped),
                     whole, stopped)  # fmt: skip


def test_a_centre_evaluated_on_only_lends_its_test_split_and_nothing_else(
    stores: Path, tmp_path: Path, helpers: Any
) -> None:
    run_dir = tmp_path / "run"
    _train(helpers, 1, stores, run_dir, "FedAvg", centers=[0, 1], eval_centers=[3])
    config = json.loads((run_dir / "config.json").read_text()) if (
        run_dir / "config.json").is_file() else None  # fmt: skip
    assert config is None or config["eval_centers"] == [3]
    run = json.loads((run_dir / "run.json").read_text())
    assert [client["center"] for client in run["clients"]] == [0, 1]
    for client in (0, 1):
        record = json.loads((run_dir / "ranks" / f"rank_{client}.machine.json").read_text())
        opened = {(Path(entry["path"]).name, entry["split"]) for entry in record["opened"]}
        assert opened == {(f"center_{client}.h5", "train"), *(
            (f"center_{c}.h5", "test") for c in (0, 1, 3))}  # fmt: skip
    assert not (run_dir / "ranks" / "rank_2.json").exists()
