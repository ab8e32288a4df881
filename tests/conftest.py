"""Shared fixtures, and how the suite runs in parallel workers.

`make test` runs the suite in pytest-xdist workers (``pytest -n``). Each worker has its own
temporary folders (pytest's, per worker), its own Prefect home (set below, before anything
imports Prefect), its own warm MPI server (tests/proxyfl/conftest.py) and free ports of its
own. The flow tests share one worker and its Prefect test server (tests/flows/conftest.py);
the tests that watch the clock share another (CLOCKED_FILES). What is expensive to build
and only read (:func:`shared_build`) is built once for the whole run, by the first worker
that asks, and read by all. ``pytest`` alone runs the same tests in one process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil
import pytest
from filelock import FileLock

from plumbing.atomic import write_bytes
from plumbing.collector import imports_done, pause

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
T = TypeVar("T")
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")  # gw0, gw1, ... under pytest -n

# Prefect's profiles, result storage and its ephemeral server's database live in
# PREFECT_HOME: the workers must not share one (nor use the user's .prefect/)
_PREFECT_HOME = tempfile.mkdtemp(prefix=f"prefect-home-{WORKER}-")
os.environ["PREFECT_HOME"] = _PREFECT_HOME
atexit.register(shutil.rmtree, _PREFECT_HOME, True)

# The fast tier (`make test-fast`, `pytest -m "not slow"`): the tests that run in one
# process. The tests that start MPI jobs, flows, Prefect servers or DVC are `slow`: every
# test of these files, and those marked so elsewhere.
SLOW_FILES = (
    "tests/flows/",
    "tests/pipeline/test_dvc.py",
    "tests/pipeline/test_interrupt.py",
    "tests/pipeline/test_deployment.py",
    "tests/pipeline/test_resume.py",
    "tests/slurm/",
    "_mpi.py",
)

# Tests that assert on wall-clock time (a stop within N s, a timeout's length) or signal
# process groups: one xdist group (`--dist loadgroup`), so that they run one at a time on
# one worker and never time each other.
CLOCKED_FILES = (
    "tests/test_warm.py",
    "tests/test_processes.py",
    "tests/test_locks.py",
    "tests/pipeline/test_interrupt.py",
    "tests/pipeline/test_deployment.py",
    "tests/pipeline/test_crash_campaign.py",
    "tests/proxyfl/test_hosts.py",
    "tests/proxyfl/test_hosts_netns.py",
)

# The longest tests (`--durations` of make test), started first so that no worker is left
# with one of them at the end while the other idles. Order only: nothing depends on it.
LONGEST_FIRST = (
    "tests/pipeline/test_dvc.py",
    "tests/proxyfl/test_federation.py",
    "tests/pipeline/test_dvc_lock.py",
    "tests/pipeline/test_crash_campaign.py",
    "tests/pipeline/test_deployment.py",
    "tests/test_bench_gpu.py",
    "tests/pipeline/test_resume.py",
)


def _rank(item: pytest.Item) -> int:
    path = item.path.relative_to(REPO).as_posix()
    return next((i for i, name in enumerate(LONGEST_FIRST) if path == name), len(LONGEST_FIRST))


def pytest_sessionstart(session: pytest.Session) -> None:
    """A process that collects the tests (each worker; not xdist's controller, which does
    not) imports them, torch, Prefect and DVC among what they import, as a command imports
    its modules: with the cyclic collector paused, its imports frozen once collected
    (plumbing.collector; in-process, 550,000 objects that each full collection walked)."""
    if not session.config.pluginmanager.hasplugin("dsession"):
        pause()


def pytest_collection_finish(session: pytest.Session) -> None:
    imports_done()


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (its hook has no order)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path.relative_to(REPO).as_posix()
        if any(part in path for part in SLOW_FILES):
            item.add_marker(pytest.mark.slow)
        if path in CLOCKED_FILES:
            item.add_marker(pytest.mark.xdist_group("clocked"))
        elif path.startswith("tests/flows/"):  # one Prefect test server, not one a worker
            item.add_marker(pytest.mark.xdist_group("flows"))
        elif path.startswith("tests/slurm/"):  # one Slurm cluster, not one a worker
            item.add_marker(pytest.mark.xdist_group("slurm"))
    items.sort(key=_rank)  # stable: the files' own order otherwise


def command_line(process: psutil.Process, settle_s: float = 10.0) -> list[str]:
    """``process``'s command line once its exec is done; [] once it is gone or a zombie.

    A child that ``subprocess.Popen`` has just returned reads an empty
    ``/proc/PID/cmdline`` for a moment: exec closes the descriptor Popen waits on before
    the kernel sets the new program's arguments, and a loaded machine runs the parent
    within that window (6 % of children under a half-core hog, ``python -m tests.stress``).
    A test that picks processes out by their command line waits the window out."""
    deadline = time.monotonic() + settle_s
    while True:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return []
            argv = process.cmdline()
        except psutil.Error:  # gone (or never ours to read)
            return []
        if argv or time.monotonic() > deadline:
            return argv
        time.sleep(0.005)


def shared_build(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], T]
) -> T:
    """``build(folder)``, run once for the whole test run and shared by every worker: the
    first worker to ask builds into ``folder`` (the others wait on its lock) and records
    what ``build`` returned (pickled) only once it has returned; every other caller gets
    that record. A build cut short leaves no record and is done again. ``name`` must say
    everything that decides the contents. Tests read the folder; one that must change it
    works on a copy."""
    root = tmp_path_factory.getbasetemp()
    if WORKER != "main":
        root = root.parent  # pytest-of-USER/pytest-N/, above each worker's popen-gwN/
    folder = root / "shared" / name
    record = folder.with_name(f"{name}.pickle")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{folder}.lock"):
        if record.is_file():
            return pickle.loads(record.read_bytes())
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        built = build(folder)
        write_bytes(record, pickle.dumps(built))  # whole, or not at all
        return built


def _third_party() -> Path:
    for candidate in (SHARED / "third_party", REPO / "tests" / "third_party"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        "third-party test files not found: expected ../shared/third_party next to the repository"
    )


@pytest.fixture(scope="session")
def third_party() -> Path:
    return _third_party()


@pytest.fixture(scope="session")
def openslide_fixtures(third_party: Path) -> Path:
    return third_party / "openslide-python-tests"


@pytest.fixture(scope="session")
def camelyon_annotation(third_party: Path) -> Path:
    return third_party / "camelyon17" / "patient_004_node_4.xml"


@pytest.fixture(scope="session")
def synthetic_dataset(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A small synthetic Camelyon-17 dataset (2 centres x 2 patients), generated once for
    the whole run (:func:`shared_build`)."""
    from wsi.synth import SynthConfig, generate_dataset

    config = SynthConfig(centers=(0, 1), patients_per_center=2, width=3072, height=2048, seed=8)
    return shared_build(
        tmp_path_factory,
        "camelyon17-2x2-seed8",
        lambda folder: generate_dataset(folder, config, workers=2),
    )


