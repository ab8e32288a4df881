"""The hosts a job's ranks run on, and whether each answers ssh before any rank starts.

Hydra's ``mpiexec`` starts a job's ranks on a host other than this machine through
``ssh HOST hydra_pmi_proxy ...``, with no timeout of its own: a host that does not answer
(switched off, behind a firewall that drops packets) leaves the launch waiting for minutes,
the ranks started elsewhere idle. So before a job on several hosts is launched, every host
that is not this machine is asked to run ``true`` over the same ``ssh``, all at once, each
with ``ConnectTimeout`` (seconds to set up the connection) and ``BatchMode`` (a password or
passphrase prompt fails at once rather than waiting for a person), and a hard limit on the
whole call. Hydra starts the ranks of this machine's own names without ssh: they are not
asked, and every other name is, by hydra's own rule (:func:`hydra_local_names`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from plumbing.errors import PipelineError
from plumbing.processes import tree_bound_command

# hydra's ssh launcher runs this program (HYDRA_LAUNCHER_EXEC replaces it, as in hydra)
LAUNCHER_EXEC_ENV = "HYDRA_LAUNCHER_EXEC"
# how long a host may take past ConnectTimeout (key exchange, login, `true`) before the
# call is abandoned: a server that accepts the connection and then says nothing
ANSWER_MARGIN_S = 10.0


def host_name(entry: str) -> str:
    """``NAME`` of a hosts entry ``NAME`` or ``NAME:N``."""
    return entry.split(":", 1)[0]


def hostfile_hosts(path: Path) -> list[str]:
    """The hosts a hydra hostfile names, in order, once each (one ``NAME[:N]`` a line, ``#``
    starts a comment)."""
    names = []
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            names.append(host_name(fields[0]))
    return list(dict.fromkeys(names))


def named_hosts(hosts: Iterable[str] = (), hostfile: Path | None = None) -> list[str]:
    """The hosts of a ``-hosts`` list or a hostfile, in order, once each."""
    if hostfile is not None:
        return hostfile_hosts(hostfile)
    return list(dict.fromkeys(host_name(entry) for entry in hosts))


def hydra_local_names() -> set[str]:
    """The names hydra starts ranks on without ssh, as MPICH's ``MPL_host_is_local`` lists
    them: this machine's host name, the IPv4 address it resolves to, the IPv4 address of
    each interface, ``localhost``, ``127.0.0.1`` and ``127.0.1.1``. Hydra compares a host
    *as written* with these, resolving nothing: ``127.0.0.2`` (another loopback address),
    ``::1`` or an alias of this machine in ``/etc/hosts`` are reached over ssh."""
    host = socket.gethostname()
    names = {host, "localhost", "127.0.0.1", "127.0.1.1"}
    with contextlib.suppress(OSError, UnicodeError):
        names.add(socket.gethostbyname(host))
    names |= {address.address for addresses in psutil.net_if_addrs().values()
              for address in addresses if address.family == socket.AF_INET}  # fmt: skip
    return names


def is_this_machine(name: str) -> bool:
    """Whether hydra would start ranks on ``name`` without ssh (:func:`hydra_local_names`);
    every other name is asked over ssh before a launch, as hydra will reach it."""
    return name in hydra_local_names()


LAUNCH_EXTRA_ARGS_ENV = "HYDRA_LAUNCHER_EXTRA_ARGS"
"""Words hydra puts on each of its ssh command lines, before the host."""
ALIVE_INTERVAL_S, ALIVE_COUNT = 5, 3
"""A connected host that answers no keep-alive for 5 s, three times, is given up (15 s)."""


def ssh_launch_options(timeout_s: float) -> str:
    """The ssh options a launch across hosts gives hydra (:data:`LAUNCH_EXTRA_ARGS_ENV`),
    as the check's ssh has them: never prompting, a connection (the TCP connection and the
    server's first words) within ``timeout_s``, and a host that stops answering once
    connected given up after ``ALIVE_INTERVAL_S * ALIVE_COUNT`` seconds. So a host that
    answered the check and then went silent (a hung sshd, a tarpit, a node switched off)
    ends the launch within ``timeout_s`` (while connecting) or 15 s (once connected): its
    ssh exits 255, hydra stops the job, and the launch names the host."""
    return " ".join([
        "-o BatchMode=yes", f"-o ConnectTimeout={int(timeout_s)}",
        f"-o ServerAliveInterval={ALIVE_INTERVAL_S}", f"-o ServerAliveCountMax={ALIVE_COUNT}",
    ])  # fmt: skip


# how ssh says it lost, or never reached, a host (OpenSSH's words)
_SSH_FAILURES = tuple(re.compile(pattern) for pattern in (
    r"ssh: connect to host (?P<host>\S+) port \d+: .+",
    r"ssh: Could not resolve hostname (?P<host>[^:\s]+): .+",
    r"Connection (?:reset|closed) by (?:authenticating user \S+ )?(?P<host>\S+) port \d+",
    r"Connection to (?P<host>\S+) port \d+ timed out",
    r"Timeout, server (?P<host>\S+) not responding\.?",
    r"(?P<host>)Connection timed out during banner exchange",
))  # fmt: skip


class HostLostError(PipelineError):
    """Hydra's ssh to a host failed during a launch: the host, and what ssh said. Not
    worth retrying as if the job were flaky: the host must answer first."""

    exit_status = 2

    def __init__(self, host: str, said: str) -> None:
        super().__init__(
            f"host {host}" if host else "a host",
            f"ssh failed while launching the job's ranks ({said}); check that it answers "
            f"`ssh {host or 'HOST'} true`, or leave it out of train.hosts / train.hostfile",
        )
        self.host = host


def lost_host(lines: Iterable[str], reached_over_ssh: Iterable[str] = ()) -> HostLostError | None:
    """The first ssh failure among a launch's output ``lines`` (a host ssh could not
    reach, or lost), as an error naming the host; ``None`` when ssh said nothing wrong.

    Some of ssh's words name no host (a banner that never came); where no other line names
    one, and the launch reached one host over ssh (``reached_over_ssh``: its hosts that are
    not this machine), it is that host."""
    unnamed = None
    for line in lines:
        for pattern in _SSH_FAILURES:
            match = pattern.search(line)
            if match is None:
                continue
            if match.group("host"):
                return HostLostError(match.group("host").rstrip(".:"), line.strip())
            unnamed = unnamed or line.strip()
    if unnamed is None:
        return None
    remote = {host for host in reached_over_ssh if not is_this_machine(host)}
    return HostLostError(remote.pop() if len(remote) == 1 else "", unnamed)


def ssh_program() -> str:
    """The ssh hydra would run: ``HYDRA_LAUNCHER_EXEC``, else ``ssh`` on ``PATH``."""
    return os.environ.get(LAUNCHER_EXEC_ENV) or "ssh"


def ssh_check_command(host: str, timeout_s: float) -> list[str]:
    """``ssh`` asked to run ``true`` on ``host``: never prompting, giving up on a connection
    not set up within ``timeout_s`` seconds, reading nothing from this process's input."""
    return [ssh_program(), "-n", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(timeout_s)}",
            host, "true"]  # fmt: skip


