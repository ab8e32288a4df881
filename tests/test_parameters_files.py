"""Every command reads the parameters file the same way: bad files exit 2, naming the file,
the key and the reason, before anything runs; flags override keys; help shows each value."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from flows.pipeline import main as pipeline_main
from flows.preprocess import main as preprocess_main
from flows.report import main as report_main
from flows.train import main as train_main
from plumbing.cli import ConfigError
from proxyfl.run import parse_config

REPO = Path(__file__).resolve().parents[1]
DEMO = (REPO / "params.yaml").read_text()

# (name, how the demo's file is broken, what the message must say)
BAD_FILES: list[tuple[str, Callable[[str], str], tuple[str, ...]]] = [
    ("not YAML", lambda t: t.replace("train:\n", "train:\n  - x\n : y\n", 1),
     ("not valid YAML", "line ")),
    ("unknown section", lambda t: t.replace("preprocess:\n", "preprocesss:\n", 1),
     ("preprocesss: unknown key", "known: data, preprocess, train, report")),
    ("unknown key under data", lambda t: t.replace("  root: data/synthetic", "  rooot: x"),
     ("data.rooot: unknown key",)),
    ("unknown training option", lambda t: t.replace("rounds: 10", "roundz: 10"),
     ("train.options.roundz: unknown key",)),
    ("wrong type", lambda t: t.replace("rounds: 10", "rounds: ten"),
     ("train.options.rounds", "valid integer", "'ten'")),
    ("not a mapping", lambda t: "- a\n- b\n", ("must hold a mapping",)),
]  # fmt: skip
COMMANDS = {
    "preprocess": preprocess_main,
    "train": train_main,
    "report": report_main,
    "pipeline": pipeline_main,
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("case", "break_file", "expected"), BAD_FILES, ids=[case[0] for case in BAD_FILES]
)
def test_a_bad_parameters_file_exits_2_naming_file_and_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    case: str,
    break_file: Callable[[str], str],
    expected: tuple[str, ...],
) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(break_file(DEMO))
    runs = tmp_path / "runs"
    assert COMMANDS[command](["--config", str(params)]) == 2
    error = capsys.readouterr().err
    assert f"error: invalid parameters: {params}: " in error
    for text in expected:
        assert text in error, error
    assert "Traceback" not in error and not runs.exists()


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


def test_the_training_job_takes_train_options_from_a_parameters_file(tmp_path: Path) -> None:
    """``proxyfl.run --config params.yaml`` trains with ``train.options`` (it used to drop
    the nested section and train with the paper's 30 rounds at batch 32)."""
    params = tmp_path / "params.yaml"
    demo = DEMO.replace("rounds: 10", "rounds: 4").replace("batch_size: 32", "batch_size: 8")
    params.write_text(demo)
    config = parse_config(["--config", str(params), "--out", str(tmp_path / "run"),
                           "--algorithm", "fedavg", "--lr", "0.5"])  # fmt: skip
    assert (config.rounds, config.batch_size, config.lr) == (4, 8, 0.5)
    assert config.private_model == ["cnn2"] and config.proxy_model == "cnn1"
    assert config.centers == [0, 1, 2, 3] and config.data == Path("data/patches")
    assert config.algorithm == "FedAvg"
    for case, break_file, expected in BAD_FILES:
        params.write_text(break_file(DEMO))
        with pytest.raises(ConfigError) as caught:
            parse_config(["--config", str(params), "--out", str(tmp_path / "run")])
        assert str(params) in str(caught.value) and expected[0] in str(caught.value), case


def test_a_job_configuration_file_round_trips(tmp_path: Path) -> None:
    from proxyfl.config import TrainConfig
    from proxyfl.launch import TrainingJob

    config = TrainConfig(algorithm="CWT", seed=3, data=tmp_path / "d", out=tmp_path / "run",
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


def test_the_console_command_runs_every_subcommand() -> None:
    from camelyon_proxyfl.cli import COMMANDS as SUBCOMMANDS

    for name in SUBCOMMANDS:
        result = subprocess.run([sys.executable, "-m", "camelyon_proxyfl.cli", name, "--help"],
                                cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert result.returncode == 0 and "usage:" in result.stdout, (name, result.stderr)
    unknown = subprocess.run([sys.executable, "-m", "camelyon_proxyfl.cli", "trian"],
                             cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert unknown.returncode == 2 and "unknown command 'trian'" in unknown.stderr
