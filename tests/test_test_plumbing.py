"""The suite's own plumbing: what `make test`'s workers share, and which processes its
coverage measures (tests/conftest.py, tests/coverage_site/sitecustomize.py)."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import CLOCKED_FILES, REPO, checkpoint_into_one_file, shared_build
from tests.stress import GROUPS, GroupRecord, coverage_environment, failed_tests


def test_a_shared_build_runs_once_and_one_cut_short_is_done_again(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    builds: list[Path] = []

    def build(folder: Path) -> str:
        builds.append(folder)
        (folder / "made").write_text("x")
        return "built"

    def cut_short(folder: Path) -> str:
        (folder / "half").write_text("x")
        raise KeyboardInterrupt

    name = f"plumbing-{tmp_path_factory.getbasetemp().name}"
    with pytest.raises(KeyboardInterrupt):
        shared_build(tmp_path_factory, name, cut_short)
    assert shared_build(tmp_path_factory, name, build) == "built"
    assert shared_build(tmp_path_factory, name, build) == "built"
    assert len(builds) == 1  # the second call read the record
    assert sorted(p.name for p in builds[0].iterdir()) == ["made"]  # nothing of the cut one


def test_a_checkpointed_database_is_one_file_before_anything_is_collected(tmp_path: Path) -> None:
    """The Prefect home every test copies (``prefect_home_template``) is one file when its
    build returns, not when the collector closes a connection: that closing, during a
    test's copy, once deleted files the copy had listed."""
    database = tmp_path / "prefect.db"
    # a server's writes, its process ended without closing: the log and its index remain
    written = subprocess.run([sys.executable, "-c", (
        "import os, sqlite3, sys\n"
        "db = sqlite3.connect(sys.argv[1])\n"
        "db.execute('pragma journal_mode=wal')\n"
        "db.execute('create table flow_run (name text)')\n"
        "db.execute(\"insert into flow_run values ('kept')\")\n"
        "db.commit()\n"
        "os._exit(0)\n"), str(database)], timeout=60)  # fmt: skip
    assert written.returncode == 0
    assert (tmp_path / "prefect.db-wal").stat().st_size > 0
    collecting = gc.isenabled()
    gc.disable()  # nothing closes a connection behind the checkpoint's back
    try:
        checkpoint_into_one_file(database)
        assert sorted(path.name for path in tmp_path.iterdir()) == ["prefect.db"]
    finally:
        if collecting:
            gc.enable()
    with contextlib.closing(sqlite3.connect(database)) as reader:
        assert reader.execute("select name from flow_run").fetchall() == [("kept",)]


def test_coverage_starts_in_this_projects_commands_only() -> None:
    path = REPO / "tests" / "coverage_site" / "sitecustomize.py"
    spec = importlib.util.spec_from_file_location("coverage_site", path)
    assert spec is not None and spec.loader is not None
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)  # no CAMELYON_PROXYFL_TEST_COVERAGE here: starts nothing
    program = site.program
    assert program(["python", "-m", "flows.train", "--seeds", "0"]) == "flows.train"
    assert program(["python", "-u", "-m", "mpi4py", "-m", "proxyfl.run"]) == "mpi4py"
    assert program(["python", "-c", "pass"]) == "-c"
    assert program(["/v/bin/python", "/v/bin/prefect", "server", "start"]) in site.NOT_OURS
    assert program(["/v/bin/python", "/v/bin/dvc", "repro"]) in site.NOT_OURS
    assert program(["python", "-m", "uvicorn", "app"]) in site.NOT_OURS
    assert program(["python", "-m", "prefect.engine"]) not in site.NOT_OURS  # our flows
    server = ["python", "-u", "-m", "nvflare.private.fed.app.server.server_train", "-m", "k"]
    assert program(server) in site.NOT_OURS
    # a FLARE site runs our job launcher; the server's job process our controller
    for module in ("client.client_train", "server.runner_process"):
        assert program(["python", "-u", "-m", f"nvflare.private.fed.app.{module}"]) not in (
            site.NOT_OURS
        )


