"""Training resumes through DVC: `kill -9` of `dvc repro` mid-run leaves no process behind,
and the rerun continues from the last round every rank completed to the metrics of an
uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.pipeline.conftest import dvc_project, processes_of, tiny_params
from tests.proxyfl.conftest import read_jsonl, run_mpi, write_stores

ROUNDS = 12
STAGE = "train@ProxyFL-0"
# what must not differ between a resumed and an uninterrupted run (timings may)
COMPARED = ("client", "round", "evaluated_model", "accuracy", "macro_accuracy", "epsilon",
            "train_loss", "active", "n_train")  # fmt: skip


@pytest.fixture()
def project(tmp_path: Path, tool_env: dict[str, str]) -> Path:
    """A git + DVC project of this repository's code with two tiny stores in place."""
    params = tiny_params()
    params["train"].update({"algorithms": ["ProxyFL"], "retries": 0})
    params["train"]["options"].update({"rounds": ROUNDS, "batch_size": 8, "sigma": 1.0,
                                       "clip": 1.0, "lr": 0.01})  # fmt: skip
    root = dvc_project(tmp_path / "project", params, tool_env)
    write_stores(root / params["train"]["data"], centers=(0, 1), n_train=160)
    return root


def _rounds_on_every_rank(run: Path, ranks: int) -> int:
    """The newest round each rank has a complete checkpoint for, at least (0: none)."""
    rounds = []
    for rank in range(ranks):
        done = [int(p.stem.split("_")[1]) for p in (run / "checkpoints" / f"rank_{rank}").glob(
            "round_*.pt")]  # fmt: skip
        rounds.append(max(done, default=0))
    return min(rounds)


def _compared(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(row[key] for key in COMPARED) for row in rows)


@pytest.mark.slow
def test_a_killed_dvc_repro_resumes_to_the_metrics_of_an_uninterrupted_run(
    project: Path, tool_env: dict[str, str]
) -> None:
    run = project / "runs" / "ProxyFL" / "seed_0"
    log = (project / "first.log").open("w")
    first = subprocess.Popen(["dvc", "repro", "--single-item", STAGE], cwd=project,
                             env=tool_env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 600
    while _rounds_on_every_rank(run, 2) < 2:
        assert first.poll() is None, (project / "first.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint of round 2 within 10 minutes"
        time.sleep(0.1)
    os.kill(first.pid, signal.SIGKILL)  # dvc alone, as a crash or an OOM kill would
    first.wait()
    killed_at = _rounds_on_every_rank(run, 2)
    assert killed_at < ROUNDS, "the run finished before it could be killed"

    deadline = time.monotonic() + 10
    while (left := processes_of(project)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, "processes outlived the killed dvc repro:\n" + "\n".join(left)
    assert json.loads((run / "run.json").read_text())["status"] == "running"

    second = subprocess.run(["dvc", "repro", "--single-item", STAGE], cwd=project,
                            env=tool_env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    resumed = (run / "job.log").read_text()
    assert "resuming after round" in resumed, resumed[-3000:]
    # both attempts, each after its header: the killed one's lines kept (flushed line by line)
    attempts = resumed.split("=== ")[1:]
    assert len(attempts) == 2 and all("proxyfl.run --config" in a for a in attempts), resumed
    assert "round 2/" in attempts[0] and "resuming after round" in attempts[1]
    after = int(resumed.split("resuming after round ")[1].split()[0])
    assert after >= killed_at - 1  # at most one round lost (ranks keep in step)
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
    assert not list(run.rglob("*.tmp")) and not (run / "checkpoints").exists()

    reference = project / "reference"
    config = run / "config.json"
    kernels = yaml.safe_load((project / "params.yaml").read_text())["machine"]["cpu_kernels"]
    result = run_mpi(2, ["--config", str(config), "--data", str(project / "data" / "patches"),
                         "--run-dir", str(reference), "--no-resume"], kernels=kernels)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows, expected = read_jsonl(run / "metrics.jsonl"), read_jsonl(reference / "metrics.jsonl")
    assert len(rows) == len(expected) > 0 and max(r["round"] for r in rows) == ROUNDS
    assert _compared(rows) == _compared(expected)
    assert "up to date" in subprocess.run(["dvc", "status", STAGE], cwd=project, env=tool_env,
                                          capture_output=True, text=True).stdout  # fmt: skip
