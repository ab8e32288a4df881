"""Training over NVIDIA FLARE on this machine (``train.launcher: flare``): each centre a site
with its own certificate, the server on 127.0.0.1, and the same bytes as mpiexec.

A FLARE job and an mpiexec job of the same configuration run through the product's launch
(:func:`~proxyfl.launch.job.run_job`) on three tiny stores; every file DVC hashes of the two
runs is compared, kept models and checkpoints included: ProxyFL (PushSum, the proxies)
and Joint (one pooled site, no message). Every other method's exchanges go over the same
transport, rank executor and controller in ``test_federation.py`` (a job submitted to
running sites), whose results are compared with mpiexec's there.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from plumbing.network import free_port
from proxyfl.config import TrainConfig
from proxyfl.engine.validation import read_failures
from proxyfl.launch.flare import (
    EXIT_NO_CONNECTION,
    EXIT_SITE_LOST,
    SERVER_HOST,
    FlareJobError,
    FlareProcesses,
    admin_session,
    run_flare_job,
    start_server,
    start_site,
    wait_for_sites,
)
from proxyfl.launch.job import TrainingJob, TrainingJobFailed, run_job
from proxyfl.launch.kits import Project, provision
from proxyfl.launch.placement import Placement
from tests.conftest import command_line

pytestmark = pytest.mark.slow

CENTERS = [0, 1, 2]


def _config(stores: Path, run_dir: Path, algorithm: str) -> TrainConfig:
    return TrainConfig(
        algorithm=algorithm, data=stores, run_dir=run_dir, centers=CENTERS, rounds=2,
        batch_size=8, proxy_model="cnn1", private_model=["mlp"], device="cpu", seed=0,
        sigma=1.0, clip=1.0, lr=1e-2, torch_threads=1, keep_final_checkpoints=True,
        kt_samples=2, self_train_samples=4,
    )  # fmt: skip


def _listeners_under(pid: int | None = None) -> set[str]:
    """The TCP addresses listened on by ``pid`` (this test's process) and every process
    under it (a worker of the suite may hold servers of other tests: compare with what it
    held before)."""
    top = psutil.Process(pid)
    pids = {top.pid, *(child.pid for child in top.children(recursive=True))}
    return {f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.pid in pids}  # fmt: skip


def _handshake(port: int, kits: Path, site: str | None) -> bool:
    """Whether a TLS handshake with the server at ``port`` completes, trusting the
    project's CA, with ``site``'s certificate (None: with none)."""
    context = ssl.create_default_context(cafile=str(kits / site / "startup" / "rootCA.pem")
                                         if site else None)  # fmt: skip
    if site is None:
        any_site = next(p for p in kits.iterdir() if (p / "startup" / "client.crt").is_file())
        context.load_verify_locations(str(any_site / "startup" / "rootCA.pem"))
    else:
        startup = kits / site / "startup"
        context.load_cert_chain(str(startup / "client.crt"), str(startup / "client.key"))
    context.check_hostname = False
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                context.wrap_socket(raw) as tls:  # fmt: skip
            tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # TLS 1.3: refusal comes on use
            return bool(tls.recv(1))
    except (ssl.SSLError, ConnectionError, OSError):
        return False


class _WhileTraining:
    """At the job's first rank line: its listeners, who the server lets in, and how the
    sites' job processes were started."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.before = _listeners_under()
        self.lines: list[str] = []
        self.listeners: set[str] | None = None
        self.with_certificate: bool | None = None
        self.without_certificate: bool | None = None
        self.job_processes: list[list[str]] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if self.listeners is not None or "[rank " not in line:
            return
        self.listeners = _listeners_under() - self.before
        # a site's job process as FLARE starts it (the warm server, and the ranks it forks,
        # name FLARE's worker among the modules the server imports: not these)
        self.job_processes = [argv for p in psutil.Process().children(recursive=True)
                              if "worker_process" in " ".join(argv := command_line(p))
                              and "plumbing.warm" not in argv]  # fmt: skip
        (kits,) = (self.run_dir / "flare" / "kits").iterdir()
        port = int(kits.name.removeprefix("port-"))
        (root,) = (kits / "proxyfl").glob("prod_*")
        site = next(kit.name for kit in sorted(root.iterdir())
                    if (kit / "startup" / "client.crt").is_file())  # fmt: skip
        self.with_certificate = _handshake(port, root, site)
        self.without_certificate = _handshake(port, root, None)


@pytest.mark.parametrize("algorithm", ["ProxyFL", "Joint"])
def test_a_flare_job_writes_the_bytes_of_mpiexec(
    algorithm: str, stores: Path, tmp_path: Path, helpers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # paths relative to the folder the job is launched from, as params.yaml's are: the
    # sites' processes run elsewhere (their kits), their ranks in the launch's folder
    before = _listeners_under()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "stores").symlink_to(stores, target_is_directory=True)
    runs = {}
    for launcher in ("mpiexec", "flare"):
        run_dir = Path(launcher) / algorithm / "seed_0"
        watch = _WhileTraining(run_dir)
        job = TrainingJob(_config(Path("stores"), run_dir, algorithm),
                          Placement(launcher=launcher))  # fmt: skip
        run_job(job, on_line=watch if launcher == "flare" else (lambda _: None))
        runs[launcher] = (run_dir, helpers.dvc_hashed_files(tmp_path / run_dir))
    (mpi_dir, mpi), (flare_dir, flare) = runs["mpiexec"], runs["flare"]
    helpers.same_run(mpi, flare, mpi_dir, flare_dir)
    assert any(name.startswith("models/") for name in flare)
    # the sites' rounds were the ranks' own lines, passed on as mpiexec's are
    assert any("round 2/2" in line for line in watch.lines), watch.lines[-20:]
    # while it trained: only 127.0.0.1 listened, and the server took a site's certificate
    # and refused a connection without one (mutual TLS)
    assert watch.listeners and all(
        address.rsplit(":", 1)[0] in ("127.0.0.1", "::ffff:127.0.0.1")
        for address in watch.listeners
    ), watch.listeners
    assert watch.with_certificate is True and watch.without_certificate is False
    # each site's job process (Joint: the one pooled site's) the shim of run_job's warm
    # server (torch imported once)
    assert len(watch.job_processes) == (1 if algorithm == "Joint" else len(CENTERS))
    assert all("-S" in argv and Path(argv[argv.index("-S") + 1]).name == "warm_shim.py"
               for argv in watch.job_processes), watch.job_processes  # fmt: skip
    # nothing of the job is left running; the kits' keys are not left in the run
    assert _listeners_under() <= before
    assert not [p for p in psutil.Process().children(recursive=True)
                if "nvflare" in " ".join(command_line(p))]  # fmt: skip


def test_the_kits_private_keys_are_the_provisioners_alone(tmp_path: Path) -> None:
    """Provisioned under the usual umask (022), the kits' folder is its owner's alone and
    so is every file holding a private key: FLARE's ``state/cert.json`` (the CA's key and
    every participant's, 0644 before) and each participant's ``*.key``."""
    previous = os.umask(0o022)
    try:
        kits = provision(Project("proxyfl", SERVER_HOST, free_port(), ("centre-0", "centre-1")),
                         tmp_path / "kits")  # fmt: skip
    finally:
        os.umask(previous)
    out = tmp_path / "kits"
    state = out / "proxyfl" / "state" / "cert.json"
    assert "root_pri_key" in state.read_text()
    keys = [state, *out.rglob("*.key")]
    assert len(keys) == 1 + 4 and kits.site("centre-1") in {k.parents[1] for k in keys}
    assert out.stat().st_mode & 0o777 == 0o700
    assert {oct(path.stat().st_mode & 0o777) for path in keys} == {oct(0o600)}


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a read-only tmpfs (needs root)")
def test_kits_that_cannot_be_provisioned_are_the_machines_refusal(tmp_path: Path) -> None:
    """A run folder on a read-only file system: the job ends before any process starts,
    in one line naming the folder and why, with the machine's refusal status (3: not
    retried), not a traceback and exit 1."""
    run_dir = tmp_path / "readonly"
    run_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(run_dir)],
                   check=True)  # fmt: skip
    try:
        with pytest.raises(FlareJobError) as refused:
            run_flare_job(run_dir, ["--config", "unused"], ["centre-0"], 60.0)
    finally:
        subprocess.run(["umount", "-l", str(run_dir)], check=False)
    assert refused.value.status == 3
    assert str(refused.value) == (
        f"the job's kits could not be provisioned: {run_dir / 'flare'}: on a read-only file "
        "system (EROFS): write elsewhere (an output option or params)"
    )


