"""Every command reads the parameters file the same way: bad files exit 2, naming the file,
the key and the reason, before anything runs; flags override keys; help shows each value."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from flows.audit import main as audit_main
from flows.audit import parse_config as audit_parse
from flows.canary import main as canary_main
from flows.canary import parse_config as canary_parse
from flows.pipeline import main as pipeline_main
from flows.preprocess import main as preprocess_main
from flows.preprocess import parse_config as preprocess_parse
from flows.report import main as report_main
from flows.report import parse_config as report_parse
from flows.stage import main as stage_main
from flows.stage import parse_config as stage_parse
from flows.train import main as train_main
from flows.train import parse_config as train_parse
from plumbing.cli import ConfigError
from proxyfl.run import parse_config

REPO = Path(__file__).resolve().parents[1]
DEMO = (REPO / "params.yaml").read_text()

# (name, how the demo's file is broken, the section broken (None: the whole file), what the
# message must say)
BAD_FILES: list[tuple[str, Callable[[str], str], str | None, tuple[str, ...]]] = [
    ("not YAML", lambda t: t.replace("train:\n", "train:\n  - x\n : y\n", 1), None,
     ("not valid YAML", "line ")),
    ("unknown section", lambda t: t.replace("preprocess:\n", "preprocesss:\n", 1), None,
     ("preprocesss: unknown key", "known: data, preprocess, train, audit, stage, report")),
    ("unknown key under data", lambda t: t.replace("  root: data/synthetic", "  rooot: x"),
     "data", ("data.rooot: unknown key",)),
    ("unknown training option", lambda t: t.replace("rounds: 10", "roundz: 10"), "train",
     ("train.options.roundz: unknown key",)),
    ("wrong type", lambda t: t.replace("rounds: 10", "rounds: ten"), "train",
     ("train.options.rounds", "valid integer", "'ten'")),
    ("not a mapping", lambda t: "- a\n- b\n", None, ("must hold a mapping",)),
    ("unknown audit key", lambda t: t.replace("  bootstrap: 1000", "  bootstrapp: 1000", 1),
     "audit", ("audit.bootstrapp: unknown key",)),
    ("odd reference models", lambda t: t.replace("reference_models: 2 ", "reference_models: 3 "),
     "audit", ("audit.reference_models", "pairs")),
    ("crossed node thresholds", lambda t: t.replace("itc_max_um: 200.0", "itc_max_um: 3000.0"),
     "stage", ("stage", "itc_max_um < macro_min_um")),
    ("renamed key", lambda t: t.replace("    loader_workers: 0 ", "    workers: 0 "), "train",
     ("train.options.workers: renamed train.options.loader_workers", "rename the key")),
    # YAML keeps the last of two keys, DVC refuses the file: either way not what was meant
    ("key given twice", lambda t: t.replace("    rounds: 10", "    rounds: 10\n    rounds: 2"),
     None, ("not valid YAML (line ", "key 'rounds' is given twice in one mapping (first on "
            "line ")),
    ("a boolean for a number", lambda t: t.replace("rounds: 10", "rounds: yes"), "train",
     ("train.options.rounds: a YAML boolean", "write the number")),
    ("a boolean in a list of numbers", lambda t: t.replace("  seeds:\n  - 0\n", "  seeds:\n"
     "  - on\n"), "train", ("train.seeds: item [0] is a YAML boolean",)),
    ("a boolean for a centre's count", lambda t: t.replace("    2: 300\n", "    2: yes\n", 1),
     "preprocess", ("preprocess.patches_per_class: item [2] is a YAML boolean",)),
    ("a seed twice", lambda t: t.replace("  seeds:\n  - 0\n", "  seeds:\n  - 0\n  - 0\n"),
     "train", ("train.seeds: seed(s) 0 listed more than once",)),
    ("no seed", lambda t: t.replace("  seeds:\n  - 0\n", "  seeds: []\n"), "train",
     ("train.seeds: no seeds: list at least one",)),
    ("a method twice", lambda t: t.replace("  - Joint\n", "  - Joint\n  - Joint\n", 1), "train",
     ("train.algorithms: algorithm(s) Joint listed more than once",)),
    ("a centre built twice", lambda t: t.replace("  - 4\n", "  - 4\n  - 4\n", 1),
     "preprocess", ("preprocess.centers: centre(s) 4 listed more than once",)),
    # a job's own checks (proxyfl.config.TrainConfig) name the file's keys, not its fields
    ("a job's option", lambda t: t.replace("graph: exponential", "graph: ring"), "train",
     ("train.options.graph: unknown graph 'ring'",)),
    ("a job's flag", lambda t: t.replace("    - cnn2\n", "    - cnn2\n    - cnn1\n"), "train",
     ("train: train.options.private_model (--private-model) lists 2 models for 4 centres",)),
]  # fmt: skip
COMMANDS = {
    "preprocess": preprocess_main,
    "train": train_main,
    "audit": audit_main,
    "canary": lambda argv: canary_main([*argv, "ProxyFL"]),
    "stage": stage_main,
    "report": report_main,
    "pipeline": pipeline_main,
}
# the sections each command validates (its stage's own: camelyon_proxyfl.params.base)
READS = {
    "preprocess": {"data", "preprocess"},
    "train": {"train"},
    "audit": {"train", "audit"},
    "canary": {"train", "audit"},
    "stage": {"data", "preprocess", "train", "stage"},
    "report": {"train", "audit", "stage", "report"},
    "pipeline": {"data", "preprocess", "train", "audit", "stage", "report"},
}
PARSERS = {
    "preprocess": preprocess_parse,
    "train": train_parse,
    "audit": audit_parse,
    "canary": lambda argv: canary_parse([*argv, "ProxyFL"]),
    "stage": stage_parse,
    "report": report_parse,
}  # the pipeline reads every section; the canary run the audit's
FAILING = [(command, case) for case in BAD_FILES for command in sorted(COMMANDS)
           if case[2] is None or case[2] in READS[command]]  # fmt: skip
UNREAD = [(command, case) for case in BAD_FILES for command in sorted(COMMANDS)
          if case[2] is not None and case[2] not in READS[command]]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "bad"), FAILING, ids=[f"{command}-{bad[0]}" for command, bad in FAILING]
)
def test_a_bad_parameters_file_exits_2_naming_file_and_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    bad: tuple[str, Callable[[str], str], str | None, tuple[str, ...]],
) -> None:
    _, break_file, _, expected = bad
    params = tmp_path / "params.yaml"
    broken = break_file(DEMO)
    # a case whose text params.yaml no longer holds would run the command for real, in
    # this repository (the file's relative paths): hours of CPU and outputs in the tree
    assert broken != DEMO, "the case no longer changes params.yaml: update its replace()"
    params.write_text(broken)
    runs = tmp_path / "runs"
    assert COMMANDS[command](["--config", str(params)]) == 2
    error = capsys.readouterr().err
    assert f"error: invalid parameters: {params}: " in error
    for text in expected:
        assert text in error, error
    assert "Traceback" not in error and not runs.exists()


@pytest.mark.parametrize(
    ("command", "bad"), UNREAD, ids=[f"{command}-{bad[0]}" for command, bad in UNREAD]
)
def test_a_command_does_not_read_the_sections_of_other_stages(
    tmp_path: Path,
    command: str,
    bad: tuple[str, Callable[[str], str], str | None, tuple[str, ...]],
) -> None:
    """A broken section another stage reads does not stop this stage: preprocessing does
    not validate (or import the code of) the training options, nor training the data's."""
    _, break_file, section, _ = bad
    params = tmp_path / "params.yaml"
    broken = break_file(DEMO)
    assert broken != DEMO, "the case no longer changes params.yaml: update its replace()"
    params.write_text(broken)
    parsed = PARSERS[command](["--config", str(params)])
    config = parsed[0] if isinstance(parsed, tuple) else parsed
    assert config is not None and section not in READS[command]


