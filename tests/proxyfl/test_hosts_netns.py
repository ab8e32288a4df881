"""A training job across two hosts for real: two network stacks, one veth link between them.

Two Linux network namespaces, A (10.231.0.1) and B (10.231.0.2), joined by a veth pair,
stand for two machines: each has its own interfaces, addresses and sockets, and reaches
the other only over the link. ``python -m flows.train --hostfile F`` (the user's command)
runs inside A; hydra's ``mpiexec -f F`` starts ranks 0-1 there and reaches "host" B
through its ssh launcher: an ``ssh`` first on ``PATH`` that runs the command hydra gives it
inside B's namespace (``ip netns exec``), as sshd would on B. The ranks' MPI traffic
between the hosts is TCP over the veth (MPICH's libfabric network module, its ``tcp``
provider on the veth interface; MPICH's default, UCX, crossed the link as well in a trial,
but the test pins the path it checks).

The run directory is shared, as docs/clusters.md asks (the same path everywhere), but the stores
are laid out as docs/clusters.md says for hospitals that keep their data on their own disks:
host B sees, at the same path, a directory of its own (a bind mount in B's mount
namespace) with its centres' stores whole and the other centres' stores without a single
training patch; host A, where the launcher runs and digests every store, has them all.

The job must write the same bytes (every file DVC hashes: metrics, run.json, rank records,
trained models, predictions) as the same job on one host with the default placement, and
the ranks must have run in both namespaces and talked rank to rank across the link.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import psutil
import pytest
import yaml

from camelyon_proxyfl.params.train import TrainSection
from proxyfl.kept import trained_path
from proxyfl.launch.job import TrainingJob, launch_planned
from proxyfl.launch.rundir import plan_launch
from proxyfl.results import predictions_path

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SUBNET = "10.231.0"
HOST_A, HOST_B = f"{SUBNET}.1", f"{SUBNET}.2"
LINK = "pfl0"  # the veth end's name in each namespace
TRAIN = {
    "algorithms": ["ProxyFL"], "seeds": [0], "centers": [0, 1, 2, 3],
    "data": "stores", "runs": "runs", "retries": 0,
    "options": {"rounds": 2, "batch_size": 8, "proxy_model": "cnn1", "private_model": ["mlp"],
                "device": "cpu", "sigma": 1.0, "clip": 1.0, "lr": 0.01},
}  # fmt: skip
# the ranks' network path between hosts: libfabric's tcp provider on the veth
OVER_THE_LINK = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": LINK}
# hydra's ssh launcher calls `ssh [options] HOST COMMAND...` (COMMAND: its proxy, with the
# control port to call back); sshd on HOST would run COMMAND with a shell. `ip netns exec`
# runs it in a mount namespace of its own too, so B's bind mount is B's alone
# Like ssh, it first connects to the host's port 22 over the network, within -o
# ConnectTimeout (where the sshd stand-in of `two_hosts` listens), and fails as ssh does.
SSH = """#!/bin/sh
wait=30
while [ $# -gt 0 ]; do
  case "$1" in
    -o) case "$2" in ConnectTimeout=*) wait="${{2#ConnectTimeout=}}" ;; esac; shift 2 ;;
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
{python} {connect} "$host" "$wait" || exit 255
case "$host" in
  {host_a}) namespace={a}; disk="" ;;
  {host_b}) namespace={b}; disk="mount --bind {b_stores} {stores} && " ;;
  *) echo "ssh: no host $host here" >&2; exit 255 ;;