def test_the_administrator_runs_no_shell_command_at_a_site(tmp_path: Path) -> None:
    """FLARE's default policy grants the administrator's role everything, shell commands
    on a participant's kit folder included (``ls``, ``cat``: a hospital's files read by
    whoever coordinates): the kits' policy refuses them, at a site and at the server."""
    from nvflare.fuel.flare_api.api_spec import AuthorizationError

    kits = provision(Project("proxyfl", SERVER_HOST, free_port(), ("centre-0",)), tmp_path / "k")
    with FlareProcesses(tmp_path / "logs", dict(os.environ), io.StringIO()) as processes:
        start_server(processes, kits, 60)
        start_site(processes, "centre-0", kits.site("centre-0"))
        with admin_session(kits, 60) as session:
            wait_for_sites(session, ["centre-0"], processes, 60)
            for target in ("centre-0", "server"):
                with pytest.raises(AuthorizationError):
                    session.cat_target(target, file="local/resources.json")


def test_a_site_of_another_project_cannot_join(tmp_path: Path) -> None:
    """A site whose kit comes from another provisioning (another CA) is refused in its TLS
    handshake: one line naming it, within a minute, and nothing left running."""
    before = _listeners_under()
    port = free_port()
    ours, theirs = (provision(Project("proxyfl", SERVER_HOST, port, ("centre-0",)), tmp_path / name)
                    for name in ("ours", "theirs"))  # fmt: skip
    started = time.monotonic()
    with FlareProcesses(tmp_path / "logs", dict(os.environ), io.StringIO()) as processes:
        start_server(processes, ours, 60)
        start_site(processes, "centre-0", theirs.site("centre-0"))
        with admin_session(ours, 60) as session, pytest.raises(FlareJobError) as refused:
            wait_for_sites(session, ["centre-0"], processes, 60)
    said = str(refused.value)
    assert refused.value.status == EXIT_NO_CONNECTION
    assert "site centre-0" in said and "certificate is not from this project's CA" in said
    assert "\n" not in said
    assert time.monotonic() - started < 60
    assert _listeners_under() <= before


