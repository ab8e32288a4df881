"""Tiny parameter files for end-to-end runs: the demo's params.yaml with small numbers."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import prefect_home_from

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def tiny_params(**paths: Any) -> dict[str, Any]:
    """params.yaml with two centres, small patches, two quick methods and one round; one
    worker for the slides, the stores and the reference models, which is no pool: each
    command does that work in its own process (the pools' own tests run two:
    tests/flows/test_preprocess_runner.py, tests/wsi/test_synth.py,
    tests/analysis/test_audit_workers.py). At this size a worker process costs more than
    it saves: each spawned one imports Prefect or torch again, 2-6 s of CPU under coverage."""
    params = copy.deepcopy(yaml.safe_load((REPO / "params.yaml").read_text()))
    params["data"]["synth"].update(
        {"patients_per_center": 2, "num_centers": 2, "width": 3072, "height": 2048, "seed": 8,
         "workers": 1}
    )  # fmt: skip
    params["preprocess"].update(
        {
            "centers": [0, 1],
            "patch_size": 128,
            "level": 0,
            "workers": 1,
            "patches_per_class": {0: 6, 1: 6},
        }  # one per centre, as dvc.yaml reads it
    )
    params["train"].update({"algorithms": ["ProxyFL", "Joint"], "seeds": [0], "centers": [0, 1]})
    params["train"]["options"].update(
        {"rounds": 1, "batch_size": 4, "proxy_model": "cnn1", "private_model": ["mlp"],
         "input_size": 16, "device": "cpu"}
    )  # fmt: skip
    params["audit"].update({"reference_models": 2, "bootstrap": 20, "workers": 1})
    params["audit"]["canary"].update({"count": 4, "guesses": [1, 2]})
    for dotted, value in paths.items():
        section, key = dotted.split("__")
        params[section][key] = str(value)
    return params


def tiny_params_under(directory: Path, data_root: Path) -> dict[str, Any]:
    """:func:`tiny_params` on ``data_root`` with every output under ``directory``."""
    return tiny_params(
        data__root=data_root,
        preprocess__out=directory / "patches",
        preprocess__cache_dir=directory / "cache",
        train__data=directory / "patches",
        train__runs=directory / "runs",
        audit__out=directory / "results" / "audit.json",
        audit__canary_runs=directory / "runs" / "canary",
        stage__out=directory / "staging",
        stage__summary=directory / "results" / "staging.json",
        report__out=directory / "results",
    )


CODE = ("analysis", "camelyon_proxyfl", "flows", "plumbing", "proxyfl", "tasks", "wsi")


def dvc_project(root: Path, params: dict[str, Any], env: dict[str, str]) -> Path:
    """A git + DVC project at ``root`` holding this repository's code, its dvc.yaml and
    ``params`` as params.yaml."""
    root.mkdir(parents=True)
    for name in CODE:  # with its bytecode (make's `bytecode`): copied with the sources'
        # times, it stays valid, and the project's processes do not compile the code again;
        # not the temporary file of a .pyc being written (renamed away while copied)
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("*.pyc.*"))
    for name in ("dvc.yaml", ".dvcignore", ".gitignore"):
        shutil.copy(REPO / name, root / name)
    write_params(root / "params.yaml", params)
    for command in (["git", "init", "-q"], ["dvc", "init", "-q"]):
        subprocess.run(command, cwd=root, env=env, check=True)
    return root


def write_params(path: Path, params: dict[str, Any]) -> Path:
    """``params`` as YAML in the style of ``dvc exp run -S`` (as params.yaml is written)."""
    from dvc.utils.serialize import dump_yaml

    dump_yaml(path, params)
    return path


def tool_environment(prefect_home: Path) -> dict[str, str]:
    """The environment a user's shell has after `source .venv/bin/activate`, with a
    Prefect home of its own."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update({"DO_NOT_TRACK": "1", "DVC_NO_ANALYTICS": "1",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
                "PREFECT_HOME": str(prefect_home),
                "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    # DVC runs stage commands with `$SHELL -c`, else /bin/sh: test with /bin/sh (dash on
    # Debian, which forks a command that bash would exec), as on a machine with no SHELL
    env["SHELL"] = "/bin/sh"
    return env


@pytest.fixture()
def tool_env(tmp_path: Path, prefect_home_template: Path) -> dict[str, str]:
    """:func:`tool_environment`, its Prefect home the test's own (migrated: a copy of the
    run's template)."""
    return tool_environment(prefect_home_from(prefect_home_template, tmp_path / "prefect-home"))


def processes_of(project: Path) -> list[str]:
    """Command lines of the live processes that belong to ``project``'s run."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        command = " ".join(part.decode(errors="replace") for part in argv if part)
        if (cwd.startswith(str(project)) or str(project) in command) and command:
            found.append(f"{entry.name}: {command[:200]}")
    return found
