"""The power-loss campaign's small version (`python -m bench crash`): on a tiny project of
this code (two stores, one run, its report), SIGKILL to every process at a drawn instant
of a report and of a training run, each rerun to completion: nothing differs by content
from the uninterrupted outputs and nothing is left behind. `python -m bench crash --points 40`
runs the whole campaign on the demo's outputs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline.conftest import REPO, dvc_project, tiny_params
from tests.proxyfl.conftest import write_stores


@pytest.mark.slow
def test_a_small_crash_campaign_loses_nothing_and_leaves_nothing(
    tmp_path: Path, tool_env: dict[str, str]
) -> None:
    params = tiny_params()
    params["train"].update({"algorithms": ["Regular"], "retries": 0})
    params["train"]["options"].update({"rounds": 2})
    project = dvc_project(tmp_path / "project", params, tool_env)
    write_stores(project / params["train"]["data"], centers=(0, 1), n_train=48)
    for command in (["git", "add", "-A"], ["git", "-c", "user.name=t", "-c", "user.email=t@t",
                                           "commit", "-qm", "tiny"]):  # fmt: skip
        subprocess.run(command, cwd=project, env=tool_env, check=True)
    for flow in (["flows.train", "--algorithms", "Regular", "--seeds", "0"], ["flows.report"]):
        done = subprocess.run([sys.executable, "-m", *flow], cwd=project, env=tool_env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    campaign = subprocess.run(
        [sys.executable, "-m", "bench", "crash", "--source", str(project), "--points", "2",
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