def test_a_site_killed_mid_run_is_named_and_the_rerun_resumes_to_the_same_bytes(
    stores: Path, tmp_path: Path, helpers: Any
) -> None:
    """SIGKILL to a site's job process (what the OOM killer sends) in round 3 of 8: the
    job ends within a minute naming the site's centre and exit 5; run again, it resumes
    from the rounds every rank completed, to the bytes of a run never interrupted."""
    before = _listeners_under()
    run_dir = tmp_path / "flare" / "ProxyFL" / "seed_0"
    config = _config(stores, run_dir, "ProxyFL").model_copy(update={"rounds": 8, "resume": True})
    killed: list[float] = []

    def kill_centre_1(line: str) -> None:
        if killed or "[rank 1]" not in line or "round 3/8" not in line:
            return
        (worker,) = [p for p in psutil.Process().children(recursive=True)
                     if "worker_process" in " ".join(command_line(p))
                     and " ".join(command_line(p)).count("/centre-1")]  # fmt: skip
        worker.kill()
        killed.append(time.monotonic())

    with pytest.raises(TrainingJobFailed) as failed:
        run_job(TrainingJob(config, Placement(launcher="flare")), on_line=kill_centre_1)
    assert killed and time.monotonic() - killed[0] < 60
    assert failed.value.exit_code == EXIT_SITE_LOST, failed.value
    assert "rank 1 (centre-1)" in str(failed.value) and "lost mid-run" in str(failed.value)
    # the ranks the job's end stopped are no cause: the lost site's is the one record
    assert [failure.rank for failure in read_failures(run_dir)] == [1]
    assert _listeners_under() <= before

    lines: list[str] = []
    run_job(TrainingJob(config, Placement(launcher="flare")), on_line=lines.append)
    assert any("resuming after round" in line for line in lines), lines[-30:]
    reference = tmp_path / "mpiexec" / "ProxyFL" / "seed_0"
    run_job(TrainingJob(config.model_copy(update={"run_dir": reference}), Placement()),
            on_line=lambda _: None)  # fmt: skip
    helpers.same_run(helpers.dvc_hashed_files(reference), helpers.dvc_hashed_files(run_dir),
                     reference, run_dir)  # fmt: skip


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGKILL])
def test_the_launcher_stopped_or_killed_mid_run_leaves_no_process(
    stop: signal.Signals, stores: Path, tmp_path: Path
) -> None:
    """Ctrl-C to ``python -m proxyfl.launch.flare`` run by hand: exit 130 within seconds;
    SIGKILL (nothing of it runs after): its server and site die with it, and the site's job
    process after them. Either way no process of the job is left, and no listener. (Joint:
    one site, ``pooled``, the pooled data of the centres.)"""
    before = _listeners_under()
    run_dir = tmp_path / "Joint" / "seed_0"
    job = TrainingJob(_config(stores, run_dir, "Joint").model_copy(update={"rounds": 200}),
                      Placement(launcher="flare"))  # fmt: skip
    job.write_config()
    launcher = subprocess.Popen(job.command(), stdout=subprocess.PIPE, text=True,
                                stderr=subprocess.STDOUT)  # fmt: skip
    assert launcher.stdout is not None
    lines = []
    for line in launcher.stdout:
        lines.append(line)
        if "round 1/200" in line:
            break
    tree = [psutil.Process(launcher.pid), *psutil.Process(launcher.pid).children(recursive=True)]
    commands = [" ".join(command_line(p)) for p in tree]
    assert any("worker_process" in c and "/pooled" in c for c in commands), lines[-10:]
    stopped = time.monotonic()
    launcher.send_signal(stop)
    status = launcher.wait(timeout=30)
    launcher.stdout.close()
    assert status == (130 if stop == signal.SIGINT else -signal.SIGKILL)
    deadline = time.monotonic() + 15
    while (left := [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]) \
            and time.monotonic() < deadline:  # fmt: skip
        time.sleep(0.2)
    assert not left, [command_line(p) for p in left]
    assert time.monotonic() - stopped < 20
    assert _listeners_under() <= before
