"""``python -m bench gpu --smoke``: the GPU bench's code, run on a CPU in tiny sizes, so that
the one command a GPU's few minutes depend on cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_gpu_smoke_measures_every_figure(tmp_path: Path) -> None:
    figures_path = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "gpu", "--smoke", "--work", str(tmp_path / "work"),
         "--json", str(figures_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(figures_path.read_text())
    # stores from synthetic slides, through wsi's functions
    counts = figures["stores"]["counts"]
    assert set(counts) == {"0", "1"} and all(sum(c["train"].values()) > 0 for c in counts.values())
    # gpu.json was written after every part: a bench cut short keeps what it measured
    assert figures["parts_done"] == ["stores", "(a)", "(b)", "(c)", "(d)", "(e)"]
    # (a) every step variant timed, against the plain step, and the DML step as a run
    # takes it (a client's own step, after its pre-run check: no graph compiled after it)
    steps = {row["variant"]: row for row in figures["steps"]}
    assert {"plain", "opacus fp32", "func fp32", "DML step as a run takes it, eager"} <= set(steps)
    assert all(row["ms"] > 0 and row["x_plain"] > 0 for row in steps.values())
    assert steps["DML step as a run takes it, eager"]["recompiles"] == 0
    # (b) a job of two ranks through the launcher, with each rank's phases, memory, threads
    # and the time it waited for its batches
    job = figures["job"]
    assert job["ok"] and len(job["ranks"]) == 2
    for rank in job["ranks"]:
        assert rank["timings"]["train_seconds"] > 0 and rank["memory"]["peak_rss_gb"] > 0
        assert 0 <= rank["timings"]["data_wait_seconds"] < rank["timings"]["train_seconds"]
        assert rank["torch_threads"] >= 1 and rank["recompiles"] == 0
        assert rank["fill_uninitialized_memory"] is False
    # (c) on a CPU two runs and a stopped-and-resumed one are identical
    determinism = figures["determinism"]
    assert determinism["two_runs"]["identical"] and determinism["two_runs"]["rows"] > 0
    assert determinism["stop_and_resume"]["identical"]
    # (d) a projection at Table 1's size
    assert figures["projection"]["table2_device_hours"] > 0
    # (e) what does not fit is named, in one line per rank group, not a traceback
    oom = figures["out_of_memory"]
    assert not oom["ok"]
    assert "out of memory on cpu" in oom["message"] and "lower train.options" in oom["message"]
    assert "Traceback" not in oom["message"]
    assert "== bench gpu:" in done.stdout
    # the jobs of (b)-(e) forked their ranks from the one warm server the bench kept for them
    cold = os.environ.get("PLUMBING_COLD_RANKS") == "1"
    for name in ("base", "again", "resumed"):
        machine = json.loads((tmp_path / "work" / "runs" / name / "machine.json").read_text())
        assert machine["timings"]["launcher"]["warm_server"] == (None if cold else "kept"), name


def test_the_wheelhouse_asks_for_every_wheel_an_older_glibc_built() -> None:
    """pip's --platform matches only the tags given: manylinux_2_28 must bring the
    manylinux2014 and manylinux1 wheels (openslide-python's) too."""
    from bench.wheelhouse import compatible_platforms, runtime_requirements

    tags = compatible_platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags
    assert compatible_platforms("macosx_14_0_arm64") == ["macosx_14_0_arm64"]
    names = " ".join(runtime_requirements())
    assert "opacus" in names and "mpich" in names and "prefect" not in names and "dvc" not in names
    assert "nvflare" not in names


def test_a_wheelhouse_for_a_server_with_packages_downloads_only_what_it_lacks() -> None:
    """``--present``: a listing in pip freeze's, pip list's or bare names' form leaves out
    what the server has, whatever its version, except MPI and its binding, carried as a
    pair; the device list committed for the lent GPU machines is read so."""
    from bench.wheelhouse import REPO, lacking, present_packages

    listing = ("Package    Version\n---------- -------\nNumPy 2.5.2\n"
               "scikit_image==0.26.0\n# a comment\ntyping-extensions\nmpi4py==4.0.0\n")  # fmt: skip
    present = present_packages(listing)
    assert present == {"numpy", "scikit-image", "typing-extensions", "mpi4py"}
    pins = ["numpy==2.5.5", "scikit-image==0.26.0", "typing_extensions==4.16.0",
            "opacus==1.6.0", "mpi4py==4.1.2", "mpich==5.0.2"]  # fmt: skip
    assert lacking(pins, present) == ["opacus==1.6.0", "mpi4py==4.1.2", "mpich==5.0.2"]
    device = present_packages((REPO / "bench" / "device" / "nvidia-h200.txt").read_text())
    assert {"torch", "numpy", "scipy", "h5py"} <= device and "opacus" not in device