def ssh_problem(host: str, timeout_s: float, margin_s: float = ANSWER_MARGIN_S) -> str | None:
    """Why ``host`` does not run ``true`` over ssh, connected within ``timeout_s`` and done
    within ``margin_s`` more, or ``None``."""
    limit = timeout_s + margin_s
    if shutil.which(ssh_program()) is None:
        return f"no {ssh_program()} to call (hydra starts the ranks of other hosts with it)"
    # under a supervisor that ends its whole tree when stopped, or when this process dies
    command = tree_bound_command(ssh_check_command(host, timeout_s), grace_s=1.0)
    with subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, errors="replace",
    ) as answer:  # fmt: skip
        try:
            _, stderr = answer.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            answer.terminate()  # the supervisor: SIGKILL would leave its tree behind
            answer.communicate()
            return f"ssh {host} true did not finish within {limit:.0f} s"
    if answer.returncode == 0:
        return None
    said = [line.strip() for line in stderr.splitlines() if line.strip()]
    why = said[-1] if said else f"exit status {answer.returncode}"
    return f"ssh {host} true failed within {timeout_s:.0f} s: {why}"


def host_problem(host: str, timeout_s: float) -> str | None:
    """Why hydra could not start ranks on ``host``: ``None`` for this machine (no ssh),
    else :func:`ssh_problem`."""
    return None if is_this_machine(host) else ssh_problem(host, timeout_s)


def unreachable_hosts(names: Sequence[str], timeout_s: float) -> dict[str, str]:
    """Host -> why, for every host of ``names`` that is not this machine and does not run a
    command over ssh within ``timeout_s`` (all asked at once: the whole check takes at
    most about ``timeout_s`` + :data:`ANSWER_MARGIN_S`)."""
    hosts = list(dict.fromkeys(names))
    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        problems = pool.map(lambda host: host_problem(host, timeout_s), hosts)
        return {host: why for host, why in zip(hosts, problems, strict=True) if why is not None}
