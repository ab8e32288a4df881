"""A command started detached outlives the shell that started it; one started as a plain
child does not; and Ctrl-C stops a command even where SIGINT was inherited ignored.

Real shells and real signals: ``bash -c '... &'`` exits at once, as a terminal does
when closed after ``nohup cmd &``."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from plumbing.processes import LEFT_ALONE_S, parent_bound_command, tree_bound_command

REPO = Path(__file__).resolve().parents[1]
# a command's __main__ in miniature: start_command, then live 4 s and say so
COMMAND = (
    "import sys, time; from plumbing.processes import start_command; start_command(); "
    "time.sleep(4); open(sys.argv[1], 'w').write('alive')"
)


def _started_from_a_shell_that_exits(prefix: str, marker: Path) -> None:
    # the shell lives 2 s (past the command's start_command), then exits
    command = f"{shlex.quote(sys.executable)} -c {shlex.quote(COMMAND)} {shlex.quote(str(marker))}"
    script = f"{prefix} {command} >/dev/null 2>&1 & sleep 2"
    subprocess.run(
        ["bash", "-c", script], cwd=REPO, check=True, timeout=30,
        # a terminal's shell: SIGHUP at its default, whatever the suite inherited (under
        # `nohup make test` it is ignored, and a plain `&` is then `nohup cmd &`)
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent binding is Linux's")
@pytest.mark.parametrize(("prefix", "survives"), [("nohup", True), ("setsid", True), ("", False)])
def test_detached_commands_outlive_their_shell_and_bound_ones_do_not(
    tmp_path: Path, prefix: str, survives: bool
) -> None:
    marker = tmp_path / "marker"
    _started_from_a_shell_that_exits(prefix, marker)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not marker.exists():
        time.sleep(0.2)
    assert marker.exists() is survives, f"{prefix or 'plain &'}: marker {marker.exists()}"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent binding is Linux's")
def test_a_command_inheriting_nohup_still_ends_with_its_program_parent(tmp_path: Path) -> None:
    """Under ``nohup make test &`` every process inherits SIGHUP ignored: a stage command
    run by ``dvc repro`` (a program, not a shell) must still end when DVC is killed, or its
    training job runs on to the end (test_resume's flake)."""
    marker = tmp_path / "marker"
    parent = (  # a program that starts the command, then dies outright 2 s later
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {COMMAND!r}, {str(marker)!r}])\n"
        "time.sleep(2)\n"
    )
    subprocess.run(
        [sys.executable, "-c", parent], cwd=REPO, check=True, timeout=30,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),  # as nohup leaves it
    )  # fmt: skip
    time.sleep(4)  # the command would have written its marker by now
    assert not marker.exists()


def test_ctrl_c_stops_a_command_started_with_sigint_ignored(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", COMMAND, str(tmp_path / "marker")],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # inherited ignored
    )
    time.sleep(1.5)  # past start_command
    os.kill(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=10)
    assert process.returncode != 0 and "KeyboardInterrupt" in err
    assert not (tmp_path / "marker").exists()


# a launcher in miniature: starts a child in a session of its own (as hydra starts each ssh),
# writes the child's pid to argv[1], then exits with status argv[2] (or lives, given "live")
LAUNCHER = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
    "open(sys.argv[1], 'w').write(str(child.pid))\n"
    "if sys.argv[2] == 'live':\n"
    "    time.sleep(600)\n"
    "sys.exit(int(sys.argv[2]))\n"
)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for_pid(path: Path) -> int:
    deadline = time.monotonic() + 20
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, "the launcher never started its child"
        time.sleep(0.1)
    return int(path.read_text())


