"""Where the preprocess flow's tasks run, and what a run leaves behind.

A local Dask cluster builds the same stores as the process pool, and so does one worker,
which is no pool (the command's own process); a run reports to one
Prefect server, its workers included; a run killed with SIGKILL takes its workers and its
server with it. Real processes throughout, watched with psutil.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from flows.preprocess import main
from tests.conftest import command_line, prefect_home_from
from wsi.synth import SynthManifest

REPO = Path(__file__).resolve().parents[2]
PATCH_SIZE = 128
PER_CLASS = 6


def _flags(root: Path, out: Path, runner: str, workers: int = 2) -> list[str]:
    """Small patches of two centres at level 0, ``workers`` workers."""
    return [
        *("--config", str(REPO / "params.yaml"), "--data-root", str(root)),
        *("--out", str(out), "--cache-dir", str(out.parent / f"{out.name}-cache")),
        *("--centers", "0", "1", "--patch-size", str(PATCH_SIZE), "--level", "0"),
        *("--patches-per-class", str(PER_CLASS), "--workers", str(workers)),
        *("--runner", runner),
    ]


def is_prefect_server(command_line: str) -> bool:
    """Prefect's server (flows.server's, flows.prefect_api), or a temporary one (uvicorn)."""
    return "flows.prefect_api" in command_line or "uvicorn" in command_line


def is_spawned_worker(command_line: str) -> bool:
    """A process-pool or Dask worker (multiprocessing's spawn start method)."""
    return "multiprocessing.spawn" in command_line


@dataclass
class Descendants:
    """Samples the descendants of process ``pid`` from a thread, every 0.2 s: every one
    seen (by pid and start time, with its command line) and the most Prefect servers
    running at once."""

    pid: int
    seen: dict[tuple[int, float], str] = field(default_factory=dict)
    most_servers: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Descendants:
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> dict[tuple[int, float], str]:
        """The live descendants now, also added to ``seen``. Each command line is read
        afresh: one read between a child's fork and its exec is its parent's (a Prefect
        server's first read so, under a hog, and kept, it was never counted as one)."""
        try:
            children = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return {}
        now = {}
        for child in children:
            try:
                key = (child.pid, child.create_time())
            except psutil.NoSuchProcess:
                continue
            now[key] = " ".join(command_line(child)) or self.seen.get(key, "")
        self.seen.update(now)
        self.most_servers = max(self.most_servers, sum(map(is_prefect_server, now.values())))
        return now

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(0.2)

    def workers_seen(self) -> int:
        return sum(map(is_spawned_worker, self.seen.values()))


def alive(processes: dict[tuple[int, float], str]) -> dict[tuple[int, float], str]:
    """Those of ``processes`` still running (a zombie has exited: it only awaits reaping)."""
    running = {}
    for (pid, started), command in processes.items():
        try:
            process = psutil.Process(pid)
            if process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE:
                running[(pid, started)] = command
        except psutil.NoSuchProcess:
            continue
    return running


def kill_all(processes: dict[tuple[int, float], str]) -> None:
    """SIGKILL those of ``processes`` still running: a failed test leaves nothing behind."""
    for pid, _ in alive(processes):
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()


@pytest.fixture(scope="module")
def flow_env(tmp_path_factory: pytest.TempPathFactory, prefect_home_template: Path
             ) -> dict[str, str]:  # fmt: skip
    """A user's environment with no Prefect server configured (own PREFECT_HOME, a copy of
    the run's migrated one, shared by this module's runs)."""
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    home = prefect_home_from(prefect_home_template, tmp_path_factory.mktemp("home") / "prefect")
    env.update({"PREFECT_HOME": str(home),
                "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})  # fmt: skip
    return env


def _start(
    root: Path, out: Path, runner: str, env: dict[str, str], workers: int = 2
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "flows.preprocess", *_flags(root, out, runner, workers)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


@dataclass(frozen=True)
class PoolRun:
    out: Path
    returncode: int
    descendants: Descendants


@pytest.fixture(scope="module")
def pool_run(
    synthetic_dataset: SynthManifest, flow_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PoolRun]:  # fmt: skip
    """``python -m flows.preprocess --runner process`` with no server configured, to the end,
    its descendants watched all along."""
    out = tmp_path_factory.mktemp("pool") / "patches"
    process = _start(synthetic_dataset.root, out, "process", flow_env)
    with Descendants(process.pid) as descendants:
        try:
            returncode = process.wait(timeout=240)
        finally:
            process.kill()
            kill_all(descendants.seen)
    yield PoolRun(out, returncode, descendants)


def test_a_run_and_its_pool_workers_report_to_one_prefect_server(pool_run: PoolRun) -> None:
    assert pool_run.returncode == 0
    assert pool_run.descendants.workers_seen() >= 2, "the tasks ran in pool workers"
    assert pool_run.descendants.most_servers == 1, "one server for the flow and its workers"
    servers = [c for c in pool_run.descendants.seen.values() if is_prefect_server(c)]
    # flows.server's (not a temporary one of Prefect's: uvicorn)
    assert len(servers) == 1 and " -m flows.prefect_api " in servers[0], servers


def test_a_local_dask_cluster_builds_the_same_stores_as_the_process_pool(
    pool_run: PoolRun, synthetic_dataset: SynthManifest, tmp_path: Path
) -> None:
    out = tmp_path / "patches"
    # In this process, against the session's test server: the Dask workers must report to
    # it (started as a subprocess of this one) rather than start their own.
    with Descendants(os.getpid()) as descendants:
        assert main(_flags(synthetic_dataset.root, out, "dask")) == 0
    assert descendants.workers_seen() >= 2, "the tasks ran on the cluster's workers"
    assert descendants.most_servers <= 1, [c for c in descendants.seen.values()
                                           if is_prefect_server(c)]  # fmt: skip
    built = sorted(path.name for path in pool_run.out.iterdir())
    assert built == sorted(path.name for path in out.iterdir())
    assert {"center_0.h5", "center_1.h5", "summary.json"} <= set(built)
    for name in built:
        assert (out / name).read_bytes() == (pool_run.out / name).read_bytes(), name


def test_one_worker_builds_the_same_stores_in_the_commands_own_process(
    pool_run: PoolRun, synthetic_dataset: SynthManifest, flow_env: dict[str, str],
    tmp_path: Path,
) -> None:  # fmt: skip
    """``--workers 1``: no pool (flows.inline), the slides cut one after the other in the
    command's own process, to the bytes two pool workers wrote."""
    out = tmp_path / "patches"
    process = _start(synthetic_dataset.root, out, "process", flow_env, workers=1)
    with Descendants(process.pid) as descendants:
        try:
            assert process.wait(timeout=240) == 0
        finally:
            process.kill()
            kill_all(descendants.seen)
    assert descendants.workers_seen() == 0, descendants.seen
    assert descendants.most_servers == 1, descendants.seen  # its own: so it was watched
    built = sorted(path.name for path in pool_run.out.iterdir())
    assert built == sorted(path.name for path in out.iterdir())
    for name in built:
        assert (out / name).read_bytes() == (pool_run.out / name).read_bytes(), name


def test_the_calling_thread_executor_keeps_errors_and_passes_interrupts_on() -> None:
    """A task's exception is its future's, as in a pool; Ctrl-C's ``KeyboardInterrupt``
    stops the caller where it is, and the tasks after it do not run."""
    from flows.inline import CallingThreadExecutor

    ran: list[str] = []

    def task(name: str) -> str:
        ran.append(name)
        if name == "broken":
            raise ValueError("a bad slide")
        if name == "interrupted":
            raise KeyboardInterrupt
        return name.upper()

    executor = CallingThreadExecutor()
    done = executor.submit(task, "first")
    assert done.done() and done.result() == "FIRST" and ran == ["first"]
    failed = executor.submit(task, "broken")
    assert isinstance(failed.exception(), ValueError)
    with pytest.raises(KeyboardInterrupt):
        for name in ("interrupted", "never"):
            executor.submit(task, name)
    assert ran == ["first", "broken", "interrupted"]


def test_a_killed_run_leaves_no_process_behind(
    synthetic_dataset: SynthManifest, flow_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "patches"
    cache = tmp_path / "patches-cache"
    process = _start(synthetic_dataset.root, out, "process", flow_env)
    with Descendants(process.pid) as descendants:
        try:
            deadline = time.monotonic() + 180
            while len(list(cache.glob("*.npz"))) < 2:  # the workers are at work
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
            before = descendants.sample()
            process.kill()
            process.wait(timeout=10)
            assert sum(map(is_spawned_worker, before.values())) == 2, before
            assert sum(map(is_prefect_server, before.values())) == 1, before
            deadline = time.monotonic() + 10
            while alive(before) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not alive(before), f"left behind: {alive(before)}"
        finally:
            process.kill()
            kill_all(descendants.seen)
    assert descendants.most_servers == 1
    assert not list(out.glob("*.h5")), "the run was killed before any store was published"


def test_the_local_dask_cluster_listens_on_loopback_only(tmp_path: Path) -> None:
    """The cluster the flow starts for ``runner: dask`` (scheduler, workers, dashboard):
    every socket it listens on, in this process and its workers, is on 127.0.0.1. (What
    this test process listened on before is another test's: MPI initialised in-process by
    a trainer test listens on the machine's address.)"""
    from distributed import LocalCluster

    from camelyon_proxyfl.params.preprocess import PreprocessConfig
    from flows.preprocess import task_runner

    def listening() -> set[tuple[int, str, int]]:
        me = psutil.Process()
        return {
            (process.pid, connection.laddr.ip, connection.laddr.port)
            for process in (me, *me.children(recursive=True))
            for connection in process.net_connections(kind="inet")
            if connection.status == psutil.CONN_LISTEN
        }

    before = listening()
    config = PreprocessConfig(data_root=tmp_path, runner="dask", workers=2)
    runner = task_runner(config)
    with LocalCluster(**runner.cluster_kwargs) as cluster:
        cluster.wait_for_workers(2, timeout=60)
        opened = listening() - before
    assert opened and all(ip == "127.0.0.1" for _, ip, _ in opened), opened
