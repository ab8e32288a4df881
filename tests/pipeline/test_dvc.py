"""`dvc repro` of the real dvc.yaml on tiny parameters: the DAG, the no-op, per-stage reruns."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from tests.pipeline.conftest import dvc_project, tiny_params, write_params


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def project(tmp_path: Path, tool_env: dict[str, str]) -> Path:
    """A git + DVC project holding this repository's code, dvc.yaml and tiny params."""
    return dvc_project(tmp_path / "project", tiny_params(), tool_env)


def _dvc(project: Path, env: dict[str, str], *args: str) -> str:
    result = subprocess.run(["dvc", *args], cwd=project, env=env, capture_output=True,
                            text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, f"dvc {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


@pytest.mark.slow
def test_dvc_repro_builds_everything_then_is_a_no_op(
    project: Path, tool_env: dict[str, str]
) -> None:
    first = subprocess.run(
        ["python", "-m", "flows.server", "--", "dvc", "repro"],
        cwd=project, env=tool_env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert first.returncode == 0, first.stdout[-5000:] + first.stderr[-5000:]
    for stage in ("synth", "preprocess@0", "preprocess@1", "train@ProxyFL-0",
                  "train@Joint-0", "report"):  # fmt: skip
        assert f"Running stage '{stage}'" in first.stdout
    tables = project / "results" / "tables"
    accuracy = (tables / "accuracy.md").read_text()
    assert "| ProxyFL |" in accuracy and "| Joint |" in accuracy
    privacy = (tables / "privacy.csv").read_text().splitlines()
    assert len(privacy) == 1 + 2 + 1  # header, two clients, Joint
    assert (project / "results" / "plots" / "accuracy.png").stat().st_size > 0

    metrics = _dvc(project, tool_env, "metrics", "show", "--json")
    assert "accuracy_mean" in metrics
    _dvc(project, tool_env, "plots", "show", "-o", str(project / "plots-html"))
    assert (project / "plots-html" / "index.html").is_file()

    second = _dvc(project, tool_env, "repro")
    assert "Running stage" not in second and "up to date" in second

    # one centre alone: forced, it rebuilds the same bytes and nothing else runs
    store = project / "data" / "patches" / "center_1.h5"
    before = _sha(store)
    forced = _dvc(project, tool_env, "repro", "--force", "--single-item", "preprocess@1")
    assert "Running stage 'preprocess@1'" in forced
    assert forced.count("Running stage") == 1
    assert _sha(store) == before
    assert "up to date" in _dvc(project, tool_env, "status")

    # one slide, as the README has it: redo, then record the rebuilt store
    redo = subprocess.run(
        ["python", "-m", "flows.preprocess", "--centers", "1",
         "--redo-slides", "patient_020_node_0"],
        cwd=project, env=tool_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert redo.returncode == 0, redo.stdout[-3000:] + redo.stderr[-3000:]
    assert "redo patient_020_node_0: removed" in redo.stdout + redo.stderr
    _dvc(project, tool_env, "commit", "--force", "preprocess@1")
    assert _sha(store) == before
    assert "up to date" in _dvc(project, tool_env, "status")

    # a training option makes the training stages stale, not the preprocessing ones
    params = json.loads(json.dumps(tiny_params()))
    params["train"]["options"]["rounds"] = 2
    write_params(project / "params.yaml", params)
    stale = _dvc(project, tool_env, "status")
    assert "train@ProxyFL-0" in stale and "train@Joint-0" in stale
    assert "preprocess@" not in stale and "synth" not in stale