@contextlib.contextmanager
def _supervised(argv: list[str], grace_s: float = 3.0) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` started under tree_bound_command's supervisor; killed if a test leaves it."""
    process = subprocess.Popen(tree_bound_command(argv, grace_s), cwd=REPO)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent binding is Linux's")
@pytest.mark.parametrize(("bind", "outlives"), [(tree_bound_command, False),
                                                (parent_bound_command, True)])  # fmt: skip
def test_a_launcher_killed_with_its_caller_leaves_no_child_of_another_session(
    tmp_path: Path, bind: Callable[[list[str]], list[str]], outlives: bool
) -> None:
    """The caller (a flow) is killed outright while its launcher runs: with
    tree_bound_command nothing the launcher started is left, even in a session of its own;
    bound by parent_bound_command alone (the launcher only), that child lives on."""
    pid_file = tmp_path / "child.pid"
    caller = (  # starts the bound launcher, then waits to be killed
        "import subprocess, sys, time\n"
        f"from plumbing.processes import {bind.__name__} as bind\n"
        f"launcher = [sys.executable, '-c', {LAUNCHER!r}, {str(pid_file)!r}, 'live']\n"
        "subprocess.Popen(bind(launcher), start_new_session=True)\n"
        "time.sleep(600)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", caller], cwd=REPO)
    child = _wait_for_pid(pid_file)
    try:
        process.kill()
        process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive(child) is outlives
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent binding is Linux's")
@pytest.mark.parametrize("status", [0, 3])
def test_a_tree_bound_launcher_exits_as_it_did_and_leaves_nothing(
    tmp_path: Path, status: int
) -> None:
    pid_file = tmp_path / "child.pid"
    command = tree_bound_command([sys.executable, "-c", LAUNCHER, str(pid_file), str(status)])
    finished = subprocess.run(command, cwd=REPO, timeout=30)
    child = int(pid_file.read_text())
    try:
        assert finished.returncode == status
        assert not _alive(child), "the child in its own session outlived the launcher"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent binding is Linux's")
def test_a_tree_bound_launcher_stopped_stops_all_under_it_with_the_shell_status(
    tmp_path: Path,
) -> None:
    """SIGTERM to the supervisor (what a flow's Ctrl-C sends the job): the launcher and its
    child in another session end, and the status says SIGTERM ended the launcher."""
    pid_file = tmp_path / "child.pid"
    command = tree_bound_command([sys.executable, "-c", LAUNCHER, str(pid_file), "live"])
    process = subprocess.Popen(command, cwd=REPO)
    child = _wait_for_pid(pid_file)
    try:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 128 + signal.SIGTERM
        assert not _alive(child)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent binding is Linux's")
def test_a_tree_bound_launcher_keeps_every_descriptor_it_was_given() -> None:
    """A launcher's ranks write to a descriptor their environment names (plumbing.output),
    not only to standard output: the supervisor must pass it on. Closing it sent every
    rank line through MPICH's fork launcher's relay, bytes of two ranks interleaved and
    the job's progress seen only at its end."""
    read_end, write_end = os.pipe()
    program = [sys.executable, "-c", f"import os; os.write({write_end}, b'whole line\\n')"]
    try:
        done = subprocess.run(tree_bound_command(program), pass_fds=(write_end,), timeout=30)
        os.close(write_end)
        assert done.returncode == 0
        with os.fdopen(read_end, "rb") as reader:
            assert reader.read() == b"whole line\n"
    finally:
        with contextlib.suppress(OSError):
            os.close(write_end)


# a program whose child leaves a short-lived grandchild behind (a daemon's double fork,
# slurmd's slurmstepd), then runs on; the grandchild's pid in argv[1]
_ORPHANING_PROGRAM = """
import subprocess, sys, time
leaver = "import subprocess, sys; print(subprocess.Popen(['sleep', '0.2']).pid)"
grandchild = subprocess.run([sys.executable, "-c", leaver], capture_output=True, text=True)
with open(sys.argv[1], "w") as pid_file:
    pid_file.write(grandchild.stdout.strip())
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent binding is Linux's")
def test_a_tree_bound_program_s_orphans_are_reaped_as_they_end_not_at_its_end(
    tmp_path: Path,
) -> None:
    """The supervisor adopts what the program's children orphan, and reaps each as it ends
    while the program runs on: left a zombie until the program's end, it looked alive to
    whoever waited for it to end (the Slurm tests' job steps under the flake hunt)."""
    pid_file = tmp_path / "grandchild.pid"
    with _supervised([sys.executable, "-c", _ORPHANING_PROGRAM, str(pid_file)]) as process:
        grandchild = _wait_for_pid(pid_file)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{grandchild}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() is None, "the program ended first: nothing tested"
        assert not Path(f"/proc/{grandchild}").exists(), "the ended orphan was left a zombie"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 128 + signal.SIGTERM


# a program that handles SIGTERM itself: a moment's cleanup, a marker, then its own status
_CLEANING_UP = """
import os, signal, sys, time
def clean_up(number, frame):
    time.sleep(0.5)
    open(sys.argv[2], "w").write("cleaned up")
    sys.exit(7)
signal.signal(signal.SIGTERM, clean_up)
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(60)
"""
# a launcher that ignores SIGTERM (MPICH's fork launcher) above a child that does not
_IGNORING_LAUNCHER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "600"], preexec_fn=lambda: signal.signal(
    signal.SIGTERM, signal.SIG_DFL))
open(sys.argv[1], "w").write(str(child.pid))
child.wait()  # reaped, and the launcher lives on
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent binding is Linux's")
def test_a_stopped_program_alone_under_the_supervisor_gets_its_grace(tmp_path: Path) -> None:
    """A program with no process under it, stopped: it is left its grace to handle SIGTERM
    itself, and the supervisor exits with the program's own status. SIGKILL on the heels
    of SIGTERM (it alone was left) cut its cleanup short: exit 137, nothing written."""
    ready, cleaned = tmp_path / "ready", tmp_path / "cleaned"
    argv = [sys.executable, "-c", _CLEANING_UP, str(ready), str(cleaned)]
    with _supervised(argv, grace_s=30.0) as process:
        _wait_for_pid(ready)  # its handler is set
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 7
        assert cleaned.read_text() == "cleaned up"


# a program alone that ignores SIGTERM: only SIGKILL ends it
_IGNORING_PROGRAM = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent binding is Linux's")
def test_a_stopped_program_alone_that_ignores_sigterm_is_killed_when_its_grace_ends(
    tmp_path: Path,
) -> None:
    """Alone from the start, it has the whole grace (not LEFT_ALONE_S: it never had a
    tree), and not a moment more: SIGKILL at the grace's end, and nothing of it is left."""
    pid_file = tmp_path / "program.pid"
    grace_s = LEFT_ALONE_S + 2.0
    with _supervised([sys.executable, "-c", _IGNORING_PROGRAM, str(pid_file)], grace_s) as process:
        program = _wait_for_pid(pid_file)
        stopped = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 128 + signal.SIGKILL
        assert time.monotonic() - stopped >= grace_s
        assert not _alive(program)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent binding is Linux's")
def test_a_stopped_launcher_that_ignores_sigterm_is_killed_once_its_children_are_gone(
    tmp_path: Path,
) -> None:
    """A launcher that ignores SIGTERM, stopped with a child under it: once the child has
    ended, the launcher alone is left and is killed then, not at the end of its grace."""
    pid_file = tmp_path / "child.pid"
    argv = [sys.executable, "-c", _IGNORING_LAUNCHER, str(pid_file)]
    with _supervised(argv, grace_s=600.0) as process:
        child = _wait_for_pid(pid_file)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 128 + signal.SIGKILL  # the grace is 600 s
        assert not _alive(child)


# a launcher that, stopped, waits for its child to end, then cleans up and exits as it says
_CLEANING_LAUNCHER = """
import signal, subprocess, sys, time
child = subprocess.Popen(["sleep", "600"])
def clean_up(number, frame):
    child.wait()
    time.sleep(0.2)  # past the supervisor's look (every 50 ms), within LEFT_ALONE_S
    open(sys.argv[2], "w").write("cleaned up")
    sys.exit(5)
signal.signal(signal.SIGTERM, clean_up)
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent binding is Linux's")
def test_a_stopped_launcher_left_alone_has_a_moment_to_end_itself(tmp_path: Path) -> None:
    """A launcher whose children have ended is given LEFT_ALONE_S to end by itself (its own
    cleanup, its own status: a Python launcher's, or coverage's saving its data) before
    SIGKILL; killed as soon as it was alone, it left a half-written file."""
    pid_file, cleaned = tmp_path / "child.pid", tmp_path / "cleaned"
    argv = [sys.executable, "-c", _CLEANING_LAUNCHER, str(pid_file), str(cleaned)]
    with _supervised(argv, grace_s=600.0) as process:
        _wait_for_pid(pid_file)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 5
        assert cleaned.read_text() == "cleaned up"


# the launch's wrapper (tree_bound_command): a subreaper that reaps only at its end, above a
# launcher that stops a tree (a FLARE site) whose member (its job process) outlives it
_WRAPPER = """
import ctypes, json, os, subprocess, sys
assert ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
launcher = subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True)
said = json.loads(launcher.stdout)
print(json.dumps({**said, "left": os.path.exists(f"/proc/{said['child']}")}))
"""
_LAUNCHER = """
import json, subprocess, sys, time
from plumbing.processes import adopt_orphans, stop_trees
adopt_orphans()
site = subprocess.Popen([sys.executable, "-c", "import subprocess, time; "
                         "print(subprocess.Popen(['sleep', '60']).pid, flush=True); "
                         "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
child = int(site.stdout.readline())
started = time.monotonic()
stop_trees([site.pid], 8.0)
print(json.dumps({"took": time.monotonic() - started, "child": child}))
"""


def test_a_stopped_tree_is_reaped_at_once_under_a_subreaper_that_waits() -> None:
    """A site and its job process stopped together: the job process, ended after its
    parent, is not waited for as a zombie of the wrapper above (8 + 5 s, before); adopted
    by the launcher, it is reaped there, and nothing of it is left."""
    done = subprocess.run([sys.executable, "-c", _WRAPPER, _LAUNCHER], cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["took"] < 4.0 and not said["left"], said


# a participant (FLARE's site) and the job process it starts, unbound: the job process
# watches for its parent's death (exit_when_orphaned), its lines in argv[2], and otherwise
# lives 60 s
_JOB_PROCESS = """
import sys, time
from plumbing.processes import exit_when_orphaned
exit_when_orphaned(7, "the site is gone")
exit_when_orphaned(9, "a second watch")  # one a process: this one is not started
print("watching", file=sys.stderr, flush=True)
time.sleep(60)
"""
_PARTICIPANT = """
import subprocess, sys, time
with open(sys.argv[2], "w") as log:
    job = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stderr=log)
print(job.pid, flush=True)
time.sleep(60)
"""
# above them, a subreaper (as the launcher is, adopt_orphans): it kills the participant
# once the watch is on and a second has passed, and waits for the orphaned job process
_REAPER = """
import ctypes, json, os, subprocess, sys, time
import psutil
assert ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
participant = subprocess.Popen([sys.executable, "-c", *sys.argv[1:]], stdout=subprocess.PIPE)
job = int(participant.stdout.readline())
while "watching" not in open(sys.argv[3]).read():
    time.sleep(0.05)
time.sleep(1.0)  # four of the watch's polls: it lives while its participant does
# running or asleep, not a zombie its participant has yet to wait for (a watch that
# fired too early would leave one, /proc/PID still there)
alive = psutil.Process(job).status() != psutil.STATUS_ZOMBIE
participant.kill()
participant.wait()
killed = time.monotonic()
_, status = os.waitpid(job, 0)
print(json.dumps({"alive": alive, "took": time.monotonic() - killed,
                  "status": os.waitstatus_to_exitcode(status)}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers are Linux's")
def test_a_job_process_ends_at_once_when_its_participant_is_killed(tmp_path: Path) -> None:
    """A participant killed outright (SIGKILL), as FLARE's site by its killed launcher: its
    job process, which it did not bind, ends within a second with the status it was given
    (the first watch's) and says why; while the participant lives, it lives."""
    log = tmp_path / "job.err"
    done = subprocess.run([sys.executable, "-c", _REAPER, _PARTICIPANT, _JOB_PROCESS, str(log)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["alive"] and said["status"] == 7 and said["took"] < 2.0, said
    (line,) = [line for line in log.read_text().splitlines() if line != "watching"]
    assert line.startswith("the site is gone (process ") and line.endswith(", is gone)")


# a SIGINT whose handler runs inside a finaliser: Python prints its KeyboardInterrupt
# ("Exception ignored in") and drops it, as it does in any callback it cannot raise from
DROPPED_INTERRUPT = """
import os, signal, sys, time
from plumbing.processes import interruptible, interrupted
interruptible()
class Finaliser:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(3))  # the handler runs between these bytecodes
try:
    Finaliser()
    time.sleep(10)
    print("carried on")
except KeyboardInterrupt:
    print("interrupted", interrupted())
    sys.stdout.flush()
    raise
"""


def test_an_interrupt_whose_exception_python_dropped_is_raised_again() -> None:
    """A Ctrl-C whose ``KeyboardInterrupt`` Python could not pass on (raised in a
    finaliser) is raised again where the program runs next: the command stops (as a
    Ctrl-C's end: SIGINT, no traceback of the finaliser), recorded as interrupted."""
    done = subprocess.run([sys.executable, "-c", DROPPED_INTERRUPT], cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.stdout.strip() == "interrupted True", done.stdout + done.stderr
    assert done.returncode == -signal.SIGINT, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
