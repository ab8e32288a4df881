"""The training flow under Prefect: jobs become task runs, a failed rank fails the run."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from camelyon_proxyfl.params.train import TrainSection
from flows.report import main as report_main
from flows.train import main, train
from plumbing.locks import Busy
from proxyfl.launch.job import TrainingJobFailed
from wsi.store.schema import PatchBatch, StoreAttrs, StoreError, store_path
from wsi.store.writer import write_patch_store

OPTIONS = {
    "rounds": 1, "batch_size": 4, "proxy_model": "cnn1", "private_model": ["mlp"],
    "device": "cpu", "input_size": 16,
}  # fmt: skip
# the same options as flags (the report compares each run with the parameters it is given)
OPTION_FLAGS = ["--rounds", "1", "--batch-size", "4", "--proxy-model", "cnn1",
                "--private-model", "mlp", "--device", "cpu", "--input-size", "16",
                "--centers", "0", "1"]  # fmt: skip


def _store(directory: Path, center: int, n: int = 12) -> None:
    rng = np.random.default_rng(center)

    def split(name: str) -> PatchBatch:
        labels = np.arange(n) % 2
        return PatchBatch(
            images=rng.integers(0, 255, (n, 8, 8, 3)), labels=labels,
            patients=[f"patient_{center}{name[:2]}{i % 2}" for i in range(n)],
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
    # the parameters the runs were made with: the train section the fixture gave the flow
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"train": {"centers": [0, 1], "options": OPTIONS}}))
    # a staging of other models of the same names (another directory's runs, as a clone's
    # committed results/staging.json is), whose pictures are not here: not shown, no error
    other = tmp_path / "staging.json"
    other.write_text(json.dumps({
        "format": 2, "measures": [], "failures": [],
        "methods": {"FedAvg/seed_0": {"models": {"0": "sha256:" + "1" * 64}}},
        "pictures": {"0": {"patient_002_node_0": "pictures/patient_002_node_0.png"}},
    }))  # fmt: skip
    flags = ["--config", str(params), "--runs", str(runs), "--out", str(tmp_path / "results"),
             "--staging", str(other)]  # fmt: skip
    assert report_main([*flags, "--algorithms", "FedAvg", "Joint", "--seeds", "0"]) == 0
    accuracy = (tmp_path / "results" / "tables" / "accuracy.csv").read_text()
    assert "FedAvg" in accuracy and "Joint" in accuracy
    printed = capsys.readouterr().out  # both tables, rendered by rich
    assert "Macro-accuracy" in printed and "pooled" in printed and "FedAvg" in printed
    assert "From patches to patients" not in printed
    page = (tmp_path / "results" / "report.html").read_text()
    assert f"{other} is not a staging of these runs" in page
    assert "FedAvg/seed_0 stages centre 0 with another model" in page
    assert not (tmp_path / "results" / "tables" / "staging.md").exists()

    assert report_main([*flags, "--algorithms", "FedAvg", "--seeds", "7"]) == 1
    assert "seed" in capsys.readouterr().err


def _failure(config: TrainSection, kind: type[Exception]) -> str:
    """The message of the ``kind`` error that fails the train flow run of ``config``."""
    state = train(config, return_state=True)
    assert state.is_failed()
    with pytest.raises(kind) as failure:
        state.result()
    return str(failure.value)


def test_a_failed_rank_fails_the_flow_run_with_its_message(tmp_path: Path) -> None:
    for center in (0, 1):
        _store(tmp_path / "stores", center)
    # the flow itself (unlike the command) leaves the batch size to the ranks
    options = {**OPTIONS, "batch_size": 50}
    config = _config(tmp_path / "stores", tmp_path / "runs", algorithms=["ProxyFL"],
                     options=options)  # fmt: skip
    message = _failure(config, TrainingJobFailed)
    assert "ProxyFL seed 0 failed with exit code 2" in message
    # both ranks fail alike: the message names the one whose failure came first, and its
    # own reason (which comes first is a race)
    assert re.search(
        r"rank (\d) \(centre \1\) failed at setup: --batch-size 50 is larger "
        r"than the 12 training patches of centre\(s\) \[\1\]",
        message,
    ), message
    assert str(tmp_path / "runs" / "ProxyFL" / "seed_0" / "job.log") in message


def test_a_missing_store_fails_the_flow_run_before_any_job_naming_the_fix(
    tmp_path: Path,
) -> None:
    _store(tmp_path / "stores", 0)  # centre 1's store is missing
    config = _config(tmp_path / "stores", tmp_path / "runs", algorithms=["ProxyFL"])
    message = _failure(config, StoreError)
    assert "center_1.h5: no such patch store" in message
    assert "`dvc repro preprocess@1`" in message  # and how to rebuild it
    assert not (tmp_path / "runs" / "ProxyFL" / "seed_0" / "job.log").exists()  # no job


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
               "--private-model", "mlp", "--device", "cpu", "--input-size", "16",
               "--centers", "0", "1", "--public-center", "2", "--kt-samples", "3"]  # fmt: skip
    trained = main([*common, "--data", str(tmp_path / "stores"), *options])
    assert trained == 0, capsys.readouterr().err
    run = json.loads((runs / "PrivateKT" / "seed_0" / "run.json").read_text())
    assert run["status"] == "finished" and run["world_size"] == 2
    assert {record["notion"] for record in run["privacy"].values()} == {"label_ldp"}

    assert report_main([*common, "--out", str(results), *options]) == 0
    privacy = (results / "tables" / "privacy.md").read_text()
    rows = [line for line in privacy.splitlines() if line.endswith("| PrivateKT |")]
    assert len(rows) == 2 and all("label-level ε-LDP" in line for line in rows)
    assert "| PrivateKT |" in (results / "tables" / "accuracy.md").read_text()


def _snapshot(runs: Path) -> dict[str, bytes]:
    return {str(p.relative_to(runs)): p.read_bytes() for p in sorted(runs.rglob("*"))
            if p.is_file()}  # fmt: skip


def test_a_variation_never_replaces_a_finished_run_and_the_report_never_mixes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 26's sequence: finished runs, a variation launched into the same directory
    (refused, nothing touched), the same configuration again (kept), a run not listed
    (named), an explicit replacement (swapped in), then a report with the first
    parameters (refused by name) and with the other runs tabled apart."""
    for center in (0, 1):
        _store(tmp_path / "stores", center)
    runs, results = tmp_path / "runs", tmp_path / "results"
    where = ["--data", str(tmp_path / "stores"), "--runs", str(runs)]
    both = ["--algorithms", "FedAvg", "Joint", "--seeds", "0"]
    assert main([*where, *both, *OPTION_FLAGS]) == 0, capsys.readouterr().err
    finished = _snapshot(runs)
    capsys.readouterr()

    # a variation into the same directory: refused before any job, nothing written
    assert main([*where, *both[:-1], "0", "1", *OPTION_FLAGS, "--rounds", "2"]) == 2
    err = capsys.readouterr().err
    for algorithm in ("FedAvg", "Joint"):
        assert f"error: {runs / algorithm / 'seed_0'}: holds a finished run made with " \
               "another configuration (rounds 1 -> 2; recorded -> asked)" in err  # fmt: skip
    assert "--runs DIR" in err and "--replace" in err and "nothing was launched" in err
    assert _snapshot(runs) == finished and not (runs / "FedAvg" / "seed_1").exists()

    # a bad option is caught by the same checks, before any server or job
    assert main([*where, *both, *OPTION_FLAGS, "--batch-size", "450"]) == 2
    err = capsys.readouterr().err
    assert "train.options.batch_size: 450 is larger than the 12 training patches of centre 0" in err
    assert _snapshot(runs) == finished

    # a store that cannot be read is named with its centre and the fix, before any job
    (tmp_path / "stores" / "center_2.h5").write_bytes(b"cut short")
    assert main([*where, *both, *OPTION_FLAGS, "--centers", "0", "1", "2"]) == 2
    err = capsys.readouterr().err
    assert f"centre 2: {tmp_path / 'stores' / 'center_2.h5'}: not a readable HDF5" in err
    assert "`dvc repro preprocess@2`" in err
    assert _snapshot(runs) == finished

    # the same configuration again: kept as it is
    assert main([*where, *both, *OPTION_FLAGS]) == 0
    assert _snapshot(runs) == finished

    # a run that is not listed for the report is named, not silently left out
    assert main([*where, "--algorithms", "FedAvg", "--seeds", "1", *OPTION_FLAGS]) == 0
    report_flags = ["--runs", str(runs), "--out", str(results), *both, *OPTION_FLAGS]
    assert report_main(report_flags) == 0, capsys.readouterr().err
    accuracy = (results / "tables" / "accuracy.md").read_text()
    assert "these tables: FedAvg/seed_1." in accuracy
    assert "FedAvg/seed_1" in (results / "report.html").read_text()

    # asked explicitly, the variation replaces FedAvg's run once it has finished
    capsys.readouterr()
    replace = ["--algorithms", "FedAvg", "--seeds", "0", *OPTION_FLAGS, "--rounds", "2"]
    assert main([*where, *replace, "--replace"]) == 0, capsys.readouterr().err
    run = json.loads((runs / "FedAvg" / "seed_0" / "run.json").read_text())
    assert run["status"] == "finished" and run["fingerprint"]["rounds"] == 2
    assert run["config"]["run_dir"] == str(runs / "FedAvg" / "seed_0")
    left = sorted(p.name for p in (runs / "FedAvg").iterdir() if not p.name.endswith(".lock"))
    assert left == ["seed_0", "seed_1"]  # no staging or retired directory left

    # the report with the first parameters refuses the replaced run by name ...
    assert report_main(report_flags) == 1
    err = capsys.readouterr().err
    assert "FedAvg/seed_0" in err and "rounds 2, the parameters say 1" in err
    assert "--other-configurations separate" in err
    # ... or, asked, tables it apart, labelled with its parameters, never in a row
    assert report_main([*report_flags, "--other-configurations", "separate"]) == 0
    accuracy = (results / "tables" / "accuracy.md").read_text()
    assert "| Joint |" in accuracy and "| FedAvg |" not in accuracy
    other = (results / "tables" / "other_configurations.md").read_text()
    assert "## Made with rounds=2" in other and "| FedAvg |" in other
    assert "Final round 2" in other
    assert "Made with rounds=2" in (results / "report.html").read_text()


