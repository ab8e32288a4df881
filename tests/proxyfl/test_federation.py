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
from proxyfl.launch.job import TrainingJob, run_job, warm_ranks
from proxyfl.launch.placement import Placement
from wsi.store.reader import read_store_info
from wsi.store.test_split import write_test_split

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SITES = [sys.executable, "-m", "camelyon_proxyfl.cli", "sites"]
CENTERS = [0, 1]
OPTIONS = {"rounds": 2, "batch_size": 8, "proxy_model": "cnn1", "private_model": ["mlp"],
           "device": "cpu", "sigma": 1.0, "clip": 1.0, "lr": 0.01, "torch_threads": 1,
           "kt_samples": 2, "self_train_samples": 4, "keep_final_checkpoints": True,
           "public_pool": "center", "public_center": 2}  # fmt: skip
PUBLIC = 2  # PrivateKT's public centre: its store at every site
# every method with a federated form (Joint pools the data: refused below), so every
# exchange of proxyfl.comm: PushSum (ProxyFL, AvgPush), the server's average (FedAvg, FML),
# the ring (CWT), the server's broadcast and the labels (PrivateKT), none (Regular)
METHODS = ["ProxyFL", "AvgPush", "FedAvg", "FML", "CWT", "PrivateKT", "Regular"]


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


def _site_project(folder: Path, center: int, stores: Path) -> Path:
    """A hospital's folder: its params.yaml (where its stores and runs are), its own store,
    the other centres' test splits as each gave them (``sites test-split``: every client
    is evaluated on every centre's test split; no training patch leaves its hospital) and
    the public centre's store (PrivateKT's pool)."""
    (folder / "patches").mkdir(parents=True)
    for store in (center, PUBLIC):
        shutil.copy(stores / f"center_{store}.h5", folder / "patches")
    for other in set(CENTERS) - {center}:
        write_test_split(stores / f"center_{other}.h5", folder / "patches" / f"center_{other}.h5")
    (folder / "params.yaml").write_text(yaml.safe_dump(
        {"train": {"centers": CENTERS, "data": "patches", "runs": "kept"}}))  # fmt: skip
    return folder


