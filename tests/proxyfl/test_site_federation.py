"""What a federation's site keeps and what leaves it (:mod:`proxyfl.sites.federation`),
without FLARE: the run's name, the site's own folders, the files sent back and checked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from proxyfl.comm.graphs import parse_schedule_spec
from proxyfl.config import TrainConfig
from proxyfl.sites.federation import (
    FederationError,
    SiteFolders,
    carried_graph,
    checked_results,
    checked_run_name,
    names_that_leave,
    results_that_leave,
    write_results,
)
from proxyfl.sites.submit import federation_refusal


def _config_json(**changes: object) -> str:
    config = TrainConfig(algorithm="FedAvg", centers=[0, 1], rounds=2, seed=3,
                         data=Path("/submitter/data"),
                         run_dir=Path("/submitter/runs/x"))  # fmt: skip
    values = config.model_dump(mode="json", exclude={"data", "run_dir"})
    return json.dumps({**values, **changes})


@pytest.mark.parametrize("name", ["FedAvg/seed_0", "ProxyFL/seed_12", "a.b/c-d_e"])
def test_a_run_name_of_plain_parts_is_taken(name: str) -> None:
    assert checked_run_name(name) == name


@pytest.mark.parametrize("name", ["", "../etc", "FedAvg/../../x", "/abs/path", "a//b", ".",
                                  "a/.hidden", "FedAvg/seed_0/"])  # fmt: skip
def test_a_run_name_that_could_leave_the_runs_folder_is_refused(name: str) -> None:
    with pytest.raises(FederationError, match="not a run name"):
        checked_run_name(name)


def test_the_site_runs_the_job_in_its_own_folders(tmp_path: Path) -> None:
    folders = SiteFolders(tmp_path / "stores", tmp_path / "runs")
    written = folders.write_run_config(_config_json(), "FedAvg/seed_3")
    assert written == tmp_path / "runs" / "FedAvg" / "seed_3" / "config.json"
    config = json.loads(written.read_text())
    assert config["data"] == str(tmp_path / "stores")
    assert config["run_dir"] == str(tmp_path / "runs" / "FedAvg" / "seed_3")
    assert (config["algorithm"], config["seed"], config["rounds"]) == ("FedAvg", 3, 2)
    # the environment `sites start` gives it, read back by the site's job process
    assert SiteFolders.from_environment(folders.environment()) == folders


def test_replace_deletes_the_sites_earlier_run_of_that_name(tmp_path: Path) -> None:
    folders = SiteFolders(tmp_path / "stores", tmp_path / "runs")
    earlier = tmp_path / "runs" / "FedAvg" / "seed_3" / "checkpoints" / "round_2.pt"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"checkpoint")
    folders.write_run_config(_config_json(), "FedAvg/seed_3")
    assert earlier.is_file()  # kept: the rank resumes it, or refuses another configuration
    folders.write_run_config(_config_json(), "FedAvg/seed_3", replace=True)
    assert not earlier.exists()


def test_a_site_takes_no_path_from_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every path a federation's rank uses is its site's: torch.compile's cache is the
    site's default whatever the job names, a canary plan (a file of the administrator's)
    is refused, and so is a task of the local launcher's form (a configuration file and a
    folder named), which would run the rank outside the site's folders."""
    from nvflare.apis.shareable import Shareable

    from proxyfl.sites.executor import ARGUMENTS, WORKING_DIRECTORY, _job_at_this_site

    folders = SiteFolders(tmp_path / "stores", tmp_path / "runs")
    config = folders.run_config(_config_json(compile_cache="/elsewhere/cache"), "FedAvg/seed_3")
    assert config.compile_cache == TrainConfig.model_fields["compile_cache"].default
    with pytest.raises(FederationError, match="canary plan"):
        folders.run_config(_config_json(canaries="/admin/canaries.json"), "FedAvg/seed_3")
    task = Shareable()
    task[ARGUMENTS], task[WORKING_DIRECTORY] = ["--config", "/admin/config.json"], "/admin"
    for name, value in folders.environment().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(FederationError, match="its own folders"):
        _job_at_this_site(task)
    for name in folders.environment():  # the local launcher's own sites: taken as it is
        monkeypatch.delenv(name)
    assert _job_at_this_site(task) == (["--config", "/admin/config.json"], Path("/admin"), None)


