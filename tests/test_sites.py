"""``camelyon-proxyfl sites``: kits for the centres of params.yaml, and a server and its
sites each started from its own kit, as hospitals would start them (here on one machine,
the server's host name ``localhost``): real ``nvflare`` processes, mutual TLS."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from plumbing.network import free_port
from proxyfl.launch.flare import admin_session
from proxyfl.launch.kits import Kits, Project
from tests.conftest import command_line

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-m", "camelyon_proxyfl.cli", "sites"]


def _provision(folder: Path, port: int, centers: list[int]) -> tuple[str, Path]:
    """Kits for ``centers`` (a params.yaml of them in ``folder``); what it said, the root."""
    folder.mkdir(parents=True)
    (folder / "params.yaml").write_text(yaml.safe_dump({"train": {"centers": centers}}))
    done = subprocess.run([*COMMAND, "provision", "--out", "kits", "--server-host",
                           "localhost", "--port", str(port)], cwd=folder, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout, folder / "kits" / "proxyfl" / "prod_00"


def _start(kit: Path, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*COMMAND, "start", str(kit), *options], cwd=REPO, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip


def _said(process: subprocess.Popen[str], words: str, timeout_s: float = 60) -> list[str]:
    """The command's lines on standard error up to one holding ``words``."""
    assert process.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if words in line:
            return lines
    raise AssertionError(f"{words!r} not said: {lines[-10:]}")


def _tree(process: subprocess.Popen[str]) -> list[psutil.Process]:
    top = psutil.Process(process.pid)
    return [top, *top.children(recursive=True)]


def test_kits_for_the_centres_of_params_and_each_participant_started_from_its_own(
    tmp_path: Path,
) -> None:
    port = free_port()
    said, root = _provision(tmp_path / "ours", port, [0, 2])
    assert {path.name for path in root.iterdir()} == {"localhost", "centre-0", "centre-2",
                                                      "admin@proxyfl.org"}  # fmt: skip
    assert f"open TCP port {port} inbound" in said and "centre 2's site" in said
    # an administrator's kit does not run; nor does a folder that is no kit
    for folder, why in ((root / "admin@proxyfl.org", "an administrator's kit"),
                        (tmp_path, "not a FLARE startup kit")):  # fmt: skip
        refused = subprocess.run([*COMMAND, "start", str(folder)], capture_output=True,
                                 text=True, timeout=60)  # fmt: skip
        assert refused.returncode == 2 and why in refused.stderr, refused.stderr

    server = _start(root / "localhost")
    sites = [_start(root / name) for name in ("centre-0", "centre-2")]
    participants = [server, *sites]
    try:
        for site, name in zip(sites, ("centre-0", "centre-2"), strict=True):
            _said(site, f"site {name}: joined its server")
        kits = Kits(root, Project("proxyfl", "localhost", port, ("centre-0", "centre-2")))
        with admin_session(kits, 60) as session:
            joined = {client.name for client in session.get_connected_client_list()}
        assert joined == {"centre-0", "centre-2"}
        # only the server's one port faces the network (here: the loopback's), and only
        # over TLS with a certificate of this project's CA
        listening = {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN
                     and c.pid in {p.pid for one in participants for p in _tree(one)}}  # fmt: skip
        assert port in {number for _, number in listening} and all(
            ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1") for ip, _ in listening
        ), listening
        # a site of another provisioning (another CA) cannot join: one line, exit 4
        _, theirs = _provision(tmp_path / "theirs", port, [1])
        started = time.monotonic()
        stranger = _start(theirs / "centre-1")
        _, error = stranger.communicate(timeout=90)
        assert stranger.returncode == 4, error[-2000:]
        (line,) = [line for line in error.splitlines() if line.startswith("error:")]
        assert "site centre-1 could not join its server" in line and "certificate" in line
        assert time.monotonic() - started < 60
        # a second server on the port taken: exit 3, naming it
        second = subprocess.run([*COMMAND, "start", str(root / "localhost")],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert second.returncode == 3 and f"port {port}" in second.stderr, second.stderr
        # stopped (SIGTERM, as a service manager stops it): each ends with everything it
        # started, the site's job processes included
        trees = {process.pid: _tree(process) for process in participants}
        for process in participants:
            process.send_signal(signal.SIGTERM)
        for process in participants:
            assert process.wait(timeout=30) == 128 + signal.SIGTERM
            assert "stopped" in (process.stderr.read() if process.stderr else "")
            assert not [p for p in trees[process.pid] if p.is_running()
                        and p.status() != psutil.STATUS_ZOMBIE]  # fmt: skip
    finally:
        for process in participants:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
    assert not [c for c in psutil.net_connections("tcp")  # nothing listens on it any more
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port]  # fmt: skip


def test_a_site_whose_server_is_not_up_gives_up_after_its_timeout(tmp_path: Path) -> None:
    _, root = _provision(tmp_path / "project", free_port(), [0])  # nothing listens there
    started = time.monotonic()
    site = _start(root / "centre-0", "--connect-timeout", "3")
    _, error = site.communicate(timeout=60)
    assert site.returncode == 4, error[-2000:]
    (line,) = [line for line in error.splitlines() if line.startswith("error:")]
    assert "site centre-0 could not join its server: not joined within" in line
    assert time.monotonic() - started < 30
    assert not [p for p in psutil.Process().children(recursive=True)
                if "client_train" in " ".join(command_line(p))]  # fmt: skip
