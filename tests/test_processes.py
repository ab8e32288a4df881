"""A command started detached outlives the shell that started it; one started as a plain
child does not; and Ctrl-C stops a command even where SIGINT was inherited ignored.

Real shells and real signals: ``bash -c '... &'`` exits at once, as a terminal does
when closed after ``nohup cmd &``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# a command's __main__ in miniature: start_command, then live 4 s and say so
COMMAND = (
    "import sys, time; from plumbing.processes import start_command; start_command(); "
    "time.sleep(4); open(sys.argv[1], 'w').write('alive')"
)


def _started_from_a_shell_that_exits(prefix: str, marker: Path) -> None:
    # the shell lives 2 s (past the command's start_command), then exits
    script = f'{prefix} {sys.executable} -c "{COMMAND}" {marker} >/dev/null 2>&1 & sleep 2'
    subprocess.run(["bash", "-c", script], cwd=REPO, check=True, timeout=30)


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
