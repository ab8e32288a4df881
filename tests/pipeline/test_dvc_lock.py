"""The committed dvc.lock records this tree: every stage's command, code and parameters as
they are now, so that a fresh clone's ``make demo`` writes the same lock.

What a stage reads from other stages (slides, stores, runs) is not here on a fresh clone
and is left to ``dvc repro``; everything else a stage depends on is this tree's, and a
change to it that the lock does not record is drift: after changing the code a stage runs
or a parameter it reads, run ``make demo`` and commit its dvc.lock.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.pipeline.conftest import BIN, REPO


def _produced_paths() -> list[str]:
    """Every output path the lock records: what stages make, not what the tree holds."""
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())
    return [out["path"] for stage in lock["stages"].values() for out in stage.get("outs", [])]


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _produced(path: str, outputs: list[str]) -> bool:
    """``path`` is an output, inside one, or a folder of outputs (``runs``)."""
    return any(_within(path, out) or _within(out, path) for out in outputs)


def _drift(status: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
    """What ``dvc status`` finds changed in each stage besides other stages' outputs."""
    drift: dict[str, Any] = {}
    for stage, changes in status.items():
        for change in changes:
            if not isinstance(change, dict):  # "always changed", "changed checksum"
                drift.setdefault(stage, []).append(change)
                continue
            for kind, entries in change.items():
                if kind == "changed outs":
                    continue  # made by dvc repro; not on a fresh clone
                if kind == "changed deps":
                    entries = {p: s for p, s in entries.items() if not _produced(p, outputs)}
                if entries:
                    drift.setdefault(stage, []).append({kind: entries})
    return drift


def test_the_committed_lock_records_this_trees_commands_code_and_parameters() -> None:
    status = subprocess.run(
        [str(BIN / "dvc"), "status", "--json"], cwd=REPO, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    found = json.loads(status.stdout or "{}")
    outputs = _produced_paths()
    assert outputs, "the lock records the stages' outputs"
    drift = _drift(found, outputs)
    assert not drift, (
        "dvc.lock does not record this tree (run `make demo` and commit its dvc.lock):\n"
        + json.dumps(drift, indent=1)
    )


def test_drift_is_what_the_tree_changed_not_what_repro_makes() -> None:
    """The filter keeps a changed code file, parameter or command and drops the stages'
    own outputs and inputs made by other stages."""
    outputs = ["data/synthetic", "data/patches/center_0.h5", "runs/ProxyFL/seed_0"]
    status = {
        "preprocess@0": [
            {"changed deps": {"data/synthetic/center_0": "deleted", "wsi/center.py": "modified"}},
            {"changed outs": {"data/patches/center_0.h5": "not in cache"}},
        ],
        "report": [{"changed deps": {"runs": "deleted", "analysis/report/html.py": "deleted"}}],
        "train@ProxyFL-0": [{"changed params": {"train.options": "modified"}}],
        "synth": ["changed command"],
    }
    assert _drift(status, outputs) == {
        "preprocess@0": [{"changed deps": {"wsi/center.py": "modified"}}],
        "report": [{"changed deps": {"analysis/report/html.py": "deleted"}}],
        "train@ProxyFL-0": [{"changed params": {"train.options": "modified"}}],
        "synth": ["changed command"],
    }


# the data stages' outputs are promised the same bytes on any machine (integer and seeded
# arithmetic, no kernel-dependent float reductions): docs/reproducibility.md
@pytest.mark.slow
def test_a_fresh_clone_builds_the_data_the_committed_lock_records(
    tmp_path: Path, tool_env: dict[str, str]
) -> None:
    """The outputs, not only the inputs: a fresh clone of this repository's commit writes
    centre 0's synthetic slides and its store with the hashes, sizes and file counts its
    committed dvc.lock records, the directory hashes included (which a freshness record
    holding clone-specific times once broke).

    Centre 0 stands for the five: each centre's slides are drawn from its own seed, so the
    synth stage's command with ``--centers 0`` in place of ``--num-centers`` writes centre
    0's 25 slides as the stage writes them among its 125 (a fifth of the stage's ~235 s of
    CPU on the slower machine kind), and ``preprocess@0`` alone (``dvc repro
    --single-item``, on them) records their directory's hash beside its store's. Its
    annotations and stage labels are centre 0's alone, not the stage's whole files: what
    they give the store (the patches' labels and places) is in the store's bytes."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=300)
    committed = yaml.safe_load((clone / "dvc.lock").read_text())["stages"]
    synth, replaced = re.subn(r"--num-centers \d+", "--centers 0", committed["synth"]["cmd"])
    assert replaced == 1, committed["synth"]["cmd"]
    slides = subprocess.run(["bash", "-c", synth], cwd=clone, env=tool_env,
                            capture_output=True, text=True, timeout=900)  # fmt: skip
    assert slides.returncode == 0, slides.stdout[-4000:] + slides.stderr[-4000:]
    built = subprocess.run(
        ["python", "-m", "flows.server", "--", "dvc", "repro", "--single-item", "preprocess@0"],
        cwd=clone, env=tool_env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    stages = sorted(set(re.findall(r"Running stage '([^']+)'", built.stdout)))
    assert stages == ["preprocess@0"], built.stdout[-4000:]
    produced = yaml.safe_load((clone / "dvc.lock").read_text())["stages"]["preprocess@0"]

    def slides_of_centre_0(stage: dict[str, Any]) -> list[dict[str, Any]]:
        return [dep for dep in stage["deps"] if dep["path"] == "data/synthetic/center_0"]

    assert slides_of_centre_0(produced) == slides_of_centre_0(committed["preprocess@0"]) != []
    assert produced["outs"] == committed["preprocess@0"]["outs"]
