"""Ranks forked from a warm server (plumbing.warm): a rank started through its shim gets
what exec would have given it, the server's imports done once, and no process outlives the
server or its shim. Real processes, real descriptor passing; the MPI side is in
tests/proxyfl/test_launch_mpi.py (every job there runs warm)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from plumbing.warm import DISABLE_ENV, WarmRanks, kept_warm_server, warm_server
from plumbing.warm_shim import FORWARDED, HEADER, SOCKET_ENV, STARTED_ENV
from tests.conftest import command_line

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

# What the forked rank runs: it reports what it inherited, then does what it is told.
PROGRAM = """
import json, os, signal, sys, time
import warm_probe_preload
out = os.environ["PROBE_OUT"]
report = {
    "argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid(),
    "env": os.environ.get("PROBE_VALUE"), "started": os.environ.get("STARTED_ENV"),
    "preloaded_before_main": warm_probe_preload.IMPORTED_BEFORE_MAIN,
    "extra_fd": os.read(int(os.environ["PROBE_FD"]), 100).decode(),
    "ignored": [name for name in ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1")
                if signal.getsignal(getattr(signal, name)) == signal.SIG_IGN],
}
with open(out, "w") as handle:
    json.dump(report, handle)
action = sys.argv[1]
if action == "exit":
    sys.exit(int(sys.argv[2]))
if action == "kill-self":
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
def wait():
    # a minute in short sleeps: a signal whose handler the interpreter has not run yet when
    # a sleep begins (it arrived as this process was writing .ready, after the last check)
    # does not end that sleep, only the next check; one sleep of 60 s missed the test's
    # SIGINT for its whole minute, 4 times in 300 beside a hog
    for _ in range(600):
        time.sleep(0.1)
if action == "wait-for-usr1":
    def on_usr1(number, frame):
        sys.exit(42)
    signal.signal(signal.SIGUSR1, on_usr1)
    with open(out + ".ready", "w"):
        pass
    wait()
if action == "sleep":
    with open(out + ".ready", "w"):
        pass
    wait()
""".replace("STARTED_ENV", STARTED_ENV)

PRELOAD = """
import os
with open(os.environ["PRELOAD_LOG"], "a") as handle:
    handle.write(f"{os.getpid()}\\n")
IMPORTED_BEFORE_MAIN = True
"""


@pytest.fixture
def modules(tmp_path: Path) -> Path:
    directory = tmp_path / "modules"
    directory.mkdir()
    (directory / "warm_probe.py").write_text(PROGRAM)
    (directory / "warm_probe_preload.py").write_text(PRELOAD)
    return directory


def _environment(modules: Path, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{modules}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "PRELOAD_LOG": str(tmp_path / "preload.log")}  # fmt: skip


# The shim's launcher (mpiexec, as the shell that started it left it): the signals named in
# its first argument ignored (a background job of a script: SIGINT and SIGQUIT), the others
# at their default, whatever the test process inherited (CI's ignores SIGINT); then the shim
LAUNCHER = """
import os, signal, sys
ignoring = sys.argv[1].split(",")
for name in ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2"):
    signal.signal(getattr(signal, name), signal.SIG_IGN if name in ignoring else signal.SIG_DFL)
