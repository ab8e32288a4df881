"""The Prefect path of docs/prefect.md on a fresh copy of the repository with no data: `python -m
flows.serve` (server, work pool, deployments, worker), `prefect deployment run
pipeline/pipeline --watch` (which writes the synthetic slides first), then Ctrl-C stops
every process within 10 s."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plumbing.network import free_port
from tests.pipeline.conftest import REPO, processes_of, tiny_params, write_params


def fresh_checkout(destination: Path) -> Path:
    """What ``git clone`` of this working tree gives: the tracked and the untracked, not
    ignored files (so no data/, runs/, results/ or .prefect/)."""
    command = ["git", "ls-files", "-co", "--exclude-standard", "-z"]
    listed = subprocess.run(command, cwd=REPO, check=True, capture_output=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def _wait_for(path: Path, text: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in path.read_text():
        assert process.poll() is None, f"exited {process.returncode}:\n{path.read_text()}"
        assert time.monotonic() < deadline, f"no {text!r} in {timeout_s:.0f} s:\n{path.read_text()}"
        time.sleep(0.5)


@pytest.mark.slow
def test_served_deployment_runs_the_pipeline_from_a_fresh_clone_without_data(
    tmp_path: Path, tool_env: dict[str, str]
) -> None:
    project = fresh_checkout(tmp_path / "project")
    write_params(project / "params.yaml", tiny_params())  # relative paths: data/synthetic, ...
    assert not (project / "data").exists()
    port = free_port()
    output = project / "serve.log"
    serve = subprocess.Popen(
        [sys.executable, "-m", "flows.serve", "--port", str(port)], cwd=project, env=tool_env,
        stdout=output.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for(output, "ready.", serve, timeout_s=300)
        watched = subprocess.run(
            ["prefect", "deployment", "run", "pipeline/pipeline", "--watch",
             "--watch-timeout", "900"], cwd=project, capture_output=True, text=True,
            env={**tool_env, "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}, timeout=1000,
        )  # fmt: skip
        assert watched.returncode == 0, watched.stdout + watched.stderr + output.read_text()
        assert "Completed" in watched.stdout, watched.stdout + output.read_text()[-5000:]
        # --watch ends with the run's result in one line, before the final state
        assert "result: accuracy / macro-accuracy: ProxyFL " in watched.stdout, watched.stdout
    finally:
        os.killpg(serve.pid, signal.SIGINT)  # Ctrl-C in serve's terminal
        interrupted = time.monotonic()
        try:
            serve.wait(timeout=30)
        finally:
            if serve.poll() is None:
                os.killpg(serve.pid, signal.SIGKILL)
    stopped_in = time.monotonic() - interrupted
    log = output.read_text()
    assert serve.returncode == 0, log[-3000:]
    assert stopped_in < 10, f"Ctrl-C took {stopped_in:.1f} s"
    deadline = time.monotonic() + 5
    while (left := processes_of(project)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, "outlived Ctrl-C:\n" + "\n".join(left)

    # the pipeline wrote the synthetic slides, then every stage ran as its own flow run
    assert "holds no synthetic dataset yet: writing it" in log, log[-5000:]
    assert (project / "data" / "synthetic" / "stage_labels.csv").is_file()
    for flow_name in ("pipeline", "preprocess", "train", "stage", "report"):
        assert f"for flow '{flow_name}'" in log, log[-5000:]
    accuracy = (project / "results" / "tables" / "accuracy.csv").read_text()
    assert "ProxyFL" in accuracy and "Joint" in accuracy
    assert "| Joint |" in (project / "results" / "tables" / "privacy.md").read_text()
    assert "| Joint/seed_0 |" in (project / "results" / "tables" / "staging.md").read_text()