def test_a_configuration_the_site_cannot_validate_is_refused(tmp_path: Path) -> None:
    folders = SiteFolders(tmp_path / "stores", tmp_path / "runs")
    with pytest.raises(ValueError, match="rounds"):
        folders.run_config(_config_json(rounds=0), "FedAvg/seed_3")
    with pytest.raises(FederationError, match="JSON object"):
        folders.run_config("[1, 2]", "FedAvg/seed_3")


def test_a_file_graph_travels_as_its_matrices_and_no_site_reads_a_path_of_the_job(
    tmp_path: Path,
) -> None:
    """A ``file:`` graph names a file of the submitting machine: the job carries its
    matrices (:func:`carried_graph`), and the site writes them into its own runs folder,
    the same numbers to the bit. A job that names a path and carries nothing is refused
    without the path being opened: a FIFO there would block a reader, and a site's
    secret would come back in the parse error."""
    matrices = [[[0.5, 0.5], [0.5, 0.5]], [[0.0, 1.0], [1.0, 0.0]], [[0.1, 0.3], [0.9, 0.7]]]
    graph_file = tmp_path / "admin" / "graph.json"
    graph_file.parent.mkdir()
    graph_file.write_text(json.dumps({"matrices": matrices}))
    admin = TrainConfig(algorithm="ProxyFL", centers=[0, 1], graph=f"file:{graph_file}")
    carried = carried_graph(admin)
    assert carried == matrices and carried_graph(TrainConfig(centers=[0, 1])) is None

    folders = SiteFolders(tmp_path / "stores", tmp_path / "runs")
    job = _config_json(graph=f"file:{graph_file}")
    config = folders.run_config(job, "FedAvg/seed_3", graph=carried)
    site_file = Path(config.graph.removeprefix("file:"))
    assert site_file.parent == tmp_path / "runs" / ".graphs"
    ours, theirs = parse_schedule_spec(admin.graph), parse_schedule_spec(config.graph)
    assert [m.tobytes() for m in ours.matrices] == [m.tobytes() for m in theirs.matrices]
    again = folders.run_config(job, "FedAvg/seed_3", graph=carried)  # a resumed job's
    assert again.graph == config.graph

    fifo = tmp_path / "site-fifo"
    os.mkfifo(fifo)  # opened for reading, it would block until a writer came
    for named in (fifo, Path("/etc/passwd"), tmp_path / "nothing-there"):
        with pytest.raises(FederationError, match="reads no file a job names"):
            folders.run_config(_config_json(graph=f"file:{named}"), "FedAvg/seed_3")
    with pytest.raises(FederationError, match="matrix 0 of the job's graph is not column"):
        folders.run_config(job, "FedAvg/seed_3", graph=[[[1.0, 1.0], [1.0, 0.0]]])
    with pytest.raises(FederationError, match="is not a matrix of numbers"):
        folders.run_config(job, "FedAvg/seed_3", graph=[[["root:x:0:0", 1.0], [0.0, 0.0]]])
    with pytest.raises(FederationError, match="carries a graph's matrices"):
        folders.run_config(_config_json(), "FedAvg/seed_3", graph=carried)
    # a graph of another federation's size: refused here, not in the job's first round
    with pytest.raises(ValidationError, match=r"its matrices are 3x3, for a job of 2 clients"):
        folders.run_config(job, "FedAvg/seed_3", graph=[[[1 / 3] * 3] * 3])


def test_a_run_name_names_one_run_never_one_holding_or_inside_another(tmp_path: Path) -> None:
    """``ProxyFL`` where the site keeps ``ProxyFL/seed_0`` would mix the rank's files with
    every seed's (and ``replace`` would delete them all); ``ProxyFL/seed_0/ranks`` would
    write inside a run."""
    folders = SiteFolders(tmp_path / "stores", tmp_path / "runs")
    kept = folders.write_run_config(_config_json(), "ProxyFL/seed_0")
    with pytest.raises(FederationError, match="holds this site's run ProxyFL/seed_0"):
        folders.write_run_config(_config_json(), "ProxyFL", replace=True)
    with pytest.raises(FederationError, match="lies in this site's run ProxyFL/seed_0"):
        folders.write_run_config(_config_json(), "ProxyFL/seed_0/ranks", replace=True)
    assert kept.is_file()
    assert folders.write_run_config(_config_json(), "ProxyFL/seed_1").is_file()
    assert folders.write_run_config(_config_json(), "ProxyFL/seed_0", replace=True) == kept