def test_a_bad_flag_value_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(DEMO)
    assert preprocess_main(["--config", str(params), "--patch-size", "3"]) == 2
    error = capsys.readouterr().err
    assert "preprocess.patch_size (--patch-size): Input should be greater than or equal" in error
    # the file is not blamed for what a flag gave, an item of a list flag included
    assert f"{params}:" not in error and "invalid parameters: command line: " in error
    assert COMMANDS["train"](["--config", str(params), "--algorithms", "ProxyFL", "Foo"]) == 2
    error = capsys.readouterr().err
    assert "invalid parameters: command line: train.algorithms.1 (--algorithms): " in error
    assert "got 'Foo'" in error and f"{params}:" not in error


def test_the_training_job_refuses_a_parameters_file(tmp_path: Path) -> None:
    """``proxyfl.run --config`` takes a job's ``config.json`` only: a parameters file's
    ``train:`` section becomes a job's configuration in one place, ``flows.train``."""
    params = tmp_path / "params.yaml"
    params.write_text(DEMO)
    with pytest.raises(ConfigError) as caught:
        parse_config(["--config", str(params), "--run-dir", str(tmp_path / "run")])
    message = str(caught.value)
    assert str(params) in message and "python -m flows.train --config" in message


def test_a_job_configuration_file_round_trips(tmp_path: Path) -> None:
    from proxyfl.config import TrainConfig
    from proxyfl.launch.job import TrainingJob

    config = TrainConfig(algorithm="CWT", seed=3, data=tmp_path / "d", run_dir=tmp_path / "run",
                         centers=[2, 0], rounds=2, private_model=["mlp"])  # fmt: skip
    job = TrainingJob(config)
    job.write_config()
    assert job.arguments() == ["--config", str(tmp_path / "run" / "config.json")]
    assert parse_config(job.arguments()) == config