def test_a_second_launch_into_a_run_directory_in_use_is_refused_before_any_job(
    tmp_path: Path,
) -> None:
    """Another process holds the run directory (a launch under way): the task fails with
    Busy naming it, before any plan or job (plumbing.locks)."""
    import subprocess
    import sys

    for center in (0, 1):
        _store(tmp_path / "stores", center)
    run_dir = tmp_path / "runs" / "FedAvg" / "seed_0"
    hold = ("import sys, time; from plumbing.locks import exclusive\n"
            "with exclusive([sys.argv[1]], 'training into'):\n"
            "    print('held', flush=True); time.sleep(60)\n")  # fmt: skip
    repo = Path(__file__).resolve().parents[2]
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run_dir)], text=True,
                              stdout=subprocess.PIPE, cwd=repo)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        config = _config(tmp_path / "stores", tmp_path / "runs", algorithms=["FedAvg"])
        message = _failure(config, Busy)
    finally:
        holder.kill()
        holder.wait()
    assert str(run_dir) in message and "another run is training into it" in message
    assert not run_dir.exists()  # nothing planned, written or launched


def _rewrite_json(path: Path, change: Callable[[Any], None], line: int | None = None) -> None:
    """``path`` (JSON, or line ``line`` of JSON lines) changed by ``change``: still valid,
    its values no longer those written."""
    if line is None:
        value = json.loads(path.read_text())
        change(value)
        path.write_text(json.dumps(value))
        return
    lines = path.read_text().splitlines()
    value = json.loads(lines[line])
    change(value)
    lines[line] = json.dumps(value)
    path.write_text("\n".join(lines) + "\n")