esac
exec ip netns exec "$namespace" sh -c "$disk$*"
"""
CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], 22), timeout=float(sys.argv[2])).close()\n"
    "except OSError as error:\n"
    "    sys.exit(f'ssh: connect to host {sys.argv[1]} port 22: {error.strerror or error}')\n"
)
# what stands for sshd on host B: accepts connections on port 22
SSHD = (
    "import socket\n"
    "server = socket.create_server(('0.0.0.0', 22))\n"
    "while True:\n"
    "    server.accept()[0].close()\n"
)


@dataclass(frozen=True)
class TwoHosts:
    """The namespaces standing for hosts A and B, and their network namespace ids."""

    a: str
    b: str

    def net_id(self, namespace: str) -> str:
        """What ``/proc/PID/ns/net`` reads for a process in ``namespace``."""
        return f"net:[{os.stat(f'/run/netns/{namespace}').st_ino}]"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture()
def two_hosts() -> Iterator[TwoHosts]:
    """Namespaces A and B with ``lo`` up and a veth pair between them; removed afterwards,
    whatever happened (the veth ends go with their namespaces)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2) to make network namespaces")
    tag = os.getpid()  # two sessions running this test at once get namespaces of their own
    hosts = TwoHosts(f"pfl{tag}a", f"pfl{tag}b")
    ends = (f"pfl{tag}va", f"pfl{tag}vb")
    try:
        try:
            _ip("netns", "add", hosts.a)
            _ip("netns", "add", hosts.b)
            _ip("link", "add", ends[0], "type", "veth", "peer", "name", ends[1])
        except subprocess.CalledProcessError as error:
            pytest.skip(f"cannot make network namespaces here: {error.stderr.strip()}")
        for namespace, end, address in ((hosts.a, ends[0], HOST_A), (hosts.b, ends[1], HOST_B)):
            _ip("link", "set", end, "netns", namespace)
            _ip("-n", namespace, "link", "set", end, "name", LINK)
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", LINK)
            _ip("-n", namespace, "link", "set", "lo", "up")
            _ip("-n", namespace, "link", "set", LINK, "up")
        sshd = subprocess.Popen(["ip", "netns", "exec", hosts.b, sys.executable, "-c", SSHD])
        try:
            yield hosts
        finally:
            sshd.kill()
            sshd.wait()
    finally:
        for namespace in (hosts.a, hosts.b):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", ends[0]], capture_output=True, timeout=30)


def _without_training_patches(source: Path, target: Path) -> None:
    """``source``'s store as a host other than its centre's holds it: the same attributes
    and test split (every rank evaluates on it), a training split of no patch (every rank
    checks its layout; only the centre's own rank reads it)."""
    with h5py.File(source, "r") as whole, h5py.File(target, "w") as kept:
        kept.attrs.update(whole.attrs)
        whole.copy(whole["test"], kept, "test")
        train = kept.create_group("train")
        for name, dataset in whole["train"].items():
            train.create_dataset(name, shape=(0, *dataset.shape[1:]), dtype=dataset.dtype)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _address(hex_address: str) -> tuple[str, int]:
    host, port = hex_address.split(":")
    return socket.inet_ntoa(bytes.fromhex(host)[::-1]), int(port, 16)


def _established(pid: int) -> set[tuple[tuple[str, int], tuple[str, int]]]:
    """(local, remote) of the TCP connections process ``pid`` holds, read in its own
    network namespace (``/proc/PID/net/tcp`` is that namespace's table)."""
    inodes = _socket_inodes(pid)
    found = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "01" and fields[9] in inodes:  # ESTABLISHED, and this process's
            found.add((_address(fields[1]), _address(fields[2])))
    return found


@dataclass
class RankWatch:
    """What the ranks of the job under ``root`` were seen to be, sampled while they run:
    each rank's network namespace, and its TCP connections."""

    root: Path
    namespaces: dict[int, str] = field(default_factory=dict)
    stores_mounted: dict[int, bool] = field(default_factory=dict)
    connections: dict[int, set[tuple[tuple[str, int], tuple[str, int]]]] = field(
        default_factory=dict
    )

    def sample(self) -> None:
        for process in psutil.process_iter():
            try:
                rank = process.environ().get("PMI_RANK")
                if rank is None or not process.cwd().startswith(str(self.root)):
                    continue
                self.namespaces[int(rank)] = os.readlink(f"/proc/{process.pid}/ns/net")
                mounts = Path(f"/proc/{process.pid}/mountinfo").read_text().split()
                self.stores_mounted[int(rank)] = str(self.root / "stores") in mounts
                self.connections.setdefault(int(rank), set()).update(_established(process.pid))
            except (psutil.Error, OSError):
                continue

    def rank_to_rank_across(self) -> set[tuple[int, int]]:
        """Pairs of ranks (on A, on B) holding the two ends of one connection between the
        hosts' addresses: rank-to-rank traffic over the link (hydra's control connection
        ends at mpiexec, no rank)."""
        ends = {(local, remote): rank for rank, held in self.connections.items()
                for local, remote in held}  # fmt: skip
        return {
            (rank, ends[(remote, local)])
            for (local, remote), rank in ends.items()
            if local[0] == HOST_A and remote[0] == HOST_B and (remote, local) in ends
        }