def test_a_site_started_without_its_folders_says_how_to_start_it() -> None:
    with pytest.raises(FederationError, match="sites start KIT"):
        SiteFolders.from_environment({})


def _run(run_dir: Path) -> Path:
    """A finished run's files as a site holds them: its records, models, predictions."""
    for name in ("run.json", "run.json.sha256", "metrics.jsonl", "metrics.jsonl.sha256",
                 "machine.json", "config.json", "job.log", "ranks/rank_0.json",
                 "ranks/rank_0.machine.json", "ranks/rank_1.json", "ranks/rank_1.machine.json",
                 "models/client_1/private.pt", "predictions/client_1.csv",
                 "checkpoints/rank_1/round_2.pt", "failures/rank_1.json"):  # fmt: skip
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_bytes(name.encode())
    return run_dir


def test_only_records_leave_a_site_never_models_predictions_or_checkpoints(
    tmp_path: Path,
) -> None:
    run_dir = _run(tmp_path / "run")
    assert sorted(results_that_leave(run_dir, 1)) == [
        "failures/rank_1.json", "ranks/rank_1.json", "ranks/rank_1.machine.json"]  # fmt: skip
    rank_0 = results_that_leave(run_dir, 0)
    assert sorted(rank_0) == ["machine.json", "metrics.jsonl", "metrics.jsonl.sha256",
                              "ranks/rank_0.json", "ranks/rank_0.machine.json", "run.json",
                              "run.json.sha256"]  # fmt: skip
    assert all(data == name.encode() for name, data in rank_0.items())
    assert not any(name.startswith(("models/", "predictions/", "checkpoints/"))
                   for rank in (0, 1, 7) for name in names_that_leave(rank))  # fmt: skip


def test_a_rank_that_did_not_finish_sends_its_failure_record_alone(tmp_path: Path) -> None:
    """A rank that refused the job (its site's run of that name has another configuration:
    exit 2) or failed sends no run record: those at its site may be an earlier run's."""
    run_dir = _run(tmp_path / "run")
    assert results_that_leave(run_dir, 0, finished=False) == {}  # rank 0 has no failure here
    assert results_that_leave(run_dir, 1, finished=False) == {
        "failures/rank_1.json": b"failures/rank_1.json"}  # fmt: skip


def test_a_site_cannot_send_another_ranks_records(tmp_path: Path) -> None:
    run_dir = _run(tmp_path / "run")
    assert checked_results(results_that_leave(run_dir, 1), 1)
    for forged in ({"run.json": b"{}"}, {"ranks/rank_0.json": b"{}"},
                   {"models/client_1/private.pt": b"weights"},
                   {"ranks/rank_1.json": "not bytes"}):  # fmt: skip
        with pytest.raises(FederationError, match="does not write"):
            checked_results(forged, 1)  # type: ignore[arg-type]


def test_what_comes_back_is_written_into_the_run_and_nothing_else(tmp_path: Path) -> None:
    site = _run(tmp_path / "site")
    back = tmp_path / "back"
    results = {**results_that_leave(site, 0), **results_that_leave(site, 1)}
    assert write_results(back, results) == sorted(results)
    assert all((back / name).read_bytes() == data for name, data in results.items())
    for name in ("../outside.json", "models/client_0/private.pt", "/etc/passwd",
                 "ranks/rank_1.json/../../outside.json", "failures/rank_1.machine.json",
                 "ranks/../outside.json"):  # fmt: skip
        with pytest.raises(FederationError, match="not a file a site sends back"):
            write_results(back, {name: b"x"})
    assert not (tmp_path / "outside.json").exists()


def test_what_has_no_federated_form_is_named() -> None:
    def config(algorithm: str, **options: object) -> TrainConfig:
        return TrainConfig(algorithm=algorithm, centers=[0, 1], **options)  # type: ignore[arg-type]

    assert "no federated form" in (federation_refusal(config("Joint")) or "")
    assert "public_pool: share" in (federation_refusal(config("PrivateKT")) or "")
    assert federation_refusal(config("PrivateKT", public_pool="center", public_center=2)) is None
    assert federation_refusal(config("ProxyFL")) is None