os.execv(sys.argv[2], sys.argv[2:])
"""


def _start(warm: WarmRanks, env: dict[str, str], tmp_path: Path, name: str, *args: str,
           value: str = "v", ignoring: tuple[str, ...] = (), starter: list[str] | None = None,
           ) -> tuple[subprocess.Popen[bytes], Path]:  # fmt: skip
    """A rank started as mpiexec would: through the shim, with one extra descriptor (a
    pipe holding a word) at a number the program is told, and the signals named in
    ``ignoring`` inherited ignored; or by ``starter``, a command that starts the shim
    (its standard output a pipe)."""
    out = tmp_path / f"{name}.json"
    read_end, write_end = os.pipe()
    os.write(write_end, name.encode())
    os.close(write_end)
    rank_env = {**warm.environment(), **env, "PROBE_OUT": str(out),
                "PROBE_VALUE": value, "PROBE_FD": str(read_end)}  # fmt: skip
    launcher = starter or [sys.executable, "-I", "-S", "-c", LAUNCHER, ",".join(ignoring)]
    command = [*launcher, *warm.program([sys.executable, "-m", "warm_probe", *args])]
    cwd = tmp_path / name
    cwd.mkdir()
    process = subprocess.Popen(command, env=rank_env, cwd=cwd, pass_fds=(read_end,),
                               stdout=None if starter is None else subprocess.PIPE)  # fmt: skip
    os.close(read_end)
    return process, out


def _wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:  # gone, or gone between two looks
            return True
        time.sleep(0.02)
    return False


def test_a_forked_rank_gets_what_exec_would_have_given_it(modules: Path, tmp_path: Path) -> None:
    """argv, environment, working directory, a passed descriptor at its number, the exit
    status; the preloaded module imported once, by the server, for both ranks; the rank's
    start-up counted from its shim's start."""
    env = _environment(modules, tmp_path)
    with warm_server(env, ["warm_probe_preload"]) as warm:
        assert warm is not None
        first, first_out = _start(warm, env, tmp_path, "a", "exit", "3", value="one")
        second, second_out = _start(warm, env, tmp_path, "b", "exit", "0", value="two")
        assert first.wait(timeout=60) == 3
        assert second.wait(timeout=60) == 0
    for out, name, value, process in ((first_out, "a", "one", first),
                                      (second_out, "b", "two", second)):  # fmt: skip
        report = json.loads(out.read_text())
        assert report["argv"] == ["exit", "3" if name == "a" else "0"]
        assert report["cwd"] == str(tmp_path / name)
        assert report["env"] == value
        assert report["extra_fd"] == name
        assert report["preloaded_before_main"] is True
        assert report["pid"] != process.pid  # forked by the server, not the shim itself
        assert report["started"] is not None  # the shim's start, for the rank's start-up
    # imported once, in the server (not in either rank)
    assert len((tmp_path / "preload.log").read_text().split()) == 1


def test_without_a_server_the_shim_starts_the_rank_cold(modules: Path, tmp_path: Path) -> None:
    """A shim whose server has stopped (its socket gone), or that names none, executes the
    program itself; PLUMBING_COLD_RANKS=1 starts no server."""
    env = _environment(modules, tmp_path)
    with warm_server(env, []) as warm:
        assert warm is not None
    process, out = _start(warm, env, tmp_path, "stopped", "exit", "5")
    assert process.wait(timeout=60) == 5
    assert json.loads(out.read_text())["pid"] == process.pid  # executed in place: no fork
    unnamed = WarmRanks(tmp_path / "unused")
    process, out = _start(unnamed, {**env, SOCKET_ENV: ""}, tmp_path, "unnamed", "exit", "4")
    assert process.wait(timeout=60) == 4
    assert json.loads(out.read_text())["pid"] == process.pid
    with warm_server({**env, DISABLE_ENV: "1"}, []) as disabled:
        assert disabled is None


def test_a_rank_ignores_the_signals_its_launcher_left_ignored_forked_or_cold(
    modules: Path, tmp_path: Path
) -> None:
    """A background job of a script starts mpiexec, and so the shims, with SIGINT and
    SIGQUIT ignored: the forked rank starts with them ignored, as the rank a shim executes
    cold does; a rank whose shim inherited nothing ignored ignores none (the server itself
    ignores SIGINT)."""
    env = _environment(modules, tmp_path)
    background = ("SIGINT", "SIGQUIT")
    with warm_server(env, []) as warm:
        assert warm is not None
        forked, forked_out = _start(warm, env, tmp_path, "forked", "exit", "0", ignoring=background)
        plain, plain_out = _start(warm, env, tmp_path, "plain", "exit", "0")
        assert forked.wait(timeout=60) == 0 and plain.wait(timeout=60) == 0
    cold, cold_out = _start(warm, env, tmp_path, "cold", "exit", "0", ignoring=background)
    assert cold.wait(timeout=60) == 0
    forked_report, plain_report, cold_report = (
        json.loads(out.read_text()) for out in (forked_out, plain_out, cold_out)
    )
    assert forked_report["pid"] != forked.pid and cold_report["pid"] == cold.pid
    assert forked_report["ignored"] == cold_report["ignored"] == ["SIGINT", "SIGQUIT"]
    assert plain_report["ignored"] == []


