"""What a launch may do with a run directory (proxyfl.launch.rundir): every row of its table, the
staged replacement and its recovery, on real stores and run directories written the way
proxyfl.run writes them (no MPI job: the launches themselves are tested in tests/flows)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from plumbing.verified import record_digest
from proxyfl.config import TrainConfig, fingerprint_changes
from proxyfl.kept import damaged_files
from proxyfl.launch.rundir import (
    Action,
    RunConflict,
    RunState,
    holds_another_configuration,
    plan_launch,
    prepare,
    publish_staged,
    read_recorded_run,
    run_inputs,
    staging_dir,
    write_config,
)
from tests.proxyfl.conftest import write_stores
from wsi.store.digest import store_digest
from wsi.store.schema import store_path


def _config(data: Path, run_dir: Path, **options: Any) -> TrainConfig:
    values = {"algorithm": "FedAvg", "seed": 0, "centers": [0, 1], "data": data,
              "run_dir": run_dir, "rounds": 3, "proxy_model": "cnn1", **options}  # fmt: skip
    return TrainConfig(**values)


def _record(config: TrainConfig, status: str) -> None:
    """What a launch of ``config`` leaves (config.json, inputs.json: the launcher's) and
    its job (run.json, as proxyfl.run writes it; a metrics file)."""
    _, out = config.require_paths()
    out.mkdir(parents=True, exist_ok=True)
    write_config(config)
    (out / "inputs.json").write_text(json.dumps(run_inputs(config)))
    run = {"status": status, "algorithm": config.algorithm,
           "config": config.model_dump(mode="json"), "fingerprint": config.fingerprint(),
           "config_digest": config.digest()}  # fmt: skip
    (out / "run.json").write_text(json.dumps(run))
    (out / "metrics.jsonl").write_text(f'{{"status": "{status}"}}\n')
    if status == "finished":  # as proxyfl.run records them
        record_digest(out / "metrics.jsonl")
        record_digest(out / "run.json")


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    return write_stores(tmp_path / "stores", centers=(0, 1, 4))


def test_nothing_there_starts_and_an_unfinished_run_of_the_same_configuration_resumes(
    data: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs" / "FedAvg" / "seed_0"
    config = _config(data, run_dir)
    assert plan_launch(config).action is Action.START
    run_dir.mkdir(parents=True)  # an empty directory is nothing
    assert plan_launch(config).action is Action.START
    prepare(plan_launch(config), config)  # a launch killed before its job wrote anything
    assert [p.name for p in run_dir.iterdir()] == ["inputs.json"]
    assert plan_launch(config).action is Action.START
    _record(config, "running")
    for replace in (False, True):  # a resume is not a replacement
        plan = plan_launch(config, replace)
        assert (plan.action, plan.work) == (Action.RESUME, run_dir)


def test_a_resumed_run_loses_the_temporaries_of_the_job_killed_in_it(
    data: Path, tmp_path: Path
) -> None:
    """A job killed inside an atomic write leaves ``.{name}.{pid}.tmp`` (a rank record, a
    model); the launch that resumes the run removes those of dead writers, anywhere in it,
    and keeps a live writer's."""
    run_dir = tmp_path / "runs" / "FedAvg" / "seed_0"
    config = _config(data, run_dir)
    _record(config, "running")
    dead = _dead_pid()
    torn = [run_dir / "ranks" / f".rank_1.machine.json.{dead}.tmp",
            run_dir / "models" / "client_0" / f".local.safetensors.{dead}.tmp",
            run_dir / f".metrics.jsonl.{dead}.tmp"]  # fmt: skip
    live = run_dir / "ranks" / f".rank_0.json.{os.getpid()}.tmp"
    for path in [*torn, live]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half")
    plan = plan_launch(config)
    assert plan.action is Action.RESUME
    prepare(plan, config)
    assert not any(path.exists() for path in torn) and live.exists()
    assert (run_dir / "metrics.jsonl").exists()  # the run itself is kept whole


@pytest.mark.parametrize("torn", ["inputs.json", "config.json"])
def test_a_launch_killed_inside_its_first_writes_left_no_run(
    data: Path, tmp_path: Path, torn: str
) -> None:
    """A launch killed while writing inputs.json or config.json (before its job wrote
    anything) leaves that file's temporary: no run, so the next launch starts, and removes
    it (CI stop 91: a campaign's train killed at 17.4 s was refused as "an unfinished run
    whose configuration was not recorded")."""
    run_dir = tmp_path / "runs" / "FedAvg" / "seed_0"
    config = _config(data, run_dir)
    if torn == "config.json":
        prepare(plan_launch(config), config)
    run_dir.mkdir(parents=True, exist_ok=True)
    temporary = run_dir / f".{torn}.{_dead_pid()}.tmp"
    temporary.write_text('{"algorithm": "Fed')
    assert read_recorded_run(run_dir).state is RunState.ABSENT
    assert not holds_another_configuration(config)
    plan = plan_launch(config)
    assert plan.action is Action.START
    prepare(plan, config)
    assert sorted(p.name for p in run_dir.iterdir()) == ["inputs.json"]
    (run_dir / "metrics.jsonl").write_text("{}\n")  # but a file of the job's is a run
    assert read_recorded_run(run_dir).state is RunState.UNFINISHED


def _dead_pid() -> int:
    """The PID of a process that has exited (and was reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_finished_run_of_the_same_configuration_and_stores_is_kept(
    data: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs" / "FedAvg" / "seed_0"
    config = _config(data, run_dir)
    _record(config, "finished")
    plan = plan_launch(config)
    assert plan.action is Action.KEEP and "--replace" in plan.reason
    # where the run and its stores are, and how it runs, are not its configuration
    elsewhere = _config(data, run_dir, device="cpu", loader_workers=2, keep_final_checkpoints=True)
    assert plan_launch(elsewhere).action is Action.KEEP
    replaced = plan_launch(config, replace=True)
    assert (replaced.action, replaced.work) == (Action.REPLACE, staging_dir(run_dir))


def test_a_finished_run_whose_kept_models_are_damaged_is_trained_again(
    data: Path, tmp_path: Path
) -> None:
    """The issue's cases: a kept model truncated, or 400 bytes flipped inside its tensors.
    The loader names the file and the command that retrains it; a launch does not keep the
    run but trains it again beside it."""
    import torch

    from plumbing.verified import DamagedFileError
    from proxyfl.engine.models import build_model
    from proxyfl.engine.trained import ModelCard, load_trained, save_trained
    from proxyfl.kept import trained_path

    run_dir = tmp_path / "runs" / "FedAvg" / "seed_3"
    config = _config(data, run_dir)
    _record(config, "finished")
    torch.manual_seed(0)
    card = ModelCard(architecture="cnn1", n_classes=2, input_size=16, patch_size=16,
                     normalisation="", classes=("healthy", "tumor"), evaluated_model="central",
                     algorithm="FedAvg", seed=3, client=0, center=0, rounds=1,
                     config_digest="x")  # fmt: skip
    path = trained_path(run_dir, 0, "central")
    path.parent.mkdir(parents=True)
    save_trained(build_model("cnn1", 2, 16), path, card)
    assert load_trained(path)[1] == card
    assert plan_launch(config).action is Action.KEEP
    intact = path.read_bytes()

    flipped = bytearray(intact)
    flipped[-1000:-600] = bytes(b ^ 0xFF for b in flipped[-1000:-600])  # inside the tensors
    path.write_bytes(bytes(flipped))
    with pytest.raises(DamagedFileError, match=r"central\.safetensors: its bytes are not those "
                       r"written.*--algorithms FedAvg --seeds 3 --replace"):  # fmt: skip
        load_trained(path)
    plan = plan_launch(config)
    assert plan.action is Action.REPLACE and "its files do not verify" in plan.reason
    assert str(path) in plan.reason

    path.write_bytes(intact[:5000])  # cut short
    with pytest.raises(DamagedFileError, match="5000 bytes"):
        load_trained(path)
    path.write_bytes(intact)
    assert plan_launch(config).action is Action.KEEP


def test_an_interrupted_replacement_left_beside_a_run_is_reported(
    data: Path, tmp_path: Path
) -> None:
    """A killed ``--replace`` leaves ``.seed_s.next`` (its checkpoints: ~2 GB at the
    paper's scale); a plain launch says so, with its size and what to do, instead of
    nothing."""
    run_dir = tmp_path / "runs" / "FedAvg" / "seed_0"
    config = _config(data, run_dir)
    _record(config, "finished")
    assert "interrupted replacement" not in plan_launch(config).reason
    staged = staging_dir(run_dir)
    (staged / "checkpoints").mkdir(parents=True)
    (staged / "checkpoints" / "round_0001.pt").write_bytes(bytes(2_000_000))
    plan = plan_launch(config)
    assert plan.action is Action.KEEP
    assert (
        f"an interrupted replacement of it waits in {staged} (2.0 MB): --replace "
        "resumes it, --discard-staged deletes it" in plan.reason
    )


def test_a_run_of_another_configuration_is_refused_naming_directory_keys_and_ways_on(
    data: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs" / "FedAvg" / "seed_0"
    finished = _config(data, run_dir)
    _record(finished, "finished")
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    variation = _config(data, run_dir, rounds=5, sigma=1.0)
    with pytest.raises(RunConflict) as refused:
        plan_launch(variation)
    message = str(refused.value)
    assert str(run_dir) in message and "a finished run" in message
    assert "rounds 3 -> 5" in message and "sigma 1.4 -> 1.0" in message
    assert "--runs" in message and "--replace" in message
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before  # untouched
    plan = plan_launch(variation, replace=True)
    assert (plan.action, plan.work) == (Action.REPLACE, staging_dir(run_dir))

    unfinished = tmp_path / "runs" / "FedAvg" / "seed_1"
    _record(_config(data, unfinished, seed=1), "running")
    with pytest.raises(RunConflict, match="an unfinished run"):
        plan_launch(_config(data, unfinished, seed=1, rounds=5))
    restart = plan_launch(_config(data, unfinished, seed=1, rounds=5), replace=True)
    assert (restart.action, restart.work) == (Action.RESTART, unfinished)
    prepare(restart, _config(data, unfinished, seed=1, rounds=5))
    # started over: nothing of the other run, only the inputs of this launch
    assert [p.name for p in unfinished.iterdir()] == ["inputs.json"]


def test_a_run_whose_configuration_was_not_recorded_is_not_taken_for_this_one(
    data: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs" / "FedAvg" / "seed_0"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("{}\n")  # something, with no record of what
    with pytest.raises(RunConflict, match="whose configuration was not recorded"):
        plan_launch(_config(data, run_dir))


def test_a_run_whose_stores_changed_is_trained_again(data: Path, tmp_path: Path) -> None:
    """Finished: beside it, then swapped in; unfinished: from round 1 (its checkpoints
    were trained on the old stores). The launch records the stores it trains on."""
    finished = tmp_path / "runs" / "FedAvg" / "seed_0"
    unfinished = tmp_path / "runs" / "FedAvg" / "seed_1"
    _record(_config(data, finished), "finished")
    _record(_config(data, unfinished, seed=1), "running")
    write_stores(data, centers=(1,), n_train=41)  # centre 1's store rebuilt, one more patch
    plan = plan_launch(_config(data, finished))
    assert plan.action is Action.REPLACE and "center_1" in plan.reason
    assert "center_0" not in plan.reason
    restart = plan_launch(_config(data, unfinished, seed=1))
    assert restart.action is Action.RESTART and "center_1" in restart.reason
    prepare(restart, _config(data, unfinished, seed=1))
    recorded = json.loads((unfinished / "inputs.json").read_text())
    assert recorded == run_inputs(_config(data, unfinished, seed=1)) == restart.inputs


def test_a_canary_run_is_kept_while_its_plan_is_the_same(data: Path, tmp_path: Path) -> None:
    """A canary plan's path is in the fingerprint and its content in the inputs: the same
    plan keeps the finished run, another plan at the same path trains it again, and a
    run of another configuration is the one a canary launch replaces."""
    plan_file = tmp_path / "canaries.json"
    plan_file.write_text('{"seed": 0}')
    run_dir = tmp_path / "runs" / "canary" / "FedAvg" / "run"
    config = _config(data, run_dir, canaries=plan_file)
    assert not holds_another_configuration(config), "nothing there yet"
    _record(config, "finished")
    assert run_inputs(config)["canaries"].startswith("sha256:")
    assert plan_launch(config).action is Action.KEEP
    assert not holds_another_configuration(config)
    plan_file.write_text('{"seed": 1}')  # a new plan, drawn with another audit.seed
    stale = plan_launch(config)
    assert stale.action is Action.REPLACE and "canaries" in stale.reason
    assert holds_another_configuration(_config(data, run_dir, canaries=plan_file, rounds=5))


def test_the_public_pools_labels_are_never_read(data: Path, tmp_path: Path) -> None:
    """PrivateKT's public store is identified without its labels: a store whose labels
    cannot be read at all (external data in a file that does not exist) still has one."""
    import h5py
    import numpy as np

    path = store_path(data, 4)
    with h5py.File(path, "r+") as h5:
        for split in ("train", "test"):
            n = h5[split]["labels"].shape[0]
            del h5[split]["labels"]
            absent = [(str(tmp_path / "absent.bin"), 0, 8 * n)]
            h5[split].create_dataset("labels", shape=(n,), dtype=np.int64, external=absent)
    config = _config(data, tmp_path / "r", algorithm="PrivateKT", public_pool="center",
                     public_center=4)  # fmt: skip
    assert run_inputs(config)["center_4"].startswith("sha256:")
    with pytest.raises(Exception, match="external"):
        store_digest(path)  # with labels: the read fails, so the line above read none


def test_store_digest_is_the_content_not_the_file(data: Path, tmp_path: Path) -> None:
    first = store_digest(store_path(data, 0))
    copy = write_stores(tmp_path / "copy", centers=(0,))  # the same content, written again
    os.utime(store_path(copy, 0), (0, 0))
    assert store_digest(store_path(copy, 0)) == first
    other_sample = write_stores(tmp_path / "other", centers=(0,), seed=1)  # labels reordered
    assert store_digest(store_path(other_sample, 0)) != first
    smaller = write_stores(tmp_path / "smaller", centers=(0,), n_train=39)
    assert store_digest(store_path(smaller, 0)) != first
    privatekt = _config(data, tmp_path / "r", algorithm="PrivateKT", public_pool="center",
                        public_center=4)  # fmt: skip
    assert set(run_inputs(privatekt)) == {"center_0", "center_1", "center_4"}
    share = _config(data, tmp_path / "r", algorithm="PrivateKT")  # the pool: the clients'
    assert set(run_inputs(share)) == {"center_0", "center_1"}


def test_a_replacement_swaps_in_only_when_finished_and_a_cut_swap_is_completed(
    data: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs" / "FedAvg" / "seed_0"
    _record(_config(data, run_dir), "finished")
    variation = _config(data, run_dir, rounds=5)
    plan = plan_launch(variation, replace=True)
    prepare(plan, variation)
    _record(variation.model_copy(update={"run_dir": plan.work}), "running")  # the job, cut short
    # the finished run is untouched and still what the directory holds
    assert json.loads((run_dir / "run.json").read_text())["fingerprint"]["rounds"] == 3
    # launched again with the same replacement: the staged run resumes, not restarts
    again = plan_launch(variation, replace=True)
    prepare(again, variation)
    assert read_recorded_run(again.work).state is RunState.UNFINISHED
    _record(variation.model_copy(update={"run_dir": again.work}), "finished")
    publish_staged(run_dir)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["fingerprint"]["rounds"] == 5 and run["config"]["run_dir"] == str(run_dir)
    assert json.loads((run_dir / "config.json").read_text())["run_dir"] == str(run_dir)
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["seed_0"]
    # run.json rewritten to name its directory, its digest with it (`make demo` found it)
    assert damaged_files(run_dir) == []
    assert plan_launch(variation).action is Action.KEEP

    # a swap cut between its two renames: the next launch completes it
    newer = _config(data, run_dir, rounds=7)
    plan = plan_launch(newer, replace=True)
    prepare(plan, newer)
    _record(newer.model_copy(update={"run_dir": plan.work}), "finished")
    os.replace(run_dir, run_dir.parent / ".seed_0.old")  # the first rename, then a crash
    assert plan_launch(newer).action is Action.KEEP
    assert json.loads((run_dir / "run.json").read_text())["fingerprint"]["rounds"] == 7
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["seed_0"]

    # a staged run.json damaged before the swap stays damaged after it: no new digest
    plan = plan_launch(variation, replace=True)
    prepare(plan, variation)
    _record(variation.model_copy(update={"run_dir": plan.work}), "finished")
    staged_run = plan.work / "run.json"
    staged_run.write_text(staged_run.read_text().replace('"finished"', '"finished" '))
    publish_staged(run_dir)
    assert [error.path for error in damaged_files(run_dir)] == [run_dir / "run.json"]


def test_fingerprints_ignore_where_and_how_even_when_an_old_record_holds_them() -> None:
    config = TrainConfig(rounds=3, run_dir=Path("a"), data=Path("b"))
    recorded = {**config.fingerprint(), "run_dir": "elsewhere", "out": "elsewhere", "data": "moved"}
    assert fingerprint_changes(recorded, config.fingerprint()) == {}
    assert fingerprint_changes({**recorded, "rounds": 4}, config.fingerprint()) == {
        "rounds": (4, 3)
    }
    assert config.digest() == TrainConfig(rounds=3, device="cpu").digest()
    assert config.digest() != TrainConfig(rounds=4).digest()


def test_a_file_graph_is_fingerprinted_by_its_matrices_not_where_its_file_lies(
    tmp_path: Path,
) -> None:
    """A ``file:`` graph's copy elsewhere (a federation's site writes the job's matrices
    into its own runs folder) is the same configuration; the file edited between two
    attempts is not, and a resume is refused naming it."""
    matrices = [[[0.0, 1.0], [1.0, 0.0]], [[0.25, 0.5], [0.75, 0.5]]]
    here, there = tmp_path / "graph.json", tmp_path / "site" / "copy.json"
    there.parent.mkdir()
    here.write_text(json.dumps({"matrices": matrices}))
    there.write_text(json.dumps(matrices))
    first = TrainConfig(rounds=3, centers=[0, 1], graph=f"file:{here}")
    copy = TrainConfig(rounds=3, centers=[0, 1], graph=f"file:{there}")
    assert first.digest() == copy.digest() and str(tmp_path) not in json.dumps(first.fingerprint())
    recorded = first.fingerprint()
    here.write_text(json.dumps([matrices[1], matrices[0]]))
    edited = TrainConfig(rounds=3, centers=[0, 1], graph=f"file:{here}")
    assert set(fingerprint_changes(recorded, edited.fingerprint())) == {"graph"}


def test_runs_that_evaluated_every_model_each_round_keep_their_fingerprint() -> None:
    """Runs recorded before round_evaluation existed evaluated every model after every
    round: round_evaluation "all" fingerprints as they do, "primary" (the default, other
    metric rows) does not."""
    every_model = TrainConfig(rounds=3, round_evaluation="all")
    recorded_before = every_model.fingerprint()
    assert "round_evaluation" not in recorded_before
    assert fingerprint_changes(recorded_before, every_model.fingerprint()) == {}
    primary = TrainConfig(rounds=3)
    assert primary.round_evaluation == "primary"
    assert fingerprint_changes(recorded_before, primary.fingerprint()) == {
        "round_evaluation": (None, "primary")
    }


def test_a_configuration_written_before_run_dir_was_named_so_still_loads(tmp_path: Path) -> None:
    config = TrainConfig(rounds=3, run_dir=tmp_path / "run", data=tmp_path / "stores")
    former = {("out" if key == "run_dir" else key): value
              for key, value in config.model_dump(mode="json").items()}  # fmt: skip
    assert TrainConfig.model_validate(former) == config
    with pytest.raises(ValueError, match="out"):  # not both names at once
        TrainConfig.model_validate({**former, "run_dir": str(tmp_path / "other")})
