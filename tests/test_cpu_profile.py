"""``python -m tests.cpu_profile``: each program's CPU, real processes read from /proc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.cpu_profile import Seen, by_program, by_test, program

REPO = Path(__file__).resolve().parents[1]

# spins until this process has used SPIN_S of CPU, then sleeps (so that a read sees all of
# it); "main" also starts itself as a command, forks a copy, and leaves an orphan (a
# grandchild whose parent ends at once), waits for all three (the orphan until it is
# reaped: exit 4 if it is not within 10 s), and exits 3
BUSY = """
import os, subprocess, sys, time
SPIN_S = 0.3

def spin():
    while time.process_time() < SPIN_S:
        pass
    time.sleep(0.4)

if sys.argv[1] == "main":
    spin()
    command = subprocess.Popen([sys.executable, sys.argv[0], "command"])
    if (forked := os.fork()) == 0:
        spin()
        os._exit(0)
    read_end, write_end = os.pipe()
    if (parent := os.fork()) == 0:
        if (orphan := os.fork()) == 0:  # holds the pipe's write end until it ends
            os.close(read_end)
            spin()
            os._exit(0)
        os.write(write_end, b"%d " % orphan)
        os._exit(0)
    os.close(write_end)
    os.waitpid(parent, 0)
    orphan = int(os.read(read_end, 32))
    os.read(read_end, 1)  # end of file: the orphan has ended
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # and is reaped by its subreaper, as init would
        try:
            os.kill(orphan, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        sys.exit(4)
    os.waitpid(forked, 0)
    command.wait()
    sys.exit(3)
spin()
"""


def test_each_process_is_counted_under_its_program_orphans_and_forks_included(
    tmp_path: Path,
) -> None:
    script = tmp_path / "busy.py"
    script.write_text(BUSY)
    record = tmp_path / "cpu.json"
    done = subprocess.run(
        [sys.executable, "-m", "tests.cpu_profile", "--interval", "0.05", "--json", str(record),
         "--by-test", "3", "--", sys.executable, str(script), "main"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTEST_CURRENT_TEST": "t.py::busy (call)"},
    )  # fmt: skip
    assert done.returncode == 3, done.stderr  # the command's own status
    programs = json.loads(record.read_text())["programs"]
    # the command, the command it started and the orphan (adopted: still under the
    # profiler) each ran busy.py; the fork is counted as one
    ran = [cpu for name, cpus in programs.items() if "busy.py" in name for cpu in cpus]
    assert sum(cpu >= 0.25 for cpu in ran) == 4, programs
    assert [cpu >= 0.25 for cpu in programs["forked from python busy.py"]].count(True) >= 1
    assert "python busy.py" in done.stderr and "in all" in done.stderr
    # each process by the test its environment named (PYTEST_CURRENT_TEST, set below)
    tests = json.loads(record.read_text())["tests"]
    assert sum(cpu >= 0.25 for cpus in tests["t.py::busy"].values() for cpu in cpus) == 4


def test_the_processes_of_a_test_are_those_started_in_it_and_their_descendants() -> None:
    seen = {
        (1, 1): Seen(0, ("python", "-m", "pytest"), 9.0, None),
        (10, 2): Seen(1, ("python", "-m", "flows.train"), 2.0, "t.py::a"),
        (11, 3): Seen(10, ("python", "-m", "plumbing.warm"), 4.0, None),  # a cleared env
        (12, 4): Seen(11, ("python", "-m", "plumbing.warm"), 1.0, "t.py::a"),  # the rank
        (20, 5): Seen(1, ("prefect", "server"), 3.0, "t.py::b"),
        # a rank of test c forked from the server test a started: a fork all the same
        (30, 6): Seen(11, ("python", "-m", "plumbing.warm"), 0.5, "t.py::c"),
    }
    assert by_test(seen) == {
        "(no test)": {"python -m pytest": [9.0]},
        "t.py::a": {"python -m flows.train": [2.0], "python -m plumbing.warm": [4.0],
                    "forked from python -m plumbing.warm": [1.0]},
        "t.py::b": {"prefect": [3.0]},
        "t.py::c": {"forked from python -m plumbing.warm": [0.5]},
    }  # fmt: skip


def test_a_program_is_its_module_script_or_executable() -> None:
    assert (
        program(["/v/bin/python", "-m", "flows.train", "--seeds", "0"]) == "python -m flows.train"
    )
    assert program(["python3.12", "-X", "importtime", "-m", "dvc"]) == "python -m dvc"
    assert program(["/v/bin/python", "/v/bin/prefect", "server", "start"]) == "python prefect"
    assert program(["python", "-c", "pass"]) == "python -c"
    assert program(["/usr/bin/mpiexec.hydra", "-n", "2"]) == "mpiexec.hydra"
    assert program([]) == "?"


def test_a_fork_is_counted_under_its_parents_program() -> None:
    seen = {
        (10, 1): Seen(1, ("python", "-m", "plumbing.warm"), 4.0),
        (11, 2): Seen(10, ("python", "-m", "plumbing.warm"), 1.5),
        (12, 3): Seen(10, ("mpiexec", "-n", "2"), 0.5),
    }
    assert by_program(seen) == {"python -m plumbing.warm": [4.0],
                                "forked from python -m plumbing.warm": [1.5],
                                "mpiexec": [0.5]}  # fmt: skip
