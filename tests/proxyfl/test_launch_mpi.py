"""The job launcher under real mpiexec: lines are streamed, a failed rank is named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import psutil
import pytest

from proxyfl.config import TrainConfig
from proxyfl.engine.validation import read_failures
from proxyfl.launch.job import JOB_LOG, Placement, TrainingJob, TrainingJobFailed, run_job
from wsi.store.schema import store_path

OPTIONS = {
    "rounds": 1, "batch_size": 8, "proxy_model": "cnn1", "private_model": "mlp",
    "device": "cpu", "sigma": 1.0, "clip": 1.0, "lr": 1e-2,
}  # fmt: skip


def _job(
    data: Path,
    out: Path,
    algorithm: str = "ProxyFL",
    centers: tuple[int, ...] = (0, 1),
    placement: Placement | None = None,
) -> TrainingJob:
    config = TrainConfig(
        algorithm=algorithm, seed=0, data=data, out=out, centers=list(centers), **OPTIONS
    )
    return TrainingJob(config, placement or Placement())


def test_a_job_streams_every_rank_and_writes_its_log(stores: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    job = _job(stores, tmp_path / "run")
    run_job(job, on_line=lines.append)
    assert any("[rank 0]" in line and "round 1/1" in line for line in lines)
    assert any("[rank 1]" in line and "round 1/1" in line for line in lines)
    assert (job.run_dir / JOB_LOG).read_text().splitlines() == lines
    assert json.loads((job.run_dir / "run.json").read_text())["status"] == "finished"
    assert not (job.run_dir / "checkpoints").exists()  # a finished run keeps no checkpoints


def test_joint_runs_as_one_rank(stores: Path, tmp_path: Path) -> None:
    job = _job(stores, tmp_path / "joint", algorithm="Joint")
    assert job.command()[1:3] == ["-n", "1"] and job.ranks == 1
    run_job(job, on_line=lambda _: None)
    assert json.loads((job.run_dir / "run.json").read_text())["world_size"] == 1


def _corrupt_training_images(store: Path) -> None:
    """Rewrite the train images gzip-compressed, then garble one chunk's bytes: the store
    opens and validates, but decoding that patch fails in the rank that trains on it."""
    with h5py.File(store, "a") as h5:
        images = h5["train"]["images"][()]
        del h5["train"]["images"]
        h5["train"].create_dataset(
            "images", data=images, chunks=(1, *images.shape[1:]), compression="gzip"
        )
    with h5py.File(store, "r") as h5:
        chunk = h5["train"]["images"].id.get_chunk_info(0)
    with open(store, "r+b") as handle:
        handle.seek(chunk.byte_offset)
        handle.write(np.full(chunk.size, 0xFF, dtype=np.uint8).tobytes())


def test_a_failed_rank_is_named_with_its_last_lines(helpers: Any, tmp_path: Path) -> None:
    data = helpers.write_stores(tmp_path / "stores", centers=(0, 1))
    _corrupt_training_images(store_path(data, 1))
    job = _job(data, tmp_path / "run")
    with pytest.raises(TrainingJobFailed) as failure:
        run_job(job, on_line=lambda _: None)
    error = failure.value
    assert error.exit_code != 0
    # named from the record the rank left, not from what the log says (patches load at setup)
    assert error.rank == 1 and error.failure is not None and error.failure.phase == "setup"
    assert [f.rank for f in read_failures(job.run_dir)] == [1]
    message = str(error)
    assert "ProxyFL seed 0 failed with exit code" in message and "rank 1" in message
    assert "rank 1 (centre 1)" in message and "read data" in message  # HDF5's own reason
    assert str(job.run_dir / JOB_LOG) in message


class _JobSockets:
    """The listening sockets of the job's processes (the launcher, its helpers and the
    ranks: what ``ss -ltnp`` shows of the job), sampled each time a rank speaks (a rank
    logs only after ``MPI_Init``, which opens its listeners)."""

    def __init__(self) -> None:
        self.rank_pids: set[int] = set()
        self.listening: set[tuple[str, str, int]] = set()

    @staticmethod
    def _job_processes() -> list[psutil.Process]:
        found = []
        for process in psutil.Process().children(recursive=True):
            try:
                if Path(process.cmdline()[0]).name.startswith("mpiexec"):
                    found += [process, *process.children(recursive=True)]
            except (psutil.NoSuchProcess, IndexError):
                continue
        return found

    def sample(self, line: str) -> None:
        if "[rank " not in line:
            return
        for process in self._job_processes():
            try:
                if "PMI_RANK" in process.environ():  # a rank, not the launcher
                    self.rank_pids.add(process.pid)
                self.listening |= {
                    (process.name(), connection.laddr.ip, connection.laddr.port)
                    for connection in process.net_connections(kind="inet")
                    if connection.status in (psutil.CONN_LISTEN, psutil.CONN_NONE)
                }
            except psutil.NoSuchProcess:
                continue


def test_a_job_on_this_machine_listens_on_no_network(helpers: Any, tmp_path: Path) -> None:
    """Four ranks on one machine: neither the launcher nor a rank listens on any socket,
    not even loopback (hydra's control port would be on 0.0.0.0, every rank's on the
    external interface: the next test)."""
    data = helpers.write_stores(tmp_path / "stores", centers=(0, 1, 2, 3))
    job = _job(data, tmp_path / "run", centers=(0, 1, 2, 3))
    sockets = _JobSockets()
    run_job(job, on_line=sockets.sample)
    assert len(sockets.rank_pids) == 4, "sampled while every rank was running"
    assert sockets.listening == set()
    assert json.loads((job.run_dir / "run.json").read_text())["status"] == "finished"


def test_a_job_across_named_hosts_is_launched_by_hydra(helpers: Any, tmp_path: Path) -> None:
    """``train.hosts``: hydra's mpiexec starts the ranks (here on this machine, by name),
    and they train; its control port listens beyond loopback, as a multi-host job must."""
    data = helpers.write_stores(tmp_path / "stores", centers=(0, 1))
    job = _job(data, tmp_path / "run", placement=Placement(("localhost",)))
    assert job.command()[1:3] == ["-hosts", "localhost"]
    sockets = _JobSockets()
    run_job(job, on_line=sockets.sample)
    assert json.loads((job.run_dir / "run.json").read_text())["status"] == "finished"
    beyond_loopback = {ip for _, ip, _ in sockets.listening} - {"127.0.0.1", "::1"}
    assert beyond_loopback, sockets.listening
