"""The hosts a job's ranks run on, and whether each answers ssh before any rank starts.

Hydra's ``mpiexec`` starts a job's ranks on a host other than this machine through
``ssh HOST hydra_pmi_proxy ...``, with no timeout of its own: a host that does not answer
(switched off, behind a firewall that drops packets) leaves the launch waiting for minutes,
the ranks started elsewhere idle. So before a job on several hosts is launched, every host
that is not this machine is asked to run ``true`` over the same ``ssh``, all at once, each
with ``ConnectTimeout`` (seconds to set up the connection) and ``BatchMode`` (a password or
passphrase prompt fails at once rather than waiting for a person), and a hard limit on the
whole call. Hydra starts the ranks of this machine's own names (``localhost``, its host
name, an address of one of its interfaces) without ssh: they are not asked.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

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


def _local_addresses() -> set[str]:
    return {address.address.split("%", 1)[0]
            for addresses in psutil.net_if_addrs().values() for address in addresses
            if address.family in (socket.AF_INET, socket.AF_INET6)}  # fmt: skip


def is_this_machine(name: str) -> bool:
    """Whether hydra would start ranks on ``name`` without ssh: this machine's host name,
    or a name that resolves to a loopback address or an address of one of its interfaces.
    A name that does not resolve here is not this machine (ssh may still know it: an alias
    of ``~/.ssh/config``)."""
    if name in ("localhost", socket.gethostname()):
        return True
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except (socket.gaierror, UnicodeError):
        return False
    local = _local_addresses()
    return any(ipaddress.ip_address(str(address).split("%", 1)[0]).is_loopback
               or address in local for address in resolved)  # fmt: skip


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