def _watch_until_done(process: subprocess.Popen[str], watch: RankWatch) -> None:
    while process.poll() is None:
        watch.sample()
        time.sleep(0.2)


@dataclass(frozen=True)
class Project:
    """A project folder whose params.yaml trains on both hosts, and how to run its command
    in A as the user would."""

    root: Path
    hostfile: Path
    env: dict[str, str]
    python_path: str

    def command(self, hosts: TwoHosts) -> list[str]:
        return ["ip", "netns", "exec", hosts.a, sys.executable, "-m", "flows.train",
                "--config", "params.yaml", "--hostfile", str(self.hostfile)]  # fmt: skip


def _project(hosts: TwoHosts, tmp_path: Path, stores: Path) -> Project:
    """``tmp_path/two``: the stores of ``stores`` on host A's disk (all whole), host B's
    disk with centres 2 and 3 whole and the others' test splits, the hostfile naming both
    hosts with two ranks each, and ``ssh`` standing in as the module says."""
    two = tmp_path / "two"
    shutil.copytree(stores, two / "stores")  # host A's disk: every store whole
    b_stores = tmp_path / "b-disk"  # host B's: centres 2 and 3, and the others' test splits
    b_stores.mkdir()
    for center in (0, 1, 2, 3):
        name = f"center_{center}.h5"
        if center in (2, 3):
            shutil.copyfile(stores / name, b_stores / name)
        else:
            _without_training_patches(stores / name, b_stores / name)
    # the checkout under test, not another one the environment's editable install names
    python_path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    hostfile = two / "hosts.txt"
    hostfile.write_text(f"{HOST_A}:2\n{HOST_B}:2\n")
    (two / "params.yaml").write_text(yaml.safe_dump({"train": TRAIN}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "connect.py").write_text(CONNECT)
    quoted = {name: shlex.quote(str(path)) for name, path in (
        ("b_stores", b_stores), ("stores", two / "stores"), ("python", sys.executable),
        ("connect", bin_dir / "connect.py"))}  # fmt: skip
    (bin_dir / "ssh").write_text(SSH.format(host_a=HOST_A, host_b=HOST_B, a=hosts.a, b=hosts.b,
                                            **quoted))  # fmt: skip
    (bin_dir / "ssh").chmod(0o755)
    env = {**os.environ, **OVER_THE_LINK, "PYTHONPATH": python_path,
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
           "PREFECT_HOME": str(tmp_path / "prefect-home"), "PYTHONWARNINGS": "ignore"}  # fmt: skip
    env.pop("PREFECT_API_URL", None)  # a server outside A is out of A's reach: its own
    return Project(two, hostfile, env, python_path)


def test_a_job_across_two_hosts_writes_the_bytes_of_one_host(
    two_hosts: TwoHosts, helpers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = tmp_path / "one"
    helpers.write_stores(one / "stores", centers=(0, 1, 2, 3))
    project = _project(two_hosts, tmp_path, one / "stores")
    two, hostfile, python_path = project.root, project.hostfile, project.python_path
    watch = RankWatch(two)
    with open(tmp_path / "flow.log", "w") as log:
        process = subprocess.Popen(project.command(two_hosts), cwd=two, env=project.env,
                                   stdout=log, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        watching = threading.Thread(target=_watch_until_done, args=(process, watch), daemon=True)
        watching.start()
        try:
            # meanwhile (its Prefect server starts first), one host with the default
            # placement: the reference bytes, launched as flows.train's task launches
            monkeypatch.chdir(one)  # relative paths, as params.yaml gives them
            monkeypatch.setenv("PYTHONPATH", python_path)
            config = TrainSection(**TRAIN).job_config("ProxyFL", 0)
            launch_planned(TrainingJob(config), plan_launch(config, replace=False),
                           on_line=lambda _: None)  # fmt: skip
            process.wait(timeout=300)
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
            watching.join()
    output = (tmp_path / "flow.log").read_text()
    assert process.returncode == 0, output[-6000:]
    assert f"-f {hostfile} -n 4" in output, "launched by hydra with the hostfile"

    # the ranks ran in both network stacks, two each, and talked across the link
    net_a, net_b = two_hosts.net_id(two_hosts.a), two_hosts.net_id(two_hosts.b)
    assert watch.namespaces == {0: net_a, 1: net_a, 2: net_b, 3: net_b}, watch.namespaces
    across = watch.rank_to_rank_across()
    assert across and all(a in (0, 1) and b in (2, 3) for a, b in across), watch.connections
    # host B's ranks read their own disk; nothing of it reached A or this process
    assert watch.stores_mounted == {0: False, 1: False, 2: True, 3: True}, watch.stores_mounted
    assert str(two / "stores") not in Path("/proc/self/mountinfo").read_text().split()

    # and wrote the same bytes as on one host
    run = Path("runs") / "ProxyFL" / "seed_0"
    reference, placed = helpers.dvc_hashed_files(one / run), helpers.dvc_hashed_files(two / run)
    kept = {str(path(Path(), client, *label)) for client in range(4)
            for path, label in ((trained_path, ("private",)), (trained_path, ("proxy",)),
                                (predictions_path, ()))}  # fmt: skip
    assert {"metrics.jsonl", "run.json", "ranks/rank_3.json", *kept} <= set(reference)
    assert placed.keys() == reference.keys()
    differing = [name for name in reference if placed[name] != reference[name]]
    assert not differing, differing


def _left_behind(project: Project) -> list[str]:
    """Every process of the project's job still alive: in its folder, or its ssh stand-in,
    or a hydra proxy (this session's namespaces' alone: B's address is in its command)."""
    left = []
    for process in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        info = process.info
        if info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmdline = " ".join(info["cmdline"] or [])
        mine = (info["cwd"] or "").startswith(str(project.root))
        if mine or str(project.root) in cmdline or str(project.hostfile.parent) in cmdline:
            left.append(f"{info['pid']} {cmdline[:160]}")
    return left


def test_a_host_that_does_not_answer_stops_the_launch_before_any_rank_starts(
    two_hosts: TwoHosts, helpers: Any, tmp_path: Path
) -> None:
    """Host B's link down: the launch asks both hosts over ssh first, and exits 2 at once,
    naming B and why, with no retry, no Prefect server, no rank and no run directory."""
    helpers.write_stores(tmp_path / "stores", centers=(0, 1, 2, 3))
    project = _project(two_hosts, tmp_path, tmp_path / "stores")
    _ip("-n", two_hosts.b, "link", "set", LINK, "down")
    started = time.monotonic()
    done = subprocess.run(project.command(two_hosts), cwd=project.root, env=project.env,
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert (
        f"error: host {HOST_B}: ssh {HOST_B} true failed within 10 s: ssh: connect to "
        f"host {HOST_B} port 22: " in done.stderr
    ), done.stderr
    assert f"host {HOST_A}" not in done.stderr  # A is where the command runs: no ssh
    assert "nothing was launched" in done.stderr
    assert not (project.root / "runs").exists() and "mpiexec" not in done.stdout
    assert took < 60, f"{took:.0f} s"


def test_a_launch_killed_while_a_host_is_cut_off_leaves_no_ssh_proxy_or_rank(
    two_hosts: TwoHosts, helpers: Any, tmp_path: Path
) -> None:
    """The job runs on both hosts; B's link drops, and the user's command is killed
    outright (SIGKILL: no cleanup of its own). Its launcher, ssh, hydra's proxies and every
    rank on both hosts are gone within seconds, none left waiting on the dead link."""
    helpers.write_stores(tmp_path / "stores", centers=(0, 1, 2, 3))
    project = _project(two_hosts, tmp_path, tmp_path / "stores")
    train = {**TRAIN, "options": {**TRAIN["options"], "rounds": 500}}  # still running
    (project.root / "params.yaml").write_text(yaml.safe_dump({"train": train}))
    watch = RankWatch(project.root)
    with open(tmp_path / "flow.log", "w") as log:
        process = subprocess.Popen(
            project.command(two_hosts), cwd=project.root, env=project.env, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 240
            while set(watch.namespaces) != {0, 1, 2, 3}:
                assert process.poll() is None, (tmp_path / "flow.log").read_text()[-4000:]
                assert time.monotonic() < deadline, (tmp_path / "flow.log").read_text()[-4000:]
                watch.sample()
                time.sleep(0.2)
            _ip("-n", two_hosts.b, "link", "set", LINK, "down")
            process.kill()
            process.wait(timeout=30)
            deadline = time.monotonic() + 20
            while (left := _left_behind(project)) and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            if process.poll() is None:
                process.kill()
    assert not left, "outlived the command:\n" + "\n".join(left)