def test_a_shim_catches_what_it_forwards_before_it_asks_for_its_rank(
    modules: Path, tmp_path: Path
) -> None:
    """No signal mpiexec sends while the server forks is lost: once the shim's request
    reaches the server the shim already catches every signal it forwards, those its
    launcher left ignored too (CI lost a Ctrl-C there: the shim ran on, its rank never
    told), and names those in the request; a server that then hangs up leaves the rank to
    start cold, ignoring them as they were inherited."""
    # an environment larger than the socket's buffer: the shim is still sending its request
    # when the header is read, and cannot yet have done what it does after sending
    padding = {f"PROBE_PADDING_{n}": "x" * 100_000 for n in range(12)}
    env = {**_environment(modules, tmp_path), **padding}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(tmp_path / "server.socket"))
        listener.listen(1)
        listener.settimeout(60)
        ranks = WarmRanks(tmp_path / "server.socket")
        process, out = _start(ranks, env, tmp_path, "asking", "exit", "0",
                              ignoring=("SIGINT", "SIGQUIT"))  # fmt: skip
        connection, _ = listener.accept()
        with connection:
            header, fds, _, _ = socket.recv_fds(connection, HEADER.size, 1024)
            for fd in fds:
                os.close(fd)
            status = Path(f"/proc/{process.pid}/status").read_text()
            caught = int(status.split("SigCgt:")[1].split()[0], 16)
            missed = [signal.Signals(n).name for n in FORWARDED if not caught >> (n - 1) & 1]
            assert not missed, f"not caught while the request comes: {missed}"
            (length,) = HEADER.unpack(header)
            body = b""
            while len(body) < length:
                chunk = connection.recv(length - len(body))
                assert chunk, "the shim hung up before its request was whole"
                body += chunk
            assert len(body) > 1_000_000
            assert json.loads(body)["ignored_signals"] == [signal.SIGINT, signal.SIGQUIT]
    assert process.wait(timeout=60) == 0
    assert json.loads(out.read_text())["ignored"] == ["SIGINT", "SIGQUIT"]


# A preload that fails once a shim waits in the server's queue (the listener's descriptor is
# the server's first argument): the server ends with a rank asked for and none forked.
BROKEN_PRELOAD = """
import select, socket, sys
listener = socket.socket(fileno=int(sys.argv[1]))
select.select([listener], [], [], 60)
listener.detach()
raise ImportError("warm_probe_broken: this install is broken")
"""


def test_a_shim_whose_server_ends_before_forking_starts_its_rank_cold(
    modules: Path, tmp_path: Path
) -> None:
    """A server whose imports fail while a shim waits for it: the shim runs its rank
    itself (whose own imports then say what is broken), never a traceback of its own."""
    (modules / "warm_probe_broken.py").write_text(BROKEN_PRELOAD)
    env = _environment(modules, tmp_path)
    with warm_server(env, ["warm_probe_broken"]) as warm:
        assert warm is not None
        out = tmp_path / "queued.json"
        read_end, write_end = os.pipe()
        os.write(write_end, b"queued")
        os.close(write_end)
        command = warm.program([sys.executable, "-m", "warm_probe", "exit", "6"])
        (tmp_path / "queued").mkdir()
        process = subprocess.Popen(
            command, cwd=tmp_path / "queued", pass_fds=(read_end,), stderr=subprocess.PIPE,
            env={**warm.environment(), **env, "PROBE_OUT": str(out), "PROBE_VALUE": "v",
                 "PROBE_FD": str(read_end)},
        )  # fmt: skip
        os.close(read_end)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 6, stderr.decode()
    assert json.loads(out.read_text())["pid"] == process.pid  # executed in place
    assert b"ended before starting the rank; starting cold" in stderr
    assert b"Traceback" not in stderr