def test_a_finished_run_whose_records_do_not_verify_is_refused_by_report_and_audit_and_retrained(
    runs: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """metrics.jsonl, run.json or a client's predictions edited after the run finished,
    each still well-formed: the report and the audit exit 2 naming the file and the
    command that trains the run again; a launch trains it again instead of keeping it."""
    from flows.audit import main as audit_main
    from proxyfl.launch.rundir import Action, plan_launch

    copied = tmp_path / "runs"
    shutil.copytree(runs, copied)
    run_dir = copied / "FedAvg" / "seed_0"
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"train": {"centers": [0, 1], "options": OPTIONS}}))
    monkeypatch.chdir(tmp_path)
    flags = ["--config", str(params), "--runs", str(copied), "--algorithms", "FedAvg",
             "--seeds", "0"]  # fmt: skip
    assert report_main([*flags, "--out", str(tmp_path / "results")]) == 0
    capsys.readouterr()
    config = _config(runs.parent / "stores", copied).job_config("FedAvg", 0)
    assert plan_launch(config).action is Action.KEEP

    def bump_accuracy(row: dict[str, Any]) -> None:
        row["accuracy"] = 0.25 if row["accuracy"] != 0.25 else 0.75

    def bump_world(run: dict[str, Any]) -> None:
        run["world_size"] += 1

    edits = {
        "metrics.jsonl": lambda path: _rewrite_json(path, bump_accuracy, line=-1),
        "run.json": lambda path: _rewrite_json(path, bump_world),
        "predictions/client_1.csv": lambda path: path.write_text(
            path.read_text().replace(",0.", ",1.", 1)
        ),
    }
    repair = "train the run again: `python -m flows.train --algorithms FedAvg --seeds 0 --replace`"
    for name, edit in edits.items():
        path = run_dir / name
        intact = path.read_bytes()
        edit(path)
        assert path.read_bytes() != intact
        assert report_main([*flags, "--out", str(tmp_path / "results")]) == 2, name
        error = capsys.readouterr().err
        assert f"error: {path}: its bytes are not those written" in error, error
        assert repair in error and "Traceback" not in error
        plan = plan_launch(config)
        assert plan.action is Action.REPLACE, plan.reason
        assert f"finished, but its files do not verify ({path}: " in plan.reason
        if name == "run.json":
            assert audit_main([*flags, "--data", str(runs.parent / "stores")]) == 2
            error = capsys.readouterr().err
            assert f"error: {path}: its bytes are not those written" in error, error
        path.write_bytes(intact)
    assert report_main([*flags, "--out", str(tmp_path / "results")]) == 0


