"""An expected error through a flow command is one `error:` line and its exit status, with
no traceback on the terminal (Prefect's task and flow engines log one with every failed
run); a bug keeps its traceback and says where to report it. Real flows, real Prefect
servers, in subprocesses: the terminal a user sees."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import prefect_home_from

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys
    from prefect import flow, task

    from flows.server import run_flow_command
    from plumbing.verified import DamagedFileError
    from wsi.catalogue import DatasetRootError


    @task
    def fails(kind: str) -> None:
        if kind == "full":  # a real ENOSPC (/dev/full) while an atomic write is under way
            import os
            from plumbing.atomic import atomic_path

            with atomic_path(sys.argv[2]):
                os.write(os.open("/dev/full", os.O_WRONLY), b"the table")
        if kind == "damaged":
            raise DamagedFileError("runs/x/run.json", "its bytes are not those written",
                                   "train the run again")
        if kind == "pipeline":
            raise DatasetRootError("data/none", "no such directory")
        raise ZeroDivisionError("a bug")


    @flow
    def command(kind: str) -> None:
        fails(kind)


    sys.exit(run_flow_command(lambda: command(sys.argv[1]), failures=()))
    """
)


def _run(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                            timeout=300, env=env)  # fmt: skip
    return result.returncode, result.stdout + result.stderr


@pytest.fixture()
def harness_server() -> dict[str, str]:
    """An environment whose ``PREFECT_API_URL`` is the flow tests' server (conftest.py's
    harness), as a user's beside `make serve`: the script's runs report there, and do not
    each start a server of their own (6-15 s of CPU each; the commands below that start
    their own are flows.stage's, the sleeper's and the refusals')."""
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    assert api_url, "the flow tests' Prefect harness is not running"
    return {**os.environ, "PREFECT_API_URL": api_url}


@pytest.mark.parametrize(
    ("kind", "status", "line"),
    [
        ("damaged", 2, "error: runs/x/run.json: its bytes are not those written; train the run "
                       "again"),
        ("pipeline", 1, "error: data/none: no such directory"),
    ],
)  # fmt: skip
def test_an_expected_error_in_a_task_is_one_line_without_a_traceback(
    tmp_path: Path, harness_server: dict[str, str], kind: str, status: int, line: str
) -> None:
    script = tmp_path / "command.py"
    script.write_text(SCRIPT)
    code, output = _run(tmp_path, str(script), kind, env=harness_server)
    assert code == status, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert [row for row in output.splitlines() if row.startswith("error:")] == [line]
    assert "Finished in state Failed" in output  # Prefect's own one-line account stays


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_full_disk_is_one_line_that_names_the_file_and_exit_3(
    tmp_path: Path, harness_server: dict[str, str]
) -> None:
    script = tmp_path / "command.py"
    script.write_text(SCRIPT)
    table = tmp_path / "tables" / "accuracy.md"
    code, output = _run(tmp_path, str(script), "full", str(table), env=harness_server)
    assert code == 3, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert [row for row in output.splitlines() if row.startswith("error:")] == [
        f"error: {table}: no space left on its device (ENOSPC): free space there, or write "
        "elsewhere"
    ]
    assert list(table.parent.iterdir()) == []  # no half-written file left behind


def test_a_prefect_server_that_does_not_answer_is_one_line_and_exit_3(tmp_path: Path) -> None:
    """PREFECT_API_URL names a server that is gone (make serve's, stopped)."""
    from plumbing.network import free_port

    script = tmp_path / "command.py"
    script.write_text(SCRIPT)
    api = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    result = subprocess.run([sys.executable, str(script), "pipeline"], cwd=REPO, timeout=300,
                            capture_output=True, text=True,
                            env={**os.environ, "PREFECT_API_URL": api})  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 3, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    (line,) = [row for row in output.splitlines() if row.startswith("error:")]
    assert line.startswith(f"error: the server at {api}") and "does not answer" in line
    assert line.endswith("start it (make serve) or unset PREFECT_API_URL, and the command "
                         "starts a server of its own")  # fmt: skip