def test_a_rank_killed_by_a_signal_ends_its_shim_by_the_same_signal(
    modules: Path, tmp_path: Path
) -> None:
    """Any signal, SIGKILL included (the OOM killer's, which no handler can take: the shim
    reported it as SIGQUIT while it tried to install one)."""
    env = _environment(modules, tmp_path)
    with warm_server(env, []) as warm:
        for name in ("SIGBUS", "SIGKILL"):
            process, _ = _start(warm, env, tmp_path, name.lower(), "kill-self", name)
            assert process.wait(timeout=60) == -getattr(signal, name), name


def test_signals_sent_to_the_shim_reach_the_rank(modules: Path, tmp_path: Path) -> None:
    env = _environment(modules, tmp_path)
    with warm_server(env, []) as warm:
        process, out = _start(warm, env, tmp_path, "usr1", "wait-for-usr1")
        _wait_for(Path(str(out) + ".ready"))
        process.send_signal(signal.SIGUSR1)
        assert process.wait(timeout=60) == 42  # the rank's handler chose the status


def test_a_rank_dies_with_its_shim_and_with_the_server(modules: Path, tmp_path: Path) -> None:
    """SIGKILL to a shim (mpiexec's, or the OOM killer's) kills its rank; a server stopped
    while a rank runs kills it; nothing is left."""
    env = _environment(modules, tmp_path)
    with warm_server(env, []) as warm:
        killed, killed_out = _start(warm, env, tmp_path, "killed", "sleep")
        orphaned, orphaned_out = _start(warm, env, tmp_path, "orphaned", "sleep")
        _wait_for(Path(str(killed_out) + ".ready"))
        _wait_for(Path(str(orphaned_out) + ".ready"))
        ranks = {name: json.loads(out.read_text())["pid"]
                 for name, out in (("killed", killed_out), ("orphaned", orphaned_out))}  # fmt: skip
        killed.kill()
        assert killed.wait(timeout=60) == -signal.SIGKILL
        assert _gone(ranks["killed"]), "the rank outlived its shim"
        assert psutil.pid_exists(ranks["orphaned"])
        servers = _servers()
        assert len(servers) == 1
    assert _gone(ranks["orphaned"]), "the rank outlived the server"
    assert orphaned.wait(timeout=60) != 0  # its shim says the rank did not finish
    assert _gone(servers[0].pid)


# A FLARE site, as a shim's starter: it starts the shim as its child (the descriptor the
# probe reads passed on, the shim's standard error to a file), says the shim's pid, waits
STARTER = """
import os, subprocess, sys, time
with open(sys.argv[1], "w") as said:
    shim = subprocess.Popen(sys.argv[2:], pass_fds=(int(os.environ["PROBE_FD"]),), stderr=said)
print(shim.pid, flush=True)
time.sleep(120)
"""


def test_a_rank_ends_when_whoever_started_its_shim_is_killed(modules: Path, tmp_path: Path) -> None:
    """A FLARE site killed outright while its job process, forked warm, runs: the rank's
    parent is the server, so only its shim, the site's child, can tell. The shim says so
    and ends, killed, with its rank, while the server serves on (before: the rank ran on
    until the whole launch ended)."""
    env = _environment(modules, tmp_path)
    with warm_server(env, []) as warm:
        assert warm is not None
        shim_said = tmp_path / "shim.err"
        site, out = _start(warm, env, tmp_path, "site", "sleep",
                           starter=[sys.executable, "-c", STARTER, str(shim_said)])  # fmt: skip
        assert site.stdout is not None
        shim = int(site.stdout.readline())
        _wait_for(Path(str(out) + ".ready"))
        rank = json.loads(out.read_text())["pid"]
        assert rank != shim and psutil.pid_exists(rank)
        site.kill()
        site.wait()
        assert _gone(rank), "the rank outlived the site that started its shim"
        assert _gone(shim)
        assert (f"warm_shim: process {site.pid}, which started this one, is gone; the rank "
                "ends") in shim_said.read_text()  # fmt: skip
        process, _ = _start(warm, env, tmp_path, "after", "exit", "0")
        assert process.wait(timeout=60) == 0


