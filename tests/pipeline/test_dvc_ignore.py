"""What varies between clones stays out of DVC's hashes: the stores' freshness records
(``center_{c}.inputs.json``, slide sizes and modification times for the Prefect path) are
left out of ``data/patches``' directory hash by ``.dvcignore``, so the ``dvc.lock`` of a
fresh clone's ``make demo`` is the committed one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.pipeline.conftest import REPO


def _patches_hash(root: Path, files: dict[str, str], env: dict[str, str]) -> str:
    """DVC's hash of a ``data/patches`` folder holding ``files``, in a new project with
    this repository's ``.dvcignore``."""
    root.mkdir(parents=True)
    (root / ".dvcignore").write_text((REPO / ".dvcignore").read_text())
    for command in (["git", "init", "-q"], ["dvc", "init", "-q"]):
        subprocess.run(command, cwd=root, env=env, check=True)
    folder = root / "data" / "patches"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    subprocess.run(["dvc", "add", "-q", "data/patches"], cwd=root, env=env, check=True)
    return yaml.safe_load((root / "data" / "patches.dvc").read_text())["outs"][0]["md5"]


def _record(mtime_ns: int) -> str:
    """A freshness record as wsi.freshness writes it, for slides of this modification time."""
    slides = {"center_0/patient_000/patient_000_node_0.tif": [1234, mtime_ns]}
    return json.dumps({"slides": slides, "store_digest": "ab" * 32})


@pytest.mark.slow
def test_freshness_records_stay_out_of_the_stores_hash(
    tmp_path: Path, tool_env: dict[str, str]
) -> None:
    store = {"center_0.h5": "the store's bytes", "center_0.json": '{"center": 0}'}
    here = _patches_hash(tmp_path / "a", {**store, "center_0.inputs.json": _record(1)}, tool_env)
    clone = _patches_hash(tmp_path / "b", {**store, "center_0.inputs.json": _record(2)},
                          tool_env)  # fmt: skip
    assert here == clone
    # and the hash does see what the stores are: another report is another hash
    changed = {**store, "center_0.json": '{"center": 1}', "center_0.inputs.json": _record(1)}
    other = _patches_hash(tmp_path / "c", changed, tool_env)
    assert other != here
