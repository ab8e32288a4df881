"""Faults of the bad-input campaign, each recorded where the user looks (``failures.json``,
the centre's report, the exit code) while the rest of the run finishes."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from flows.preprocess import main
from wsi.catalogue import scan_camelyon
from wsi.store.reader import read_store_info
from wsi.store.schema import store_path
from wsi.store.space import free_bytes
from wsi.synth import SynthManifest

REPO = Path(__file__).resolve().parents[2]


def _run(root: Path, out: Path, *extra: str) -> int:
    return main(
        [
            *("--config", str(REPO / "params.yaml"), "--data-root", str(root)),
            *("--out", str(out), "--cache-dir", str(out.parent / "cache")),
            *("--centers", "0", "1", "--patch-size", "128", "--level", "0", "--workers", "1"),
            *extra,
        ]
    )


def test_every_fault_is_recorded_and_a_failed_centre_leaves_nothing_stale(
    synthetic_dataset: SynthManifest, tmp_path: Path, capsys
) -> None:
    root = tmp_path / "data"
    shutil.copytree(synthetic_dataset.root, root)
    with (root / "stage_labels.csv").open("a", newline="") as labels:
        csv.writer(labels).writerow(["patient_000_node_9.tif", "negative"])  # no such slide
    line = len((root / "stage_labels.csv").read_text().splitlines())
    victim = next(s for s in scan_camelyon(root).for_centers([0]) if s.node_label == "negative")
    victim.path.write_bytes(victim.path.read_bytes()[: victim.path.stat().st_size // 2])
    out = tmp_path / "patches"
    out.mkdir()
    (out / "center_1.h5").write_bytes(b"a store from an earlier run")
    (out / "center_1.inputs.json").write_text('{"inputs": "what it was built from"}')
    (out / "center_1.json").write_text(
        json.dumps({"center": 1, "counts": {}, "patients": {}, "store": "center_1.h5"})
    )

    assert _run(root, out, "--patches-per-class", "0=6", "1=100000") == 1

    error = capsys.readouterr().err
    assert "centre 1: can supply only" in error and "100000 of each requested" in error
    recorded = json.loads((out / "failures.json").read_text())
    failures = {(f["stage"], f["slide"]): f for f in recorded}
    catalogue = failures[("catalogue", f"{root / 'stage_labels.csv'}:{line}")]
    assert "label for missing slide patient_000_node_9" in catalogue["error"]
    assert catalogue["center"] == 0
    assert [key for key in failures if key[1] == victim.slide_id], "the truncated slide"
    assert failures[("centre", "center_1")]["center"] == 1
    # centre 1 failed: its earlier store and the record of its inputs are kept as they were,
    # its report says it failed and names the store it kept, which no summary counts
    assert (out / "center_1.h5").read_bytes() == b"a store from an earlier run"
    assert (out / "center_1.inputs.json").read_text() == '{"inputs": "what it was built from"}'
    report = json.loads((out / "center_1.json").read_text())
    assert report["status"] == "failed" and "100000 of each" in report["error"]
    assert report["store"] == "center_1.h5"
    summary = (out / "summary.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in summary[1:]] == ["0", "0"]
    # centre 0 finished without the truncated slide
    stored = read_store_info(store_path(out, 0))
    assert victim.slide_id not in stored.splits["train"].slides + stored.splits["test"].slides

    # the catalogue problem alone is enough for --strict
    victim.path.unlink()
    with (root / "stage_labels.csv").open() as labels:
        rows = [row for row in csv.reader(labels) if row[0] != f"{victim.slide_id}.tif"]
    with (root / "stage_labels.csv").open("w", newline="") as labels:
        csv.writer(labels).writerows(rows)
    assert _run(root, out, "--patches-per-class", "6") == 0
    assert [f["stage"] for f in json.loads((out / "failures.json").read_text())] == ["catalogue"]
    assert _run(root, out, "--patches-per-class", "6", "--strict") == 1
    assert "1 slide or catalogue failure(s) and --strict is set" in capsys.readouterr().err


def test_a_failed_rebuild_keeps_the_finished_store_and_the_rerun_rebuilds_it(
    synthetic_dataset: SynthManifest, tmp_path: Path, capsys
) -> None:
    """A finished store, then a rebuild that fails (asked for more patches than the slides
    hold): the store and the record of its inputs stay byte for byte, the report says the
    centre failed; rerun as before, the store is found stale and built again to the same
    bytes."""
    out = tmp_path / "patches"
    args = ("--config", str(REPO / "params.yaml"), "--data-root", str(synthetic_dataset.root),
            "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--centers", "0",
            "--patch-size", "128", "--level", "0", "--workers", "1")  # fmt: skip
    assert main([*args, "--patches-per-class", "6"]) == 0
    finished = {name: (out / name).read_bytes() for name in ("center_0.h5", "center_0.inputs.json")}

    assert main([*args, "--patches-per-class", "100000"]) == 1
    assert "100000 of each requested" in capsys.readouterr().err
    assert {name: (out / name).read_bytes() for name in finished} == finished
    report = json.loads((out / "center_0.json").read_text())
    assert report["status"] == "failed" and report["store"] == "center_0.h5"
    assert json.loads((out / "summary.json").read_text())["table"] == []  # not counted

    assert main([*args, "--patches-per-class", "6"]) == 0  # stale: its report is the failure
    assert json.loads((out / "center_0.json").read_text())["status"] == "complete"
    assert (out / "center_0.h5").read_bytes() == finished["center_0.h5"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs to fill (needs root)")
def test_a_rebuild_on_a_full_disk_is_refused_and_keeps_the_finished_store(
    synthetic_dataset: SynthManifest, tmp_path: Path, capsys
) -> None:
    """The stores' folder on a real 8 MiB filesystem, filled after a first build: the
    rebuild (other parameters) finds no room for the store before writing it, says so in
    one line, exits 3 (the machine refused) and keeps the finished store and the record of
    its inputs byte for byte; with room again, the rerun builds it."""
    out = tmp_path / "patches"
    out.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(out)], check=True)
    try:
        args = ("--config", str(REPO / "params.yaml"), "--data-root",
                str(synthetic_dataset.root), "--out", str(out), "--cache-dir",
                str(tmp_path / "cache"), "--centers", "0", "--patch-size", "128", "--level",
                "0", "--workers", "1")  # fmt: skip
        assert main([*args, "--patches-per-class", "6"]) == 0
        finished = {name: (out / name).read_bytes()
                    for name in ("center_0.h5", "center_0.inputs.json")}  # fmt: skip
        ballast = out / "ballast"
        with ballast.open("wb") as handle:  # all but 64 KiB: less than the store needs
            handle.write(b"\0" * (free_bytes(out) - 65536))
        capsys.readouterr()
        assert main([*args, "--patches-per-class", "5"]) == 3
        error = capsys.readouterr().err
        said = [line for line in error.splitlines() if line.startswith("error:")]
        assert len(said) == 1 and re.fullmatch(
            rf"error: {re.escape(str(out / 'center_0.h5'))}: needs [0-9,]+ bytes but only "
            r"[0-9,]+ are free on its filesystem", said[0]), error[-3000:]  # fmt: skip
        assert "Traceback" not in error
        assert {name: (out / name).read_bytes() for name in finished} == finished
        assert json.loads((out / "center_0.json").read_text())["status"] == "failed"
        ballast.unlink()
        assert main([*args, "--patches-per-class", "6"]) == 0
        assert (out / "center_0.h5").read_bytes() == finished["center_0.h5"]
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            subprocess.run(["umount", "-l", str(out)], check=False)