def _closed_everywhere(write_end: int, timeout: float = 10.0) -> bool:
    """Whether every read end of the pipe has been closed (a write then fails)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.write(write_end, b"x")
        except BrokenPipeError:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("fault", ["cut short", "not a request", "descriptors miscounted"])
def test_a_malformed_request_is_refused_and_its_descriptors_closed(
    modules: Path, tmp_path: Path, fault: str
) -> None:
    """A connection that sends descriptors and then no well-formed request: the server
    closes what it received (no descriptor kept open for the job's life) and goes on
    forking the ranks that ask properly."""
    env = _environment(modules, tmp_path)
    with warm_server(env, []) as warm:
        assert warm is not None
        read_end, write_end = os.pipe()
        body = json.dumps({"argv": ["x"], "env": {}, "cwd": "/", "fds": [7, 8],
                           "shim_pid": 1}).encode()  # fmt: skip
        if fault == "not a request":
            body = json.dumps({"fds": [7]}).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(warm.socket_path))
            socket.send_fds(connection, [HEADER.pack(len(body))], [read_end])
            connection.sendall(body[:10] if fault == "cut short" else body)
        os.close(read_end)
        try:
            assert _closed_everywhere(write_end), "the server kept a refused descriptor"
        finally:
            os.close(write_end)
        process, out = _start(warm, env, tmp_path, "after", "exit", "0")
        assert process.wait(timeout=60) == 0
        assert json.loads(out.read_text())["pid"] != process.pid, "the server is gone"


def test_a_shim_gone_with_its_reply_unread_ends_its_rank_and_not_the_server(
    modules: Path, tmp_path: Path
) -> None:
    """A shim killed before it read the server's reply ("pid N") resets the connection: the
    server's read meets ECONNRESET, not an end of file. It ends that rank, as for a shim
    that closed, and goes on forking (it once died of it, with a traceback, mid-job)."""
    env = _environment(modules, tmp_path)
    with warm_server(env, []) as warm:
        assert warm is not None
        out = tmp_path / "reset.json"
        read_end, write_end = os.pipe()
        os.write(write_end, b"reset")
        os.close(write_end)
        rank_env = {**warm.environment(), **env, "PROBE_OUT": str(out), "PROBE_VALUE": "v",
                    "PROBE_FD": "5"}  # fmt: skip
        body = json.dumps({"argv": [sys.executable, "-m", "warm_probe", "sleep"],
                           "env": rank_env, "cwd": str(tmp_path), "fds": [5],
                           "shim_pid": os.getpid(), "ignored_signals": []}).encode()  # fmt: skip
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(str(warm.socket_path))
        socket.send_fds(connection, [HEADER.pack(len(body))], [read_end])
        connection.sendall(body)
        os.close(read_end)
        _wait_for(Path(str(out) + ".ready"))  # forked, so the reply was sent
        connection.close()  # with the reply unread: a reset
        rank = json.loads(out.read_text())["pid"]
        assert _gone(rank), "the rank of the reset connection still runs"
        process, after = _start(warm, env, tmp_path, "after", "exit", "0")
        assert process.wait(timeout=60) == 0
        assert json.loads(after.read_text())["pid"] != process.pid, "the server is gone"


_BEFORE: set[int] = set()  # warm servers this process had when the test began


@pytest.fixture(autouse=True)
def _servers_of_other_tests() -> None:
    """A warm server the test process keeps for other tests' MPI jobs (the proxyfl tests'
    run_mpi) is not this test's."""
    _BEFORE.clear()
    _BEFORE.update(p.pid for p in psutil.Process().children() if "plumbing.warm" in command_line(p))