def _migrated_prefect_home(folder: Path) -> None:
    """A Prefect home after its first server's start: the database migrated and the block
    types registered (memo_store.toml), checkpointed into one file."""
    import subprocess
    import sys

    start = "from flows.server import prefect_server\nwith prefect_server():\n    pass\n"
    env = {**os.environ, "PREFECT_HOME": str(folder), "DO_NOT_TRACK": "1",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    subprocess.run([sys.executable, "-c", start], cwd=REPO, env=env, check=True, timeout=300)
    checkpoint_into_one_file(folder / "prefect.db")


def checkpoint_into_one_file(database: Path) -> None:
    """``database`` (SQLite in WAL mode) with its write-ahead log folded in and its -wal and
    -shm files gone when this returns. Closed here, not when collected: a connection is in
    a reference cycle (its statement cache), and the collector closing it later, in the
    middle of a test's copy of the folder, deleted the two files the copy had listed
    (shutil.Error, "No such file or directory: prefect.db-shm")."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(database)) as connection:
        connection.execute("pragma wal_checkpoint(truncate)")


@pytest.fixture(scope="session")
def prefect_home_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:func:`_migrated_prefect_home`, built once for the whole run (:func:`shared_build`):
    a test's own Prefect home starts as a copy of it, so that its first server skips the
    3-4 s of CPU a new database's migrations take (then 3 s, not 7)."""
    from importlib.metadata import version

    name = f"prefect-home-{version('prefect')}"

    def build(folder: Path) -> Path:
        _migrated_prefect_home(folder)
        return folder

    return shared_build(tmp_path_factory, name, build)


def prefect_home_from(template: Path, destination: Path) -> Path:
    """A Prefect home of a test's own at ``destination``, a copy of ``template``."""
    shutil.copytree(template, destination, ignore=shutil.ignore_patterns("*.lock"))
    return destination
