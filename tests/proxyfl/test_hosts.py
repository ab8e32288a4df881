"""Which hosts a launch asks over ssh, and what it hears back: a real ``ssh`` client towards
an address that does not answer and a name that does not resolve, and an ssh that hangs
after connecting (a script standing in for ``ssh``, as ``HYDRA_LAUNCHER_EXEC`` lets
hydra's users do), which must be abandoned without leaving a process behind."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

import psutil
import pytest

from proxyfl.launch.hosts import (
    LAUNCHER_EXEC_ENV,
    hostfile_hosts,
    is_this_machine,
    named_hosts,
    ssh_problem,
    unreachable_hosts,
)

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
    for name in ("localhost", socket.gethostname(), "127.0.0.1", "::1", *local):
        assert is_this_machine(name), name
    assert not is_this_machine(SILENT_ADDRESS)
    assert not is_this_machine(UNRESOLVED)


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