def _servers() -> list[psutil.Process]:
    """The warm servers this test started that are running."""
    return [p for p in psutil.Process().children()
            if p.pid not in _BEFORE and "plumbing.warm" in command_line(p)]  # fmt: skip


def test_a_kept_server_serves_every_job_of_its_block(modules: Path, tmp_path: Path) -> None:
    """Jobs inside kept_warm_server fork their ranks from the one server it started (the
    imports done once for all); a job of another environment gets its own; the kept server
    is gone after the block, and a nested block uses the one already kept."""
    env = _environment(modules, tmp_path)
    with kept_warm_server(env, ["warm_probe_preload"]) as kept:
        assert kept is not None and len(_servers()) == 1
        with kept_warm_server(env, ["warm_probe_preload"]) as nested:
            assert nested == kept
        for name in ("first", "second"):
            with warm_server(env, ["warm_probe_preload"]) as warm:
                assert warm == kept
                process, out = _start(warm, env, tmp_path, name, "exit", "0")
                assert process.wait(timeout=60) == 0
                assert json.loads(out.read_text())["preloaded_before_main"] is True
        assert len((tmp_path / "preload.log").read_text().split()) == 1  # imported once
        other = {**env, "PROBE_SETTING": "another"}
        with warm_server(other, ["warm_probe_preload"]) as own:
            assert own is not None and own != kept
            process, _ = _start(own, other, tmp_path, "other", "exit", "0")
            assert process.wait(timeout=60) == 0
        assert len((tmp_path / "preload.log").read_text().split()) == 2
        kept_server = _servers()
        assert len(kept_server) == 1  # the other job's server stopped with its job
    assert _gone(kept_server[0].pid)


# A command started inside a shared block, as dvc repro starts a stage: its ranks'
# environment is its own (what it inherited, and argv[1] as JSON over it: a shell's SHLVL
# and PWD, DVC's variables), and it runs one job of one rank (whose own variables are
# argv[2]) through warm_server.
COMMAND_OF_A_BLOCK = """
import json, os, subprocess, sys
from plumbing.warm import warm_server
env = {**os.environ, **json.loads(sys.argv[1])}
with warm_server(env, ["warm_probe_preload"]) as warm:
    rank_env = {**warm.environment(), **env, **json.loads(sys.argv[2])}
    subprocess.run(warm.program([sys.executable, "-m", "warm_probe", "exit", "0"]),
                   env=rank_env, check=True)
print(json.dumps({"socket": str(warm.socket_path)}))
"""


def test_a_shared_server_serves_the_jobs_of_the_commands_of_its_block(
    modules: Path, tmp_path: Path
) -> None:
    """kept_warm_server(shared=True): a command started in the block (a process of its
    own) forks its ranks from the block's server where its ranks' environment is the
    block's but for what a shell or DVC sets per command; one whose environment differs
    in anything else starts its own; after the block, commands start their own."""
    env = _environment(modules, tmp_path)

    def command(extra: dict[str, str], name: str) -> tuple[Path, dict[str, object]]:
        out = tmp_path / f"{name}.json"
        per_command = {"SHLVL": "7", "PWD": str(tmp_path), "DVC_STAGE": f"train@{name}"}
        rank = {"PROBE_OUT": str(out), "PROBE_VALUE": name, "PROBE_FD": "0"}
        printed = subprocess.run(
            [sys.executable, "-c", COMMAND_OF_A_BLOCK, json.dumps({**per_command, **extra}),
             json.dumps(rank)],
            env={**os.environ, **env}, check=True, capture_output=True, text=True, timeout=120,
            stdin=subprocess.DEVNULL,
        ).stdout  # fmt: skip
        return Path(json.loads(printed)["socket"]), json.loads(out.read_text())

    with kept_warm_server(env, ["warm_probe_preload"], shared=True) as kept:
        assert kept is not None
        socket_path, report = command({}, "alike")
        assert socket_path == kept.socket_path and report["preloaded_before_main"] is True
        assert len((tmp_path / "preload.log").read_text().split()) == 1  # the block's only
        socket_path, _ = command({"PROBE_SETTING": "another"}, "unlike")
        assert socket_path != kept.socket_path
        assert len((tmp_path / "preload.log").read_text().split()) == 2  # its own server
    socket_path, _ = command({}, "after")
    assert socket_path != kept.socket_path
    assert len((tmp_path / "preload.log").read_text().split()) == 3