def test_jobs_submitted_to_a_running_federation_bring_back_the_bytes_of_mpiexec(
    stores: Path, tmp_path: Path
) -> None:
    coordinator = tmp_path / "coordinator"
    coordinator.mkdir()
    # a graph of the coordinator's own: the jobs carry its matrices, no site reads its path
    graph = coordinator / "graph.json"
    graph.write_text(json.dumps([[[0.0, 1.0], [1.0, 0.0]], [[0.25, 0.5], [0.75, 0.5]]]))
    params = {"train": {"algorithms": METHODS, "seeds": [0], "centers": CENTERS, "runs": "runs",
                        "options": {**OPTIONS, "graph": f"file:{graph}"}}}  # fmt: skip
    (coordinator / "params.yaml").write_text(yaml.safe_dump(params))
    provisioned = subprocess.run([*SITES, "provision", "--out", "kits", "--server-host",
                                  "localhost", "--port", str(free_port())], cwd=coordinator,
                                 capture_output=True, text=True, timeout=120)  # fmt: skip
    assert provisioned.returncode == 0, provisioned.stderr
    kits = coordinator / "kits" / "proxyfl" / "prod_00"
    hospitals = {c: _site_project(tmp_path / f"hospital-{c}", c, stores) for c in CENTERS}
    participants = [_start(kits / "localhost", tmp_path)]
    try:
        for center, folder in hospitals.items():
            site = _start(kits / f"centre-{center}", folder)
            participants.append(site)
            _wait_for_line(site, f"site centre-{center}: joined its server")

        submitting = subprocess.Popen([*SITES, "submit", str(kits / "admin@proxyfl.org")],
                                      cwd=coordinator, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)  # fmt: skip
        # meanwhile (a federated job waits on FLARE much of its time), the same jobs under
        # mpiexec on every centre's whole store
        from camelyon_proxyfl.params.base import load_sections
        from camelyon_proxyfl.params.train import TrainParams

        train = load_sections(TrainParams, coordinator / "params.yaml").train
        with warm_ranks(Placement()):
            for method in METHODS:
                config = train.job_config(method, 0).model_copy(update={
                    "data": stores,
                    "run_dir": tmp_path / "mpi" / method / "seed_0"})  # fmt: skip
                run_job(TrainingJob(config), on_line=lambda _: None)
        said, _ = submitting.communicate(timeout=900)
        assert submitting.returncode == 0, said[-4000:]
        assert said.count("FINISHED:COMPLETED") == len(METHODS), said[-4000:]
        for method in METHODS:
            assert f"{method} seed 0: finished" in said, said[-4000:]
            # each site trained in its own runs folder, and kept what never leaves it
            back = coordinator / "runs" / method / "seed_0"
            assert not [name for name in ("models", "predictions", "checkpoints")
                        if (back / name).exists()]  # fmt: skip
            for center, folder in hospitals.items():
                kept = folder / "kept" / method / "seed_0"
                assert (kept / "predictions" / f"client_{center}.csv").is_file(), kept
            # what came back is the bytes mpiexec wrote
            mpi_dir = tmp_path / "mpi" / method / "seed_0"
            for name in ("metrics.jsonl", "metrics.jsonl.sha256", "ranks/rank_0.json",
                         "ranks/rank_1.json"):  # fmt: skip
                assert (back / name).read_bytes() == (mpi_dir / name).read_bytes(), name
            ours, theirs = (json.loads((run / "run.json").read_text())
                            for run in (back, mpi_dir))  # fmt: skip
            # rank 0's site wrote run.json: its own folders
            assert ours["config"].pop("run_dir") == str(hospitals[0] / "kept" / method /
                                                        "seed_0")  # fmt: skip
            assert ours["config"].pop("data") == str(hospitals[0] / "patches")
            site_graph = Path(ours["config"].pop("graph").removeprefix("file:"))
            assert site_graph.parent == hospitals[0] / "kept" / ".graphs", site_graph
            assert theirs["config"].pop("graph") == f"file:{graph}"
            for key in ("run_dir", "data"):
                theirs["config"].pop(key)
            assert ours == theirs and ours["status"] == "finished", method

        # no hospital held another's training patch
        for center, folder in hospitals.items():
            for other in set(CENTERS) - {center}:
                held = read_store_info(folder / "patches" / f"center_{other}.h5")
                assert len(held.splits["train"]) == 0 < len(held.splits["test"])

        # the same run asked with another configuration: each site refuses it (its
        # checkpoints are another's), unless replaced: then it is trained anew
        admin = str(kits / "admin@proxyfl.org")
        other = [*SITES, "submit", admin, "--algorithms", "FedAvg", "--rounds", "3"]
        refused = subprocess.run(other, cwd=coordinator, capture_output=True, text=True,
                                 timeout=600)  # fmt: skip
        assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
        failures = (coordinator / "runs" / "FedAvg" / "seed_0" / "failures").glob("*.json")
        assert any("another configuration" in path.read_text() for path in failures)
        replaced = subprocess.run([*other, "--replace"], cwd=coordinator, capture_output=True,
                                  text=True, timeout=600)  # fmt: skip
        assert replaced.returncode == 0, replaced.stdout[-3000:] + replaced.stderr[-3000:]
        rows = (coordinator / "runs" / "FedAvg" / "seed_0" / "metrics.jsonl").read_text()
        assert {json.loads(row)["round"] for row in rows.splitlines()} == {1, 2, 3}
        assert not (coordinator / "runs" / "FedAvg" / "seed_0" / "failures").exists()

        # bad input: a site without its store fails the job in one line naming it (exit 2)
        (hospitals[1] / "patches" / "center_1.h5").unlink()
        failed = subprocess.run([*SITES, "submit", str(kits / "admin@proxyfl.org"),
                                 "--algorithms", "FedAvg", "--seeds", "1"], cwd=coordinator,
                                capture_output=True, text=True, timeout=600)  # fmt: skip
        assert failed.returncode == 2, failed.stdout[-3000:] + failed.stderr[-3000:]
        (line,) = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
        assert "FedAvg seed 1 failed with exit code 2" in line and "centre-1 2" in line, line
        failure = json.loads((coordinator / "runs" / "FedAvg" / "seed_1" / "failures" /
                              "rank_1.json").read_text())  # fmt: skip
        assert str(hospitals[1] / "patches" / "center_1.h5") in failure["error"]
        # Joint pools the centres' data: it has no federated form, and nothing is submitted;
        # nor PrivateKT's pool of every client's training split: refused before any job
        pooled = subprocess.run([*SITES, "submit", admin, "--algorithms", "FedAvg", "Joint",
                                 "PrivateKT", "--public-pool", "share"], cwd=coordinator,
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        assert pooled.returncode == 2, pooled.stderr
        lines = [line for line in pooled.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 2 and "Joint" in lines[0] and "no federated form" in lines[0]
        assert "PrivateKT" in lines[1] and "public_pool: share" in lines[1], lines
        assert "submitted" not in pooled.stdout  # not even FedAvg's job
    finally:
        for process in participants:
            process.send_signal(signal.SIGTERM)
        for process in participants:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
