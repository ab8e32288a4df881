"""The README's Prefect path, end to end: a server on a free loopback port, a process work
pool, `prefect deploy --all`, a worker, `prefect deployment run --watch`, the tables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from flows.server import prefect_server
from tests.pipeline.conftest import REPO, tiny_params_under, write_params
from wsi.synth import SynthManifest


def _prefect(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    result = subprocess.run(["prefect", *args], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=timeout)  # fmt: skip
    assert result.returncode == 0, f"prefect {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def _stop(worker: subprocess.Popen[bytes]) -> None:
    """Stop the worker and whatever flow-run processes it still has (one session)."""
    os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


@pytest.mark.slow
def test_deployment_run_of_the_pipeline_on_a_worker(
    synthetic_dataset: SynthManifest, tmp_path: Path, tool_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    params = tiny_params_under(tmp_path, synthetic_dataset.root)
    params_file = write_params(tmp_path / "params.yaml", params)
    monkeypatch.setenv("PREFECT_HOME", tool_env["PREFECT_HOME"])  # the server's database
    with prefect_server(log_path=tmp_path / "server.log") as api_url:
        env = {**tool_env, "PREFECT_API_URL": api_url}
        _prefect(env, "work-pool", "create", "proxyfl", "--type", "process")
        deployed = _prefect(env, "--no-prompt", "deploy", "--all")
        assert "pipeline/pipeline" in deployed and "preprocess-centre/centre-2" in deployed
        worker = subprocess.Popen(
            ["prefect", "worker", "start", "--pool", "proxyfl"], cwd=tmp_path, env=env,
            stdout=open(tmp_path / "worker.log", "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
            start_new_session=True,
        )  # fmt: skip
        try:
            watched = subprocess.run(
                ["prefect", "deployment", "run", "pipeline/pipeline",
                 "--param", f"params_file={json.dumps(str(params_file))}",
                 "--watch", "--watch-timeout", "900"],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1000,
            )  # fmt: skip
        finally:
            _stop(worker)
        log = (tmp_path / "worker.log").read_text()
        assert watched.returncode == 0, watched.stdout + watched.stderr + log[-5000:]
        assert "Completed" in watched.stdout, watched.stdout + log[-5000:]

    # every stage ran as its own flow run on the worker
    for flow_name in ("pipeline", "preprocess", "train", "report"):
        assert f"for flow '{flow_name}'" in log, log[-5000:]
    accuracy = (tmp_path / "results" / "tables" / "accuracy.csv").read_text()
    assert "ProxyFL" in accuracy and "Joint" in accuracy
    privacy = (tmp_path / "results" / "tables" / "privacy.md").read_text()
    assert "| Joint |" in privacy
    assert (tmp_path / "patches" / "center_0.h5").is_file()