@pytest.mark.xdist_group("grouping-check")
def test_xdist_groups_reach_the_scheduler(request: pytest.FixtureRequest) -> None:
    """`make test`'s groups (tests/conftest.py: one Prefect server for the flow tests, one
    Slurm cluster, the clocked tests one at a time) hold only if pytest-xdist's loadgroup
    sees them: with pytest 9.2 it silently saw none (the pin in pyproject.toml)."""
    if not hasattr(request.config, "workerinput"):
        pytest.skip("not in a pytest-xdist worker")
    if not request.config.getvalue("loadgroup"):
        pytest.skip("not --dist loadgroup")
    assert request.node.nodeid.endswith("@grouping-check"), request.node.nodeid


def test_the_flake_hunt_covers_every_clocked_file_and_reads_pytests_report(
    tmp_path: Path,
) -> None:
    """``python -m tests.stress`` runs every file that watches the clock or signals
    processes, and names the tests a run's junit report says failed."""
    hunted = {path for files in GROUPS.values() for path in files}
    assert set(CLOCKED_FILES) <= hunted and all((REPO / path).is_file() for path in hunted)
    report = tmp_path / "report.xml"
    report.write_text(
        '<testsuites><testsuite><testcase classname="tests.a" name="test_ok"/>'
        '<testcase classname="tests.a" name="test_bad"><failure message="x"/></testcase>'
        '<testcase classname="tests.b" name="test_err"><error message="y"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert failed_tests(report) == ["tests.a::test_bad", "tests.b::test_err"]
    assert failed_tests(tmp_path / "none.xml") == []
    record = GroupRecord("warm", GROUPS["warm"], runs=4, failed_runs=1)
    record.failing_tests.update(["tests.a::test_bad"])
    assert json.loads(json.dumps(record.record()))["failing_tests"] == {"tests.a::test_bad": 1}
    assert record.failures_per_100 == 25.0


def test_the_flake_hunt_measures_coverage_as_make_test_does(tmp_path: Path) -> None:
    """Each variable ``make test`` sets for coverage (the Makefile's test target) is set by
    the stress runs too, to the same configuration and coverage_site."""
    makefile = (REPO / "Makefile").read_text()
    target = makefile[makefile.index("\ntest: ") : makefile.index("\ntest-fast: ")]
    environment = coverage_environment(tmp_path)
    for name in ("COVERAGE_FILE", "CAMELYON_PROXYFL_TEST_COVERAGE", "PYTHONPATH"):
        assert f"{name}=" in target, name
    assert '"$(CURDIR)/pyproject.toml"' in target
    assert environment["CAMELYON_PROXYFL_TEST_COVERAGE"] == str(REPO / "pyproject.toml")
    assert "$(CURDIR)/tests/coverage_site" in target
    assert environment["PYTHONPATH"].split(":")[0] == str(REPO / "tests" / "coverage_site")
    assert Path(environment["COVERAGE_FILE"]).parent == tmp_path / "coverage"
    assert (tmp_path / "coverage").is_dir()


def test_the_flake_hunts_hog_ends_with_the_command_however_that_ends() -> None:
    """A stress command killed outright (SIGKILL: no ``finally`` runs, nor for SIGTERM,
    whose default action ends the process as it stands) takes its hog with it: a hog left
    spinning would load every run that follows on the machine."""
    program = (
        "import time\nfrom tests.stress import hog\n"
        "with hog(0.05):\n    print('hogging', flush=True)\n    time.sleep(120)\n"
    )
    command = subprocess.Popen(
        [sys.executable, "-c", program], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert command.stdout is not None and command.stdout.readline() == "hogging\n"
        hogs = psutil.Process(command.pid).children()
        assert len(hogs) == 1 and hogs[0].is_running()
    finally:
        command.kill()
        command.wait()
    _, alive = psutil.wait_procs(hogs, timeout=10)
    for process in alive:
        process.kill()
    assert not alive, "the hog outlived its stress command"


# a pytest plugin that holds one stress run still: the run's pytest starts a child and
# then waits, with the marker file naming both, until it is stopped
_HELD_RUN_PLUGIN = """
import os, subprocess, sys, time
from pathlib import Path

def pytest_sessionstart(session):
    workdir = Path(session.config.option.basetemp).parent  # stress's <group>-<run>
    if workdir.name != os.environ["STRESS_HELD_RUN"]:
        return
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    child = subprocess.Popen(sleeper)
    # and one no descendant of this pytest's: started in a session of its own by a process
    # that ends at once (slurmd's double fork of a job step)
    # (its output elsewhere: holding the pipe read here, it would hold this read up)
    leaver = ("import subprocess; print(subprocess.Popen("
              f"{sleeper!r}, start_new_session=True, stdout=subprocess.DEVNULL, "
              "stderr=subprocess.DEVNULL).pid)")
    orphan = subprocess.run([sys.executable, "-c", leaver], capture_output=True, text=True)
    marker = Path(os.environ["STRESS_HELD_MARKER"])
    marker.with_suffix(".part").write_text(f"{os.getpid()} {child.pid} {orphan.stdout.strip()}")
    marker.with_suffix(".part").rename(marker)
    time.sleep(600)
"""


@pytest.mark.parametrize("held_run", [1, 2])
def test_a_stress_command_stopped_mid_run_stops_the_run_and_its_processes(
    tmp_path: Path, held_run: int
) -> None:
    """SIGTERM to a stress command while a group's pytest runs (held there by a plugin,
    with a child of its own and an orphan it left in another session, as a Slurm job step
    is) ends that pytest and every process under it, the orphan included, not only the
    command: a run left going would load whatever the machine ran next. What the runs
    finished before it found is still said and written (``--json``), none at all when the
    first is stopped: a hunt of hours is often ended so."""
    output, report = tmp_path / "output.txt", tmp_path / "stress.json"
    plugin_folder, marker = tmp_path / "plugin", tmp_path / "held"
    plugin_folder.mkdir()
    (plugin_folder / "held_run.py").write_text(_HELD_RUN_PLUGIN)
    path = os.environ.get("PYTHONPATH")
    environment = {
        **os.environ,
        "STRESS_HELD_RUN": f"launcher-{held_run}",
        "STRESS_HELD_MARKER": str(marker),
        "PYTEST_ADDOPTS": "-p held_run",
        "PYTHONPATH": f"{plugin_folder}:{path}" if path else str(plugin_folder),
    }
    with output.open("w") as sink:
        command = subprocess.Popen(
            [sys.executable, "-m", "tests.stress", "--groups", "launcher", "--runs", "2",
             "--hog", "0", "--no-coverage", "--json", str(report), "--",
             "-k", "no_test_is_named_so"],
            cwd=REPO, env=environment, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert command.poll() is None, output.read_text()
            assert time.monotonic() < deadline, f"run {held_run} never held: {output.read_text()}"
            time.sleep(0.1)
        held = [psutil.Process(int(pid)) for pid in marker.read_text().split()]
        command.terminate()
        assert command.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
    said = output.read_text()
    finished = held_run - 1
    assert f"stopped during run {held_run} of 2" in said, said
    assert re.search(rf"launcher +{finished} runs +0 failed", said), said
    recorded = json.loads(report.read_text())["launcher"]
    assert recorded["runs"] == finished and recorded["failed_runs"] == 0
    assert len(recorded["seconds"]) == finished
    _, alive = psutil.wait_procs(held, timeout=15)
    for process in alive:
        process.kill()
    assert not alive, [" ".join(process.cmdline()[:4]) for process in alive]
