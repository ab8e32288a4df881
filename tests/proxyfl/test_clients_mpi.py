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
LINGERING = Path(__file__).with_name("rank_lingering_at_exit.py")
CHECKING_TURNS = Path(__file__).with_name("rank_checking_device_turns.py")


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
            # a hosted client's turns off the device are recorded (a CPU has none to take)
            off_device = record["off_device"]
            assert off_device is None if ranks == 4 else off_device["moves"] == 0, off_device
    # a hosting rank's lines name the client they are about
    assert "[rank 1 client 3]" in logs[2] and "[rank 0 client 3]" in logs[1]
    assert "client" not in logs[4].split("[rank 3")[1].split("]")[0]


def test_a_rank_builds_each_client_with_the_others_off_its_device(
    stores: Path, tmp_path: Path, helpers: Any
) -> None:
    """A rank's clients build their models one after another, each with the state of those
    built before it already on the host: a rank's device never holds more than one
    client's models, from setup on (before, every client built on the device first and
    only then took turns)."""
    args = helpers.train_args(stores, tmp_path / "run", "ProxyFL", **_options("ProxyFL"))
    result = helpers.run_mpi(1, args, script=CHECKING_TURNS)
    assert result.returncode == 0, helpers.explain(result)
    builds = [line for line in result.stderr.splitlines() if line.startswith("device turns:")]
    assert builds == [f"device turns: a client built after {count}, on the device: []"
                      for count in range(len(CENTERS))], builds  # fmt: skip


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


def test_a_hosted_client_s_bad_input_names_the_client_its_centre_and_its_rank(
    tmp_path: Path, helpers: Any
) -> None:
    stores = helpers.write_stores(tmp_path / "stores", n_train=[40, 40, 40, 5])
    args = helpers.train_args(stores, tmp_path / "run", "FedAvg", centers=CENTERS)
    result = helpers.run_mpi(2, args)
    assert result.returncode == 2, helpers.explain(result)
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert errors == ["proxyfl.run: error: client 3 (centre 3, rank 1): --batch-size 8 is "
                      "larger than the 5 training patches of centre(s) [3]"], errors  # fmt: skip
    (stores / "center_2.h5").unlink()  # every client reads centre 2's test split
    result = helpers.run_mpi(2, args)
    assert result.returncode == 2, helpers.explain(result)
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(
        "proxyfl.run: error: clients 0 (centre 0, rank 0), 1 (centre 1, rank 0), "
        "2 (centre 2, rank 1), 3 (centre 3, rank 1): centre 2: "), errors  # fmt: skip


def test_a_rank_of_two_clients_killed_mid_run_is_named_with_them_and_the_rerun_resumes(
    stores: Path, tmp_path: Path, helpers: Any
) -> None:
    """The OOM killer's SIGKILL on a rank that hosts clients 2 and 3, mid-round: the launch
    fails naming the signal, the rank and its clients; launched again it resumes from the
    last round every client completed, to the bytes of a run never killed."""
    from proxyfl.config import TrainConfig
    from proxyfl.engine.checkpoint import verified_rounds
    from proxyfl.launch.job import TrainingJob, TrainingJobFailed, run_job, warm_ranks
    from proxyfl.launch.placement import Placement
    from tests.proxyfl.test_launch_mpi import _forked_rank, _rank_process

    def job(run_dir: Path) -> TrainingJob:
        return TrainingJob(TrainConfig(
            algorithm="ProxyFL", data=stores, run_dir=run_dir, centers=CENTERS, ranks=2,
            rounds=3, batch_size=8, proxy_model="cnn1", private_model=["mlp"], device="cpu",
            seed=0, sigma=1.0, clip=1.0, lr=1e-2, keep_final_checkpoints=True, resume=True,
        ))  # fmt: skip

    whole, killed_run = tmp_path / "whole", tmp_path / "killed"
    killed: list[int] = []

    def resumable() -> bool:  # round 1 checkpointed by every client
        return all(1 in verified_rounds(killed_run, client)[0] for client in range(4))

    def kill_rank_1(line: str) -> None:
        if not killed and "[rank 1 client" in line and "round 2/3" in line and resumable():
            started = _rank_process(1)
            assert started is not None
            _forked_rank(started).kill()
            killed.append(1)

    lines: list[str] = []
    with warm_ranks(Placement()):  # one warm server for the three jobs
        run_job(job(whole), on_line=lambda _: None)
        with pytest.raises(TrainingJobFailed) as failure:
            run_job(job(killed_run), on_line=kill_rank_1)
        assert killed, "rank 1 was running when it was killed"
        run_job(job(killed_run), on_line=lines.append)
    message = str(failure.value)
    assert failure.value.exit_code == 128 + 9, message
    assert "rank 1 (clients 2, 3) failed at training: ended by signal SIGKILL" in message
    assert any("resuming after round" in line for line in lines), lines[-20:]
    helpers.same_run(helpers.dvc_hashed_files(whole), helpers.dvc_hashed_files(killed_run),
                     whole, killed_run)  # fmt: skip


def test_a_hosted_client_failing_mid_training_is_named_and_ends_the_job(
    stores: Path, tmp_path: Path, helpers: Any
) -> None:
    """An unexpected error in one client of a rank that hosts two, after setup: client 3's
    round-1 checkpoint cannot be written (a file stands where its folder goes). The job
    fails naming the client, its centre and its rank and the error; the run is not
    finished; the other rank's clients do not wait on the failed one forever."""
    from proxyfl.config import TrainConfig
    from proxyfl.launch.job import TrainingJob, TrainingJobFailed, run_job

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "rank_3").write_text("not a folder")
    job = TrainingJob(TrainConfig(
        algorithm="ProxyFL", data=stores, run_dir=run_dir, centers=CENTERS, ranks=2, rounds=2,
        batch_size=8, proxy_model="cnn1", private_model=["mlp"], device="cpu", seed=0,
        sigma=1.0, clip=1.0, lr=1e-2,
    ))  # fmt: skip
    with pytest.raises(TrainingJobFailed) as failure:
        run_job(job, on_line=lambda _: None)
    message = str(failure.value)
    assert failure.value.exit_code != 0, message
    assert "client 3 (centre 3, rank 1) failed at training: FileExistsError" in message, message
    assert str(run_dir / "checkpoints" / "rank_3") in message
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] != "finished"


def test_a_run_folder_that_cannot_start_afresh_names_the_client_in_one_line(
    stores: Path, tmp_path: Path, helpers: Any
) -> None:
    """Before round 1 a run starts afresh (its old checkpoints removed): a folder where
    client 3's checkpoint was is one line naming the client, exit 2, no traceback, even
    from rank 0 still running its exit handlers when rank 1's end stops the job (the
    launcher's SIGINT there was a KeyboardInterrupt's traceback)."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "rank_3" / "round_0001.pt").mkdir(parents=True)
    result = helpers.run_mpi(2, helpers.train_args(stores, run_dir, "FedAvg", centers=CENTERS),
                             script=LINGERING)  # fmt: skip
    assert result.returncode == 2, helpers.explain(result)
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(
        "proxyfl.run: error: client 3 (centre 3, rank 1): [Errno 21] Is a directory"
    ), errors
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr, (
        helpers.explain(result)
    )
