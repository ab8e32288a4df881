"""The training flow under Prefect: jobs become task runs, a failed rank fails the run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from camelyon_proxyfl.params import TrainSection
from flows.report import main as report_main
from flows.train import main, train
from proxyfl.launch import TrainingJobFailed
from wsi.store import PatchBatch, StoreAttrs, store_path, write_patch_store

OPTIONS = {
    "rounds": 1, "batch_size": 4, "proxy_model": "cnn1", "private_model": ["mlp"],
    "device": "cpu", "input_size": 16,
}  # fmt: skip


def _store(directory: Path, center: int, n: int = 12) -> None:
    rng = np.random.default_rng(center)
    def split(name: str) -> PatchBatch:
        labels = np.arange(n) % 2
        return PatchBatch(
            images=rng.integers(0, 255, (n, 8, 8, 3)), labels=labels,
            patients=[f"patient_{center}{name[0]}{i % 2}" for i in range(n)],
            slides=[f"slide_{i}" for i in range(n)], coords=np.zeros((n, 2)),
        )  # fmt: skip
    attrs = StoreAttrs(center=center, patch_size=8, level=0, mpp=0.25, n_classes=2,
                       params_hash="test")  # fmt: skip
    write_patch_store(store_path(directory, center), attrs,
                      {"train": split("train"), "test": split("test")})  # fmt: skip


def _config(data: Path, runs: Path, **overrides: object) -> TrainSection:
    values = {"algorithms": ["FedAvg", "Joint"], "seeds": [0], "centers": [0, 1],
              "data": data, "runs": runs, "options": OPTIONS, **overrides}  # fmt: skip
    return TrainSection(**values)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FedAvg and Joint, seed 0, trained by the flow; the state must be Completed."""
    root = tmp_path_factory.mktemp("trained")
    for center in (0, 1):
        _store(root / "stores", center)
    state = train(_config(root / "stores", root / "runs"), return_state=True)
    assert state.is_completed()
    return root / "runs"


def test_each_job_is_a_task_run_that_writes_its_run(runs: Path) -> None:
    for algorithm, world in (("FedAvg", 2), ("Joint", 1)):
        run = json.loads((runs / algorithm / "seed_0" / "run.json").read_text())
        assert run["status"] == "finished" and run["world_size"] == world


def test_the_report_flow_tables_the_runs_and_names_a_missing_one(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--runs", str(runs), "--out", str(tmp_path / "results")]
    assert report_main([*flags, "--algorithms", "FedAvg", "Joint", "--seeds", "0"]) == 0
    accuracy = (tmp_path / "results" / "tables" / "accuracy.csv").read_text()
    assert "FedAvg" in accuracy and "Joint" in accuracy
    printed = capsys.readouterr().out  # both tables, rendered by rich
    assert "Macro-accuracy" in printed and "pooled" in printed and "FedAvg" in printed

    assert report_main([*flags, "--algorithms", "FedAvg", "--seeds", "7"]) == 1
    assert "seed" in capsys.readouterr().err


def test_a_failed_rank_fails_the_flow_run_with_its_message(tmp_path: Path) -> None:
    _store(tmp_path / "stores", 0)  # centre 1's store is missing
    config = _config(tmp_path / "stores", tmp_path / "runs", algorithms=["ProxyFL"])
    state = train(config, return_state=True)
    assert state.is_failed()
    with pytest.raises(TrainingJobFailed) as failure:
        state.result()
    message = str(failure.value)
    assert "ProxyFL seed 0 failed with exit code 2" in message
    # every rank evaluates on centre 1's test split, so every rank reports the missing store
    assert "center_1.h5: no such patch store" in message
    assert str(tmp_path / "runs" / "ProxyFL" / "seed_0" / "job.log") in message


def test_bad_training_options_are_refused_before_any_job(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="sigma"):
        _config(tmp_path, tmp_path / "runs", options={**OPTIONS, "sigma": -1})
    with pytest.raises(ValidationError, match="seed"):  # set per job, not an option
        _config(tmp_path, tmp_path / "runs", options={**OPTIONS, "seed": 3})
    assert main(["--rounds", "0", "--runs", str(tmp_path / "runs")]) == 2
    assert not (tmp_path / "runs").exists()


def test_privatekt_through_the_train_and_report_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m flows.train --algorithms PrivateKT`` trains with centre 2's store as the
    public pool, and the report lists it after the others with its notion."""
    for center in (0, 1, 2):
        _store(tmp_path / "stores", center)
    runs, results = tmp_path / "runs", tmp_path / "results"
    common = ["--runs", str(runs), "--algorithms", "PrivateKT", "--seeds", "0"]
    options = ["--rounds", "2", "--batch-size", "4", "--proxy-model", "cnn1",
               "--private-model", "mlp", "--device", "cpu", "--input-size", "16"]  # fmt: skip
    trained = main([*common, "--data", str(tmp_path / "stores"), "--centers", "0", "1",
                    "--public-center", "2", "--kt-samples", "3", *options])  # fmt: skip
    assert trained == 0, capsys.readouterr().err
    run = json.loads((runs / "PrivateKT" / "seed_0" / "run.json").read_text())
    assert run["status"] == "finished" and run["world_size"] == 2
    assert {record["notion"] for record in run["privacy"].values()} == {"label_ldp"}

    assert report_main([*common, "--out", str(results)]) == 0
    privacy = (results / "tables" / "privacy.md").read_text()
    rows = [line for line in privacy.splitlines() if line.endswith("| PrivateKT |")]
    assert len(rows) == 2 and all("label-level ε-LDP" in line for line in rows)
    assert "| PrivateKT |" in (results / "tables" / "accuracy.md").read_text()
