"""plumbing.forkserver: pool workers fork from one server per process and start as spawned
ones would (the folder and environment of their pool); a starter killed outright takes its
server and every worker with it. Real pools, real SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import psutil
import pytest

from plumbing import forkserver

REPO = Path(__file__).resolve().parents[1]
MARK = "CAMELYON_PROXYFL_FORKSERVER_TEST"

pytestmark = pytest.mark.skipif(not forkserver.forks(), reason="no fork server here")


def _pool(workers: int = 2) -> ProcessPoolExecutor:
    context = forkserver.worker_context(["json"])
    forkserver.ensure_running()
    return ProcessPoolExecutor(workers, mp_context=context, initializer=forkserver.start_worker,
                               initargs=(os.getpid(), dict(os.environ)))  # fmt: skip


def _ask(pool: ProcessPoolExecutor) -> dict[str, object]:
    return {"cwd": pool.submit(os.getcwd).result(), "mark": pool.submit(os.getenv, MARK).result(),
            "parent": pool.submit(os.getppid).result()}  # fmt: skip


def test_workers_start_with_the_folder_and_environment_of_their_pool_from_one_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MARK, "first")
    with _pool() as pool:
        first = _ask(pool)
    assert first["mark"] == "first" and first["cwd"] == os.getcwd()
    assert first["parent"] != os.getpid()  # forked by the server, not by us

    monkeypatch.delenv(MARK)  # the server started with it: a worker must not see it
    monkeypatch.chdir(tmp_path)
    with _pool() as pool:
        second = _ask(pool)
    assert second["mark"] is None and second["cwd"] == str(tmp_path)
    assert second["parent"] == first["parent"]  # one server for both pools: imports once


# a starter in miniature: a pool of two busy workers, then it says who is who and waits
STARTER = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from tests.test_forkserver import _pool
pool = _pool()
workers = {pool.submit(os.getpid).result() for _ in range(8)}
server = pool.submit(os.getppid).result()
for _ in range(2):
    pool.submit(time.sleep, 60)
print(json.dumps({"server": server, "workers": sorted(workers)}), flush=True)
time.sleep(60)
"""


def test_a_starter_killed_outright_takes_its_server_and_workers_with_it() -> None:
    # its stderr: multiprocessing's resource tracker warns there of the semaphores the
    # killed starter left (and removes them)
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(REPO)], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        said = json.loads(starter.stdout.readline())
        processes = [psutil.Process(pid) for pid in (said["server"], *said["workers"])]
        assert len(processes) >= 2 and all(p.is_running() for p in processes)
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in processes) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in processes), [p.pid for p in processes if _alive(p)]
    finally:
        starter.kill()
        starter.wait()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