def test_discard_staged_deletes_an_interrupted_replacement_and_keeps_the_finished_run(
    runs: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A killed ``--replace`` left ``.seed_0.next`` beside a finished run: a plain launch
    keeps both and says so; ``--discard-staged`` deletes it, says how much, and keeps the
    finished run."""
    copied = tmp_path / "runs"
    shutil.copytree(runs, copied)
    staged = copied / "FedAvg" / ".seed_0.next"
    (staged / "checkpoints").mkdir(parents=True)
    (staged / "checkpoints" / "round_0001.pt").write_bytes(bytes(3_000_000))
    finished = (copied / "FedAvg" / "seed_0" / "run.json").read_bytes()
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"train": {"centers": [0, 1], "options": OPTIONS}}))
    monkeypatch.chdir(tmp_path)
    flags = ["--config", str(params), "--runs", str(copied), "--data", str(runs.parent / "stores"),
             "--algorithms", "FedAvg", "--seeds", "0"]  # fmt: skip
    assert main(flags) == 0
    assert staged.is_dir()
    assert main([*flags, "--discard-staged"]) == 0
    said = capsys.readouterr().out
    assert (
        f"{copied / 'FedAvg' / 'seed_0'}: its interrupted replacement {staged} deleted "
        "(3.0 MB)" in said
    ), said
    assert not staged.exists()
    assert (copied / "FedAvg" / "seed_0" / "run.json").read_bytes() == finished


def test_train_ranks_places_every_job_s_clients_on_that_many_processes(tmp_path: Path) -> None:
    from camelyon_proxyfl.placement import largest_job_ranks
    from proxyfl.launch.job import TrainingJob

    section = _config(tmp_path, tmp_path / "runs", centers=[0, 1, 2], ranks=2)
    fedavg, joint = (section.job_config(algorithm, 0) for algorithm in ("FedAvg", "Joint"))
    assert (fedavg.ranks, TrainingJob(fedavg).ranks) == (2, 2)
    assert (joint.ranks, TrainingJob(joint).ranks) == (None, 1)
    assert largest_job_ranks(section) == 2
    many = _config(tmp_path, tmp_path / "runs", centers=[0, 1, 2], ranks=5)
    assert TrainingJob(many.job_config("FedAvg", 0)).ranks == 3  # at most one a client
    default = _config(tmp_path, tmp_path / "runs", centers=[0, 1, 2])
    assert TrainingJob(default.job_config("FedAvg", 0)).ranks == 3  # a rank per client
    with pytest.raises(ValidationError, match="flare runs a site per centre"):
        _config(tmp_path, tmp_path / "runs", launcher="flare", ranks=1)
    with pytest.raises(
        ValidationError, match=r"in train\.centers \(--centers\) and train\.eval_centers"
    ):
        _config(tmp_path, tmp_path / "runs", eval_centers=[1])