def test_a_prefect_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    """Its port taken: the server exits at once, and the error says so with what it said,
    not that it "did not start within 180 s"."""
    import socket

    from flows.server import ServerStartError, prefect_server

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerStartError) as raised, prefect_server(port=port):
            pass
    message = str(raised.value)
    assert "exited with code" in message and "within" not in message
    assert f"port {port} is already in use" in message.lower(), message  # what it said
    assert raised.value.exit_status == 3


def test_a_bug_keeps_its_traceback_and_says_where_to_report_it(
    tmp_path: Path, harness_server: dict[str, str]
) -> None:
    script = tmp_path / "command.py"
    script.write_text(SCRIPT)
    code, output = _run(tmp_path, str(script), "bug", env=harness_server)
    assert code == 1
    assert "Traceback" in output and "ZeroDivisionError: a bug" in output
    assert output.rstrip().splitlines()[-1] == (
        "error: ZeroDivisionError is a bug, not a bad input: please report it with the "
        "traceback above (docs/troubleshooting.md#reporting-a-bug)"
    )


def test_a_flow_command_stopped_by_its_inputs_prints_no_traceback(tmp_path: Path) -> None:
    """The staging command, its data root gone: the error is raised in a task of the flow."""
    code, output = _run(tmp_path, "-m", "flows.stage", "--data-root", str(tmp_path / "none"),
                        "--centers", "0", "--out", str(tmp_path / "staging"))  # fmt: skip
    assert code == 1 and "Traceback" not in output, output[-3000:]
    assert [row for row in output.splitlines() if row.startswith("error:")] == [
        f"error: {tmp_path / 'none'}: no such directory"
    ]


SLEEPER = textwrap.dedent(
    """
    import sys, time
    from prefect import flow

    from flows.server import run_flow_command


    @flow
    def sleeper() -> None:
        print("flow started", flush=True)
        time.sleep(600)


    @flow
    def quick() -> None:
        pass


    sys.exit(run_flow_command(sleeper if sys.argv[1] == "sleep" else quick, failures=()))
    """
)


def test_a_flow_run_whose_process_was_killed_is_marked_crashed_by_the_next_command(
    tmp_path: Path, prefect_home_template: Path
) -> None:
    """SIGKILL (a power loss) leaves its flow run Running in Prefect's database; the next
    command on that database marks it Crashed, and says so in one line."""
    import os
    import signal
    import time

    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    home = prefect_home_from(prefect_home_template, tmp_path / "prefect-home")
    env = {**os.environ, "PREFECT_HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen([sys.executable, str(script), "sleep"], cwd=REPO, env=env,
                             stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 240
    while "flow started" not in (tmp_path / "first.log").read_text():
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # the command, its server: everything at once
    first.wait()
    second = subprocess.run([sys.executable, str(script), "quick"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    notes = [line for line in second.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "1 flow run(s) of a process that is gone marked Crashed" in notes[0]
    again = subprocess.run([sys.executable, str(script), "quick"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0 and "note:" not in again.stderr  # marked once, for good


@pytest.mark.parametrize(
    ("command", "key"),
    [(["flows.report", "--out", "{file}"], "report.out"),
     (["flows.stage", "--step", "summary", "--summary", "{file}/staging.json"], "stage.summary"),
     (["flows.stage", "--step", "centres", "--out", "{file}/staging"], "stage.out")],
)  # fmt: skip
def test_an_output_folder_that_cannot_be_written_is_refused_before_any_work(
    tmp_path: Path, command: list[str], key: str
) -> None:
    """A path that is a file where the command writes a folder (read-only and other users'
    folders are refused the same way, but not to root, who may write anywhere)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    args = [part.replace("{file}", str(blocker)) for part in command]
    code, output = _run(tmp_path, "-m", *args)
    assert code == 2, output[-3000:]
    errors = [row for row in output.splitlines() if row.startswith("error:")]
    assert (
        len(errors) == 1
        and errors[0].startswith(f"error: {key}: ")
        and "not a directory" in errors[0]
    )
    assert "Flow run" not in output and "Traceback" not in output  # no flow was started
