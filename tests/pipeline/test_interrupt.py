"""Ctrl-C on each flow command, in the middle of its work: the command exits within 10 s,
no process of it is left (its temporary Prefect server, process pool, MPI ranks), and no
half-written file looks complete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipeline.conftest import processes_of, tiny_params_under, write_params
from tests.proxyfl.conftest import write_stores
from wsi.store.reader import read_store_info
from wsi.synth import SynthManifest

# command -> (what must be under way when Ctrl-C is pressed: a line of its output)
UNDER_WAY = {
    "flows.preprocess": "for flow 'preprocess'",
    "flows.train": "round 2/",
    "flows.pipeline": "launch command:",
}


def _wait_for(log: Path, text: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert process.poll() is None, f"exited {process.returncode}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, (
            f"no {text!r} in {timeout_s:.0f} s:\n" + (log.read_text()[-4000:])
        )
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(UNDER_WAY))
def test_ctrl_c_stops_the_flow_within_10_s_and_leaves_nothing_behind(
    command: str, tmp_path: Path, tool_env: dict[str, str], synthetic_dataset: SynthManifest
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    params = tiny_params_under(project, synthetic_dataset.root)
    params["train"]["options"]["rounds"] = 200  # still training when Ctrl-C comes
    write_params(project / "params.yaml", params)
    if command == "flows.train":
        write_stores(project / "patches", centers=(0, 1))
    log = project / "output.log"
    process = subprocess.Popen(
        [sys.executable, "-m", command], cwd=project, env=tool_env,
        stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for(log, UNDER_WAY[command], process, timeout_s=400)
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        pressed = time.monotonic()
        try:
            process.wait(timeout=60)
        finally:
            stopped_in = time.monotonic() - pressed
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    output = log.read_text()
    assert stopped_in < 10, f"Ctrl-C took {stopped_in:.1f} s:\n{output[-4000:]}"
    assert process.returncode != 0, output[-4000:]  # interrupted is never success
    deadline = time.monotonic() + 5
    while (left := processes_of(project)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, "outlived Ctrl-C:\n" + "\n".join(left)
    # what looks complete is: every store under its final name reads, no run is "finished"
    for store in (project / "patches").glob("center_*.h5"):
        read_store_info(store)
    for run in (project / "runs").glob("*/seed_*/run.json"):
        assert json.loads(run.read_text())["status"] != "finished", run
