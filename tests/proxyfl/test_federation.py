"""A training job submitted to a running federation (``camelyon-proxyfl sites submit``):
the server and each centre's site started from their own kits, each site with its own
folders, as hospitals run them (here on one machine); real ``nvflare`` processes, mutual
TLS. What comes back is the default launcher's bytes; the models stay at the sites."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from plumbing.network import free_port
from proxyfl.launch.job import TrainingJob, run_job

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SITES = [sys.executable, "-m", "camelyon_proxyfl.cli", "sites"]
CENTERS = [0, 1]
OPTIONS = {"rounds": 2, "batch_size": 8, "proxy_model": "cnn1", "private_model": ["mlp"],
           "device": "cpu", "sigma": 1.0, "clip": 1.0, "lr": 0.01, "torch_threads": 1}  # fmt: skip


def _start(kit: Path, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([*SITES, "start", str(kit)], cwd=cwd, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip


def _wait_for_line(process: subprocess.Popen[str], words: str, timeout_s: float = 90) -> None:
    assert process.stderr is not None
    deadline, lines = time.monotonic() + timeout_s, []
    while time.monotonic() < deadline and (line := process.stderr.readline()):
        lines.append(line)
        if words in line:
            return
    raise AssertionError(f"{words!r} not said: {lines[-10:]}")


def _site_project(folder: Path, stores: Path) -> Path:
    """A hospital's folder: its params.yaml (where its stores and runs are) and its store,
    beside the other centres' (whose test splits every client is evaluated on)."""
    (folder / "patches").mkdir(parents=True)
    for center in CENTERS:
        shutil.copy(stores / f"center_{center}.h5", folder / "patches")
    (folder / "params.yaml").write_text(yaml.safe_dump(
        {"train": {"centers": CENTERS, "data": "patches", "runs": "kept"}}))  # fmt: skip
    return folder


def test_a_job_submitted_to_a_running_federation_brings_back_the_bytes_of_mpiexec(
    stores: Path, tmp_path: Path
) -> None:
    coordinator = tmp_path / "coordinator"
    coordinator.mkdir()
    params = {"train": {"algorithms": ["FedAvg"], "seeds": [0], "centers": CENTERS,
                        "runs": "runs", "options": OPTIONS}}  # fmt: skip
    (coordinator / "params.yaml").write_text(yaml.safe_dump(params))
    provisioned = subprocess.run([*SITES, "provision", "--out", "kits", "--server-host",
                                  "localhost", "--port", str(free_port())], cwd=coordinator,
                                 capture_output=True, text=True, timeout=120)  # fmt: skip
    assert provisioned.returncode == 0, provisioned.stderr
    kits = coordinator / "kits" / "proxyfl" / "prod_00"
    hospitals = {c: _site_project(tmp_path / f"hospital-{c}", stores) for c in CENTERS}
    participants = [_start(kits / "localhost", tmp_path)]
    try:
        for center, folder in hospitals.items():
            site = _start(kits / f"centre-{center}", folder)
            participants.append(site)
            _wait_for_line(site, f"site centre-{center}: joined its server")

        submitted = subprocess.run([*SITES, "submit", str(kits / "admin@proxyfl.org")],
                                   cwd=coordinator, capture_output=True, text=True,
                                   timeout=600)  # fmt: skip
        said = submitted.stdout + submitted.stderr
        assert submitted.returncode == 0, said[-4000:]
        assert "FedAvg seed 0: finished" in said and "FINISHED:COMPLETED" in said, said
        back = coordinator / "runs" / "FedAvg" / "seed_0"
        # each site trained in its own runs folder, and kept what never leaves it
        for center, folder in hospitals.items():
            kept = folder / "kept" / "FedAvg" / "seed_0"
            assert (kept / "models" / f"client_{center}").is_dir()
            assert (kept / "predictions" / f"client_{center}.csv").is_file()
        assert not [name for name in ("models", "predictions", "checkpoints")
                    if (back / name).exists()]  # fmt: skip

        # the same job under mpiexec, on the same stores: the same bytes came back
        from camelyon_proxyfl.params.base import load_sections
        from camelyon_proxyfl.params.train import TrainParams

        train = load_sections(TrainParams, coordinator / "params.yaml").train
        mpi_dir = tmp_path / "mpi" / "FedAvg" / "seed_0"
        config = train.job_config("FedAvg", 0).model_copy(
            update={"data": hospitals[0] / "patches", "run_dir": mpi_dir})  # fmt: skip
        run_job(TrainingJob(config), on_line=lambda _: None)
        for name in ("metrics.jsonl", "metrics.jsonl.sha256", "ranks/rank_0.json",
                     "ranks/rank_1.json"):  # fmt: skip
            assert (back / name).read_bytes() == (mpi_dir / name).read_bytes(), name
        ours, theirs = (json.loads((run / "run.json").read_text()) for run in (back, mpi_dir))
        assert ours["config"].pop("run_dir") == str(hospitals[0] / "kept" / "FedAvg" / "seed_0")
        assert ours["config"].pop("data") == str(hospitals[0] / "patches")
        for key in ("run_dir", "data"):
            theirs["config"].pop(key)
        assert ours == theirs and ours["status"] == "finished"

        # bad input: a site without its store fails the job in one line naming it (exit 2)
        (hospitals[1] / "patches" / "center_1.h5").unlink()
        failed = subprocess.run([*SITES, "submit", str(kits / "admin@proxyfl.org"),
                                 "--seeds", "1"], cwd=coordinator, capture_output=True,
                                text=True, timeout=600)  # fmt: skip
        assert failed.returncode == 2, failed.stdout[-3000:] + failed.stderr[-3000:]
        (line,) = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
        assert "FedAvg seed 1 failed with exit code 2" in line and "centre-1 2" in line, line
        failure = json.loads((coordinator / "runs" / "FedAvg" / "seed_1" / "failures" /
                              "rank_1.json").read_text())  # fmt: skip
        assert str(hospitals[1] / "patches" / "center_1.h5") in failure["error"]
        # Joint pools the centres' data: it has no federated form, and nothing is submitted
        joint = subprocess.run([*SITES, "submit", str(kits / "admin@proxyfl.org"),
                                "--algorithms", "Joint"], cwd=coordinator,
                               capture_output=True, text=True, timeout=120)  # fmt: skip
        assert joint.returncode == 2 and "no federated form" in joint.stderr, joint.stderr
    finally:
        for process in participants:
            process.send_signal(signal.SIGTERM)
        for process in participants:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
