"""A single-node Slurm cluster of this machine, for the tests and for a person to try the
cluster workflow on (``python -m tests.slurm.cluster``).

Debian's packages (``apt-get install slurm-wlm munge``) bring the daemons; nothing of the
system's is used or changed: the cluster has its own folder (configuration, munge key and
socket, state, spool, logs, PID files), listens on 127.0.0.1 only, at free ports, and runs
as the user who starts it (Slurm then runs every job as that user). One node, named
``NODE``, with this machine's CPUs and memory; one partition, ``PARTITION``, its default.
The clients (``sbatch``, ``srun``, ``squeue``...) find it through ``SLURM_CONF``
(:attr:`SlurmCluster.env`). Stopped by PID (:meth:`SlurmCluster.stop`), the daemons take
the jobs' processes with them.
"""

from __future__ import annotations

import getpass
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from plumbing.network import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "sinfo", "scontrol")
INSTALL_HINT = (
    "the Slurm tests need Debian's slurm-wlm and munge packages "
    "(as root: apt-get install slurm-wlm munge; .ci/run does it in CI)"
)
NODE = "node0"
PARTITION = "debug"
READY_TIMEOUT_S = 60.0


def missing_programs() -> list[str]:
    """The daemons and clients of :data:`DAEMONS` and :data:`CLIENTS` not installed."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name, path=search) is None]


def _program(name: str) -> str:
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    found = shutil.which(name, path=search)
    if found is None:
        raise FileNotFoundError(f"{name} not found: {INSTALL_HINT}")
    return found


def _memory_mb() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise OSError("no MemTotal in /proc/meminfo")


class SlurmError(RuntimeError):
    """The cluster did not start: the daemon's log tail says why."""


@dataclass
class SlurmCluster:
    """A running cluster (:func:`start`): its folder, the clients' environment and the
    daemons' processes."""

    root: Path
    cpus: int
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a client of this cluster needs in its environment: ``SLURM_CONF``."""
        return {"SLURM_CONF": str(self.conf)}

    def log(self, daemon: str) -> str:
        path = self.root / "log" / f"{daemon}.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def client(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster (``sinfo``, ``squeue``, ...)."""
        return subprocess.run(
            [_program(args[0]), *args[1:]], env={**os.environ, **self.env},
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def idle(self) -> bool:
        """The node is up and takes jobs."""
        shown = self.client("sinfo", "--noheader", "--format=%t", timeout=20)
        return shown.returncode == 0 and shown.stdout.split()[:1] in (["idle"], ["mix"])

    def stop(self) -> None:
        """SIGTERM to each daemon by PID (slurmd first, so that it ends its jobs' steps),
        then SIGKILL to any still there after 10 s."""
        for name in reversed(DAEMONS):
            process = self.processes.get(name)
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()


def write_config(root: Path, cpus: int, memory_mb: int, user: str) -> Path:
    """slurm.conf of a one-node cluster at ``root``: loopback, free ports, this user."""
    for folder in ("state", "spool", "log", "run", "munge"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".")[0]
    lines = [
        "ClusterName=test",
        # job ids of their own: MPICH names the shared memory of a step after its job and
        # step ids, and two clusters of one machine (two test runs) must not meet there
        f"FirstJobId={random.randrange(1000, 1_000_000)}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'munge' / 'munge.socket'}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'run' / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        # no cgroups in a container: processes tracked by their parents, tasks not bound
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "JobAcctGatherType=jobacct_gather/none",
        # a killed task's step ends at once; a job's end is not held up for minutes
        "KillWait=5",
        # every finished job's record kept for the cluster's life (minutes), for the tests to
        # read its state and exit code: slurmctld 22.05 takes 0 ("never purge") for 2 s
        # ("MinJobAge must be at least 2"), and a record read 2 s late was gone
        "MinJobAge=3600",
        "InactiveLimit=0",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        f"NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} "
        f"RealMemory={memory_mb} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
    ]
    conf = root / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _munge_key(path: Path) -> None:
    path.write_bytes(os.urandom(1024))
    path.chmod(0o400)


def start(root: Path | None = None, cpus: int | None = None) -> SlurmCluster:
    """munged, slurmctld and slurmd of a new cluster at ``root`` (a new temporary folder
    by default), once the node takes jobs; the daemons' log says why when it does not."""
    root = Path(root or tempfile.mkdtemp(prefix="slurm-"))
    cpus = cpus or os.cpu_count() or 1
    write_config(root, cpus, _memory_mb(), getpass.getuser())
    _munge_key(root / "munge" / "munge.key")
    cluster = SlurmCluster(root=root, cpus=cpus)
    env = {**os.environ, **cluster.env}
    munge = root / "munge"
    commands = {
        "munged": [
            _program("munged"),
            "--foreground",
            "--force",
            f"--socket={munge / 'munge.socket'}",
            f"--key-file={munge / 'munge.key'}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--seed-file={munge / 'munged.seed'}",
            f"--log-file={root / 'log' / 'munged.log'}",
        ],
        "slurmctld": [_program("slurmctld"), "-D", "-i", "-f", str(cluster.conf)],
        "slurmd": [_program("slurmd"), "-D", "-N", NODE, "-f", str(cluster.conf)],
    }
    try:
        for name in DAEMONS:
            output = (root / "log" / f"{name}.out").open("wb")
            cluster.processes[name] = subprocess.Popen(
                commands[name], env=env, stdout=output, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            if name == "munged":
                _wait(lambda: (munge / "munge.socket").exists(), cluster, name)
        _wait(cluster.idle, cluster, "slurmd")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait(ready: object, cluster: SlurmCluster, daemon: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready():  # type: ignore[operator]
        for name, process in cluster.processes.items():
            if process.poll() is not None:
                out = (cluster.root / "log" / f"{name}.out").read_text(errors="replace")
                raise SlurmError(f"{name} exited {process.returncode}:\n{out}{cluster.log(name)}")
        if time.monotonic() > deadline:
            raise SlurmError(
                f"{daemon} not ready within {READY_TIMEOUT_S:.0f} s:\n{cluster.log(daemon)[-3000:]}"
            )
        time.sleep(0.2)


def main() -> int:
    """Start a cluster, say how to reach it, and keep it until Ctrl-C."""
    missing = missing_programs()
    if missing:
        print(f"not installed: {', '.join(missing)}: {INSTALL_HINT}", file=sys.stderr)
        return 2
    started = time.monotonic()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    cluster = start()
    print(f"a one-node Slurm cluster at {cluster.root}, up in {time.monotonic() - started:.1f} s")
    print(f"in another shell:  export SLURM_CONF={cluster.conf}")
    print("then sinfo, sbatch, srun as usual; Ctrl-C here stops it")
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
