"""The campaigns' small versions, on a tiny project of this code (two stores, one run, its
report): the power-loss campaign (`python -m bench crash`: SIGKILL to every process at a
drawn instant of a report and of a training run, each rerun to completion: nothing differs
by content from the uninterrupted outputs and nothing is left behind), and the
environment-fault campaign (`python -m bench faults`: a full filesystem, one turned
read-only, a Prefect server killed, each at a drawn point of a report: one line and exit
3, nothing finished lost, nothing left, and the rerun's bytes the reference's). `python -m bench
crash --points 40` and `python -m bench faults --points 30` run them on the demo's
outputs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import prefect_home_from
from tests.pipeline.conftest import REPO, dvc_project, tiny_params, tool_environment
from tests.proxyfl.conftest import write_stores


@pytest.fixture(scope="module")
def tiny_project(tmp_path_factory: pytest.TempPathFactory, prefect_home_template: Path) -> Path:
    """Two stores, Regular seed 0 trained and reported, committed: the source both
    campaigns copy (each works on a copy of its own)."""
    tmp_path = tmp_path_factory.mktemp("campaigns")
    tool_env = tool_environment(prefect_home_from(prefect_home_template, tmp_path / "prefect"))
    params = tiny_params()
    params["train"].update({"algorithms": ["Regular"], "retries": 0})
    params["train"]["options"].update({"rounds": 2})
    project = dvc_project(tmp_path / "project", params, tool_env)
    write_stores(project / params["train"]["data"], centers=(0, 1), n_train=48)
    for command in (["git", "add", "-A"], ["git", "-c", "user.name=t", "-c", "user.email=t@t",
                                           "commit", "-qm", "tiny"]):  # fmt: skip
        subprocess.run(command, cwd=project, env=tool_env, check=True)
    from flows.server import prefect_server
    from plumbing.environment import environment_variable

    # one server for both commands (else one each, 7 s of CPU), on the migrated home
    with (
        environment_variable("PREFECT_HOME", tool_env["PREFECT_HOME"]),
        prefect_server() as api_url,
    ):
        for flow in (["flows.train", "--algorithms", "Regular", "--seeds", "0"],
                     ["flows.report"]):  # fmt: skip
            done = subprocess.run([sys.executable, "-m", *flow], cwd=project,
                                  env={**tool_env, "PREFECT_API_URL": api_url},
                                  capture_output=True, text=True, timeout=600)  # fmt: skip
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return project


@pytest.mark.slow
def test_a_small_crash_campaign_loses_nothing_and_leaves_nothing(
    tiny_project: Path, tool_env: dict[str, str]
) -> None:
    campaign = subprocess.run(
        [sys.executable, "-m", "bench", "crash", "--source", str(tiny_project), "--points", "2",
         "--commands", "report", "train", "--seed", "4"],
        cwd=REPO, env=tool_env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    output = campaign.stdout + campaign.stderr
    assert campaign.returncode == 0, output[-5000:]
    assert "2 points over report, train (seed 4): 0 diverged, 0 left something behind" in output
    # seed 4 draws one point in each command, at 30 % and 48 % of its uninterrupted time
    assert output.count("killed at") == 2
    assert re.search(r"point +1: report +killed at", output) is not None, output[-3000:]
    assert re.search(r"point +2: train +killed at", output) is not None, output[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs for each point (needs root)")
def test_a_small_fault_campaign_says_one_line_loses_nothing_and_reruns_to_the_same_bytes(
    tiny_project: Path, tool_env: dict[str, str]
) -> None:
    campaign = subprocess.run(
        [sys.executable, "-m", "bench", "faults", "--source", str(tiny_project), "--points",
         "3", "--commands", "report", "--seed", "16"],
        cwd=REPO, env=tool_env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    output = campaign.stdout + campaign.stderr
    assert campaign.returncode == 0, output[-6000:]
    # seed 16: each fault once, midway (48 % of the report's time, 45 % of its bytes, 71 %)
    assert re.search(r"point +1: report +read-only at +48% of its time", output), output[-3000:]
    assert re.search(r"point +2: report +full +at +45% of its bytes: exit 3; ok", output), (
        output[-3000:])  # fmt: skip
    assert re.search(r"point +3: report +server +at +71% of its time", output), output[-3000:]
    assert ("0 said it badly, 0 lost or mixed something, 0 left something behind, 0 reran "
            "to other bytes") in output, output[-3000:]  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs for each point (needs root)")
def test_a_disk_without_room_for_training_is_one_line_and_the_rerun_gives_the_same_bytes(
    tiny_project: Path, tool_env: dict[str, str]
) -> None:
    """Training with room for half of what it writes: its ranks find, before round 1, that
    the checkpoints and models will not fit (proxyfl.run); the command says so in one
    line, exit 3, nothing of the run is half-written, and the rerun with room gives the
    reference's bytes. (A disk that fills mid-round names the file too: torch's and
    safetensors' writers, tests/proxyfl/test_checkpoint.py; the launcher's own
    refusal, test_launch_mpi.py.)"""
    campaign = subprocess.run(
        [sys.executable, "-m", "bench", "faults", "--source", str(tiny_project), "--points",
         "1", "--commands", "train", "--faults", "full", "--seed", "28"],
        cwd=REPO, env=tool_env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    output = campaign.stdout + campaign.stderr
    assert campaign.returncode == 0, output[-6000:]
    # seed 28: room for 55 % of the bytes the reference training wrote
    assert re.search(r"point +1: train +full +at +55% of its bytes: exit 3; ok", output), (
        output[-3000:])  # fmt: skip
    assert ("0 said it badly, 0 lost or mixed something, 0 left something behind, 0 reran "
            "to other bytes") in output, output[-3000:]  # fmt: skip
