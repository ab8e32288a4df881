"""Which hosts a launch asks over ssh, and what it hears back: a real ``ssh`` client towards
an address that does not answer and a name that does not resolve, and an ssh that hangs
after connecting (a script standing in for ``ssh``, as ``HYDRA_LAUNCHER_EXEC`` lets
hydra's users do), which must be abandoned without leaving a process behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from prefect.states import Failed

from proxyfl.config import TrainConfig
from proxyfl.launch.hosts import (
    ANSWER_MARGIN_S,
    LAUNCH_EXTRA_ARGS_ENV,
    LAUNCHER_EXEC_ENV,
    HostLostError,
    hostfile_hosts,
    is_this_machine,
    lost_host,
    named_hosts,
    ssh_problem,
    unreachable_hosts,
)
from proxyfl.launch.job import JOB_LOG, TrainingJob, run_job
from proxyfl.launch.placement import Placement, mpiexec_path
from tasks.train import worth_retrying

# not routed anywhere (RFC 5737's documentation range), and a name no resolver knows (RFC 6761)
SILENT_ADDRESS = "192.0.2.1"
UNRESOLVED = "no-such-host.invalid"


def test_a_hostfile_names_each_host_once_in_order(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("# the hospital's nodes\nnode-b:2  # two ranks\n\nnode-a\nnode-b:1\n")
    assert hostfile_hosts(hostfile) == ["node-b", "node-a"]
    assert named_hosts(hostfile=hostfile) == ["node-b", "node-a"]
    assert named_hosts(["x:2", "y", "x"]) == ["x", "y"]


def test_this_machine_by_any_of_its_names_and_no_other() -> None:
    local = [address.address for addresses in psutil.net_if_addrs().values()
             for address in addresses if address.family == socket.AF_INET]  # fmt: skip
    for name in ("localhost", socket.gethostname(), "127.0.0.1", "127.0.1.1", *local):
        assert is_this_machine(name), name
    # hydra compares names as written: another loopback address, or IPv6's, goes over ssh
    for name in (SILENT_ADDRESS, UNRESOLVED, "127.0.0.2", "::1"):
        assert not is_this_machine(name), name


def _mpiexec() -> str | None:
    """The mpiexec a launch runs (the venv's, on no ``PATH`` under CI), or None."""
    try:
        return str(mpiexec_path())
    except FileNotFoundError:
        return None


def _hydra_calls_ssh(mpiexec: str, name: str, tmp_path: Path) -> bool:
    """Whether hydra's mpiexec starts a rank on ``name`` through its launcher: a script in
    place of ssh (``HYDRA_LAUNCHER_EXEC``) records the call and fails."""
    calls = tmp_path / f"calls-{name}"
    launcher = tmp_path / "ssh"
    launcher.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\nexit 255\n')
    launcher.chmod(0o755)
    env = {**os.environ, LAUNCHER_EXEC_ENV: str(launcher)}
    subprocess.run([mpiexec, "-hosts", name, "-n", "1", "true"], env=env, timeout=60,
                   capture_output=True, check=False)  # fmt: skip
    return calls.exists()


@pytest.mark.skipif(_mpiexec() is None, reason="no mpiexec")
def test_the_hosts_asked_over_ssh_are_exactly_those_hydra_reaches_over_ssh(
    tmp_path: Path,
) -> None:
    """The rule of :func:`is_this_machine` against hydra itself, name by name: this
    machine's names and loopback aliases of it (127.0.0.2, a name in no list)."""
    mpiexec = _mpiexec()
    assert mpiexec is not None
    local = [address.address for addresses in psutil.net_if_addrs().values()
             for address in addresses if address.family == socket.AF_INET]  # fmt: skip
    names = ["localhost", socket.gethostname(), "127.0.0.1", "127.0.1.1", "127.0.0.2",
             "127.0.0.3", *local]  # fmt: skip
    for name in dict.fromkeys(names):
        assert _hydra_calls_ssh(mpiexec, name, tmp_path) == (not is_this_machine(name)), name


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client")
def test_hosts_that_do_not_answer_ssh_are_named_with_why_and_this_machine_is_not_asked() -> None:
    started = time.monotonic()
    found = unreachable_hosts(["localhost", SILENT_ADDRESS, "127.0.0.1", UNRESOLVED], 2)
    took = time.monotonic() - started
    assert set(found) == {SILENT_ADDRESS, UNRESOLVED}, found
    # ssh's own reason: refused or timed out, "Could not resolve hostname ..." (or, where
    # the resolver itself hangs, the limit)
    assert found[SILENT_ADDRESS].startswith(f"ssh {SILENT_ADDRESS} true failed within 2 s: ")
    assert found[UNRESOLVED].startswith(f"ssh {UNRESOLVED} true "), found[UNRESOLVED]
    assert took < 40, f"asked at once, each within its limits: {took:.1f} s"


def test_an_ssh_that_hangs_is_abandoned_and_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host that accepts the connection and then says nothing: the call is given up after
    ConnectTimeout and the margin, and the ssh, with a child of its own in another session,
    is gone."""
    fake = tmp_path / "ssh"
    marker = tmp_path / "hung.pid"
    fake.write_text(f"#!/bin/sh\nsetsid sleep 600 &\necho $! > {marker}\nexec sleep 600\n")
    fake.chmod(0o755)
    monkeypatch.setenv(LAUNCHER_EXEC_ENV, str(fake))
    started = time.monotonic()
    problem = ssh_problem(SILENT_ADDRESS, timeout_s=1, margin_s=2)
    assert problem == f"ssh {SILENT_ADDRESS} true did not finish within 3 s"
    assert time.monotonic() - started < 10
    hung = int(marker.read_text())
    deadline = time.monotonic() + 10
    while _alive(hung) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if str(fake) in " ".join(p.info["cmdline"] or [])]  # fmt: skip
    assert not _alive(hung) and not left, (hung, left)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_no_ssh_to_call_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LAUNCHER_EXEC_ENV, "/nonexistent/ssh")
    problem = ssh_problem(SILENT_ADDRESS, timeout_s=1)
    assert problem == "no /nonexistent/ssh to call (hydra starts the ranks of other hosts with it)"


def test_a_lost_host_is_named_from_ssh_s_own_words() -> None:
    said = {
        "ssh: connect to host node-b port 22: Connection refused": "node-b",
        "ssh: Could not resolve hostname node-c: Name or service not known": "node-c",
        "Connection reset by 127.0.0.2 port 22": "127.0.0.2",
        "Connection closed by authenticating user ana 10.0.0.7 port 22": "10.0.0.7",
        "Connection to 127.0.0.2 port 22 timed out": "127.0.0.2",
        "Timeout, server node-d not responding.": "node-d",
    }
    for line, host in said.items():
        lost = lost_host(["[rank 0] round 1", line, "[mpiexec@vm] Launch proxy failed."])
        assert lost is not None and lost.host == host, line
        assert f"host {host}: ssh failed while launching" in str(lost) and lost.exit_status == 2
    # the banner's line names no host; the next line does, and is preferred
    lost = lost_host(["Connection timed out during banner exchange",
                      "Connection to 127.0.0.2 port 22 timed out"])  # fmt: skip
    assert lost is not None and lost.host == "127.0.0.2"
    unnamed = lost_host(["Connection timed out during banner exchange"])
    assert unnamed is not None and unnamed.host == ""
    assert str(unnamed).startswith("a host: ssh failed while launching")
    # named by the launch instead: the one host it reached over ssh (this machine's names
    # are not reached so); of two, which one is not known
    banner = ["Connection timed out during banner exchange"]
    assert lost_host(banner, ["localhost", "node-b"]).host == "node-b"  # type: ignore[union-attr]
    assert lost_host(banner, ["node-b", "node-c"]).host == ""  # type: ignore[union-attr]
    assert lost_host(["[rank 1] ValueError: bad input", "exit code 2"]) is None


@pytest.fixture
def tarpit() -> Iterator[str]:
    """A listener on 127.0.0.2:22 that accepts connections and never says a word (a hung
    sshd): another loopback address of this machine, which hydra reaches over ssh."""
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.2", 22))
    except OSError as error:  # port 22 taken, or not ours to bind
        listener.close()
        pytest.skip(f"cannot listen on 127.0.0.2:22: {error}")
    listener.listen(16)
    listener.settimeout(0.2)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield "127.0.0.2"
    finally:
        stop.set()
        thread.join()
        for connection in [*accepted, listener]:
            connection.close()


@pytest.mark.skipif(shutil.which("ssh") is None or _mpiexec() is None,
                    reason="no ssh client or mpiexec")  # fmt: skip
def test_a_silent_host_fails_the_check_and_ends_a_launch_within_the_timeout(
    tarpit: str, tmp_path: Path
) -> None:
    """A host that accepts and never answers: the check names it within its limit; and a
    launch that reaches it anyway (silent after the check) ends within ConnectTimeout in
    one attempt, as the error naming the host, with no ssh left behind."""
    started = time.monotonic()
    found = unreachable_hosts([tarpit, "localhost"], 2)
    assert set(found) == {tarpit} and time.monotonic() - started < 2 + ANSWER_MARGIN_S + 5
    placement = Placement(hosts=(tarpit,), ssh_timeout_s=2)
    assert "-o ConnectTimeout=2" in placement.environment()[LAUNCH_EXTRA_ARGS_ENV]
    config = TrainConfig(algorithm="Regular", seed=0, data=tmp_path / "stores",
                         run_dir=tmp_path / "run", centers=[0])  # fmt: skip
    (tmp_path / "run").mkdir()
    started = time.monotonic()
    with pytest.raises(HostLostError, match=f"^host {tarpit}: ssh failed") as lost:
        run_job(TrainingJob(config, placement), on_line=lambda line: None)
    took = time.monotonic() - started
    assert lost.value.host == tarpit and lost.value.exit_status == 2
    assert took < 2 + 10, took
    # the train task gives up at once, where a flaky job is resumed
    assert not worth_retrying(None, None, Failed(data=lost.value))  # type: ignore[arg-type]
    assert worth_retrying(None, None, Failed(data=RuntimeError("a rank was killed")))  # type: ignore[arg-type]
    attempts = (tmp_path / "run" / JOB_LOG).read_text().count("=== ")
    assert attempts == 1
    time.sleep(0.5)
    assert not [p for p in psutil.process_iter(["name", "cmdline"])
                if p.info["name"] == "ssh" and tarpit in (p.info["cmdline"] or [])]  # fmt: skip