@pytest.mark.parametrize(
    "module",
    ["flows.preprocess", "flows.train", "flows.report", "flows.pipeline", "proxyfl.run",
     "proxyfl.privacy", "wsi.tile", "wsi.synth"],
)  # fmt: skip
def test_help_shows_each_value_once_and_no_internals(module: str) -> None:
    result = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "PydanticUndefined" not in text and "(default: None)" not in text
    assert "default: params.yaml, else" not in text
    # argparse's own formatting never leaks: a bare % in a help text printed the action
    assert "'option_strings'" not in text and "%(" not in text and "%%" not in text


@pytest.mark.slow
def test_the_console_command_runs_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    """Every subcommand's --help with no argparse leak: in this process (one import of each
    module, not a Python start each), and through the console entry in a process for the
    rank's command (its main starts MPI) and an unknown one."""
    from camelyon_proxyfl.cli import COMMANDS as SUBCOMMANDS
    from camelyon_proxyfl.cli import main

    for name in SUBCOMMANDS.keys() - {"job"}:  # job: a rank, whose main starts MPI first
        with pytest.raises(SystemExit) as helped:
            main([name, "--help"])
        shown = capsys.readouterr().out
        assert helped.value.code == 0 and shown.startswith("usage:"), name
        assert "'option_strings'" not in shown and "%(" not in shown, name
    unknown = subprocess.run([sys.executable, "-m", "camelyon_proxyfl.cli", "trian"],
                             cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert unknown.returncode == 2 and "unknown command 'trian'" in unknown.stderr
    helped = subprocess.run([sys.executable, "-m", "camelyon_proxyfl.cli", "job", "--help"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert helped.returncode == 0 and helped.stdout.startswith("usage:"), helped.stderr
    assert "'option_strings'" not in helped.stdout and "%(" not in helped.stdout


def _with_train_keys(tmp_path: Path, **keys: str) -> Path:
    """The demo's parameters file with ``train:`` keys of the placement replaced."""
    text = DEMO
    for key, value in keys.items():
        line = next(line for line in text.splitlines() if line.startswith(f"  {key}:"))
        text = text.replace(line, f"  {key}: {value}", 1)
    params = tmp_path / "params.yaml"
    params.write_text(text)
    return params


def test_a_hostfile_that_is_not_there_stops_a_launch_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``train.hostfile`` missing, or naming no host: the training launch and the canary run
    exit 2 before any server or job starts, naming the key, the file and why."""
    # the demo's relative paths (data/patches, runs) under an empty folder: after a `make
    # demo` in this checkout its finished runs would be kept, and the launch exit 0
    monkeypatch.chdir(tmp_path)
    hostfile = tmp_path / "hosts.txt"
    params = _with_train_keys(tmp_path, hostfile=str(hostfile))
    assert train_main(["--config", str(params)]) == 2
    error = capsys.readouterr().err
    assert f"error: train.hostfile: {hostfile}: no such file (hydra's mpiexec -f" in error
    with pytest.raises(SystemExit) as canary:
        canary_main(["--config", str(params), "ProxyFL"])
    assert canary.value.code == 2
    assert f"train.hostfile: {hostfile}: no such file" in capsys.readouterr().err
    hostfile.write_text("# the hosts, one a line\n\n")
    assert train_main(["--config", str(params)]) == 2
    assert f"train.hostfile: {hostfile}: names no host" in capsys.readouterr().err
    # hosts hydra starts without ssh (this machine's names): not asked whether they answer
    hostfile.write_text("localhost:2  # two ranks\n127.0.0.1:2\n")
    assert train_main(["--config", str(params)]) == 2  # the demo's stores are not built here
    assert "train.hostfile" not in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


# command -> (the key of the folder it writes, set to read-only/FOLDER; the words after it)
READ_ONLY = {
    "flows.train": ("train.runs", "every launch writes its runs there, even one that keeps "
                    "a finished run (its lock file)"),
    "flows.preprocess": ("preprocess.out", "the centre stores are written there"),
    "flows.pipeline": ("preprocess.cache_dir", "each slide's candidates are cached there"),
}  # fmt: skip


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mount namespaces")
@pytest.mark.parametrize("command", sorted(READ_ONLY))
def test_a_read_only_output_folder_stops_a_command_before_anything_starts(
    tmp_path: Path, command: str
) -> None:
    """A folder the command writes on a read-only file system (a real one: a read-only tmpfs
    in a mount namespace of this user's): it exits 2 at its checks, naming the key, the
    folder and what to do, instead of failing on its lock file, its first store or cache
    entry once its server (and ranks) have started."""
    import yaml

    key, writes = READ_ONLY[command]
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    folder = read_only / "folder"
    params = yaml.safe_load(DEMO)
    section, name = key.split(".")
    params[section][name] = str(folder)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    probe = tmp_path / "probe.py"
    probe.write_text(f"import sys\nfrom {command} import main\nsys.exit(main(['--config', "
                     f"{str(tmp_path / 'params.yaml')!r}]))\n")  # fmt: skip
    mount = f"mount -t tmpfs -o ro tmpfs {shlex.quote(str(read_only))}"
    try:  # user and mount namespaces, which some machines do not allow
        subprocess.run(["unshare", "-rm", "sh", "-c", mount], check=True, capture_output=True,
                       timeout=60)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as error:
        pytest.skip(f"cannot mount a read-only file system in a namespace here: {error}")
    script = f"{mount} && exec {shlex.quote(sys.executable)} {shlex.quote(str(probe))}"
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=tmp_path, text=True,
                          capture_output=True, timeout=300, env={**os.environ,
                          "PYTHONPATH": str(REPO)})  # fmt: skip
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    output = done.stdout + done.stderr
    assert (f"{key}: {folder}: cannot be written ({read_only} is read-only, or not yours): "
            f"{writes}") in output, output[-2000:]  # fmt: skip
    assert "Traceback" not in output and "Prefect server" not in output


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"hosts": "[node-a, node-b]", "hostfile": "hosts.txt"},
         "train: hosts and hostfile are both set"),
        ({"launcher": "srun", "hosts": "[node-a]"},
         "train: launcher srun runs the ranks where Slurm's allocation says: hosts must be "
         "left unset"),
        ({"launcher": "srun", "hostfile": "hosts.txt"},
         "train: launcher srun runs the ranks where Slurm's allocation says: hostfile must "
         "be left unset"),
        ({"launcher": "slurm"}, "train.launcher: Input should be 'mpiexec', 'srun' or 'flare'"),
        ({"launcher": "flare", "hosts": "[node-a]"},
         "train: launcher flare runs the ranks as FLARE sites of this machine: hosts must be "
         "left unset"),
    ],
)  # fmt: skip
def test_a_placement_of_two_minds_is_a_bad_parameters_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keys: dict[str, str], expected: str
) -> None:
    params = _with_train_keys(tmp_path, **keys)
    assert train_main(["--config", str(params)]) == 2
    error = capsys.readouterr().err
    assert f"error: invalid parameters: {params}: {expected}" in error, error


def test_srun_where_there_is_none_stops_a_launch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Slurm here: ``train.launcher: srun`` is refused before any job, saying where srun
    runs (this is the check, not a run of srun)."""
    monkeypatch.setenv("PATH", str(tmp_path))  # for a machine that had Slurm's commands
    params = _with_train_keys(tmp_path, launcher="srun")
    assert train_main(["--config", str(params)]) == 2
    assert "train.launcher: srun is not on PATH" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_a_command_started_below_the_project_reads_the_projects_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """From ``results/`` (or deeper) a command finds the folder holding params.yaml, as git
    and DVC find theirs, and reads it as it does from there."""
    project = tmp_path / "project"
    (project / "results" / "tables").mkdir(parents=True)
    (project / "params.yaml").write_text(DEMO)
    monkeypatch.chdir(project)
    at_root = PARSERS[command]([])
    monkeypatch.chdir(project / "results" / "tables")
    assert PARSERS[command]([]) == at_root
    assert Path.cwd() == project  # where its relative paths (runs/, data/) are


def test_a_path_typed_below_the_project_is_of_the_folder_it_was_typed_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    (project / "results").mkdir(parents=True)
    (project / "params.yaml").write_text(DEMO)
    monkeypatch.chdir(project / "results")
    config = report_parse(["--out", "elsewhere", "--runs", str(tmp_path / "runs")])
    assert config.out == project / "results" / "elsewhere"
    assert config.runs == tmp_path / "runs"  # absolute: as typed


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_folder_named_params_yaml_is_said_to_be_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:  # fmt: skip
    (tmp_path / "params.yaml").mkdir()
    (tmp_path / "results").mkdir()
    monkeypatch.chdir(tmp_path / "results")
    assert COMMANDS[command]([]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert said == ["error: invalid parameters: params.yaml: is a folder, not a parameters file"]


def test_the_synthetic_dataset_must_hold_the_centres_preprocessing_builds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(DEMO.replace("    num_centers: 5 ", "    num_centers: 3 ", 1))
    # the preprocess stage's view of the file (dvc.yaml's preprocess@c), and the whole file's
    for main, extra in ((preprocess_main, []), (pipeline_main, ["--check"])):
        assert main(["--config", str(params), *extra]) == 2
        error = capsys.readouterr().err
        assert ("preprocess.centers: [3, 4] are not centres of the synthetic dataset, which "
                "data.synth.num_centers (3) makes centres 0 to 2") in error  # fmt: skip
    assert not (tmp_path / "data").exists()


def test_a_merge_key_is_yaml_of_its_own_not_a_key_given_twice(tmp_path: Path) -> None:
    """``<<: *anchor`` merges a mapping whose keys the mapping may override (YAML's merge
    key, which DVC reads so too): no key is given twice there."""
    from plumbing.cli import read_yaml

    params = tmp_path / "params.yaml"
    params.write_text("common: &common\n  rounds: 3\n  lr: 0.1\n"
                      "options:\n  <<: *common\n  rounds: 4\n")  # fmt: skip
    assert read_yaml(params)["options"] == {"rounds": 4, "lr": 0.1}


def test_on_and_off_are_words_where_the_words_are_on_and_off() -> None:
    """YAML 1.1 reads ``compile: off`` as false: where on and off are the field's words,
    that is the word written; where a boolean is no value, it is refused."""
    from proxyfl.config import TrainOptions

    assert TrainOptions.model_validate({"compile": False}).compile == "off"
    assert TrainOptions.model_validate({"compile": True}).compile == "on"
    assert TrainOptions.model_validate({"deterministic": False}).deterministic is False
    for key in ("dp_engine", "sigma", "input_size", "private_model"):
        with pytest.raises(ValueError, match="a YAML boolean"):
            TrainOptions.model_validate({key: True})


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_outside_any_project_a_command_says_where_it_looked_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert COMMANDS[command]([]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1, said
    assert str(tmp_path) in said[0] and "no params.yaml here nor in any folder above" in said[0]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()