def test_a_kept_server_that_died_is_not_used(modules: Path, tmp_path: Path) -> None:
    env = _environment(modules, tmp_path)
    with kept_warm_server(env, []) as kept:
        (server,) = _servers()
        server.kill()
        server.wait(timeout=10)
        with warm_server(env, []) as warm:
            assert warm is not None and warm != kept
            process, out = _start(warm, env, tmp_path, "after", "exit", "0")
            assert process.wait(timeout=60) == 0
            assert json.loads(out.read_text())["pid"] != process.pid  # forked, not cold


def test_a_server_still_importing_is_stopped_without_waiting_for_its_imports(
    modules: Path, tmp_path: Path
) -> None:
    """A flow whose jobs were all up to date ends as soon as they are: the server it kept,
    still importing, is killed rather than waited for."""
    (modules / "warm_probe_slow.py").write_text("import time\ntime.sleep(120)\n")
    env = _environment(modules, tmp_path)
    started = time.monotonic()
    with kept_warm_server(env, ["warm_probe_slow"]) as kept:
        assert kept is not None
        (server,) = _servers()
    assert time.monotonic() - started < 60
    assert _gone(server.pid)


def test_ctrl_c_leaves_the_server_to_its_launcher_and_reaches_the_rank(
    modules: Path, tmp_path: Path
) -> None:
    """Ctrl-C reaches a terminal's whole process group: the server ignores it (it ends with
    its launcher, not halfway through an import), and a forked rank has SIGINT back, as
    a fresh interpreter does."""
    env = _environment(modules, tmp_path)
    with warm_server(env, []) as warm:
        assert warm is not None
        first, _ = _start(warm, env, tmp_path, "first", "exit", "0")
        assert first.wait(timeout=60) == 0  # the server is serving
        (server,) = _servers()
        server.send_signal(signal.SIGINT)
        process, out = _start(warm, env, tmp_path, "interrupted", "sleep")
        _wait_for(Path(str(out) + ".ready"))
        assert json.loads(out.read_text())["pid"] != process.pid  # forked: still serving
        process.send_signal(signal.SIGINT)  # the shim passes it on
        # an uncaught KeyboardInterrupt ends CPython by SIGINT; the shim mirrors it
        assert process.wait(timeout=30) == -signal.SIGINT


def test_a_shim_stopped_while_its_server_imports_ends_at_once_and_no_rank_runs(
    modules: Path, tmp_path: Path
) -> None:
    """SIGTERM to a shim whose server is still importing (seconds under load): the shim
    ends by it at once, as a cold rank would, instead of holding the signal until the
    server forks its rank (which made a Ctrl-C'd flow wait out its launcher's grace);
    once the server is ready, it forks no rank for the shim that hung up."""
    (modules / "warm_probe_slow.py").write_text("import time\ntime.sleep(6)\n")
    env = _environment(modules, tmp_path)
    with warm_server(env, ["warm_probe_slow"]) as warm:
        assert warm is not None
        process, out = _start(warm, env, tmp_path, "stopped", "sleep")
        time.sleep(1)  # the shim has sent its request; the server is importing
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        assert process.wait(timeout=30) == -signal.SIGTERM
        assert time.monotonic() - stopped < 2
        served, served_out = _start(warm, env, tmp_path, "served", "exit", "0")
        assert served.wait(timeout=60) == 0 and served_out.exists()  # the server is ready
    assert not out.exists(), "a rank ran for a shim that had hung up"
