"""One training job as a FLARE job on this machine: ``train.launcher: flare``.

    python -m proxyfl.launch.flare --ranks K --config RUN_DIR/config.json

what :class:`~proxyfl.launch.job.TrainingJob` runs in place of ``mpiexec -n K ...``, so
that the launch around it (the job's log, its progress, its failure records, retries that
resume from checkpoints) is the same. It

1. provisions a throw-away project under ``RUN_DIR/flare/`` (:mod:`proxyfl.launch.kits`: a
   new root CA, a kit per rank's centre, mutual TLS), its server on ``127.0.0.1`` at a free
   port;
2. starts the server, then one FLARE site per rank, each a child of this process, and
   waits (at most ``--connect-timeout`` seconds) until every site has connected;
3. submits the job (:class:`~proxyfl.sites.controller.RunController` and
   :class:`~proxyfl.sites.executor.RankExecutor`) and follows it, passing the ranks' lines
   to its standard output and every process's lines to ``RUN_DIR/flare/logs/``;
4. stops every process it started, at the end, at Ctrl-C or on any failure, and exits
   with the job's status.

Exit statuses beyond the rank program's: :data:`EXIT_NO_CONNECTION` (a site could not
connect: another project's certificate, the server unreachable or not up in time),
:data:`EXIT_SITE_LOST` (a site's process ended mid-run: its centre is named, and the rank
left a failure record), :data:`~plumbing.refusals.EXIT_REFUSED` (the server's port is
taken).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from plumbing.network import accepts, free_port, port_taken
from plumbing.processes import adopt_orphans, parent_bound_command, stop_trees
from plumbing.refusals import EXIT_REFUSED, machine_refusal
from proxyfl.engine.validation import RankFailure, record_failure
from proxyfl.launch.kits import ADMIN, Kits, Participant, Project, ProvisionError, provision

logger = logging.getLogger(__name__)

EXIT_NO_CONNECTION = 4
EXIT_SITE_LOST = 5
SERVER_HOST = "localhost"  # a loopback name: FLARE then listens on 127.0.0.1 only
OUTCOME_FILE = "outcome.json"
_WORKER_MODULE = "nvflare.private.fed.app.client.worker_process"  # a site's job process
# what a site whose certificate is not from the server's CA (or the server's not from its)
# reads in its TLS handshake, from gRPC's C core
CERTIFICATE_REFUSED = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed",
                        "unknown ca", "bad certificate")  # fmt: skip


class FlareJobError(RuntimeError):
    """The job could not run; ``status`` is the exit status to end with."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def site_names(centers: Sequence[int], ranks: int) -> list[str]:
    """A site per rank, named by its centre (the pooled data of Joint: ``pooled``)."""
    if ranks == 1 and len(centers) > 1:
        return ["pooled"]
    return [f"centre-{center}" for center in list(centers)[:ranks]]


@dataclass
class _Process:
    """A FLARE process this launcher started, its lines relayed."""

    name: str
    popen: subprocess.Popen
    log: TextIO
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=40))
    relay: threading.Thread | None = None

    def lines_with(self, needles: Sequence[str]) -> list[str]:
        return [line for line in self.tail if any(n in line for n in needles)]


class FlareProcesses:
    """The server and the sites of one job on this machine, each a child of this process;
    stopped, with everything they started, when the block ends."""

    def __init__(self, logs: Path, env: dict[str, str], out: TextIO) -> None:
        self.logs, self.env, self.out = logs, env, out
        self.processes: dict[str, _Process] = {}
        self._out_lock = threading.Lock()
        logs.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> FlareProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, name: str, participant: Participant) -> _Process:
        # bound to this launcher: killed outright (SIGKILL), it takes them with it, and their
        # job processes follow their parents (FLARE's own watch)
        command, kit = parent_bound_command(participant.command()), participant.kit
        log = open(self.logs / f"{name}.log", "a", encoding="utf-8")  # noqa: SIM115
        popen = subprocess.Popen(command, cwd=kit, env=self.env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 text=True, errors="replace")  # fmt: skip
        process = _Process(name, popen, log)
        process.relay = threading.Thread(target=self._relay, args=(process,), daemon=True)
        process.relay.start()
        self.processes[name] = process
        return process

    def _relay(self, process: _Process) -> None:
        assert process.popen.stdout is not None
        for line in process.popen.stdout:
            process.log.write(line)
            process.log.flush()  # a job that hangs is read from its logs
            process.tail.append(line.rstrip("\n"))
            if "[rank " in line or line.startswith("proxyfl.run:"):  # the ranks' own lines
                with self._out_lock:
                    self.out.write(line)
                    self.out.flush()
        process.log.flush()

    def ended(self) -> list[_Process]:
        return [p for p in self.processes.values() if p.popen.poll() is not None]

    def stop(self, grace_s: float = 3.0) -> None:
        """SIGTERM to every process started and everything under it (FLARE's job processes
        run in sessions of their own), SIGKILL to what is left after ``grace_s``: the job's
        results are written by then (a site answers once its rank has written them), and
        a FLARE process winding a job down took 8 s and more."""
        stop_trees([process.popen.pid for process in self.processes.values()], grace_s)
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.popen.wait(timeout=5)
            if process.relay is not None:
                process.relay.join(timeout=5)
            process.log.close()


def write_job(folder: Path, name: str, run: dict[str, Any]) -> Path:
    """The FLARE job folder: the server's controller, given ``run`` (the arguments of
    :class:`~proxyfl.sites.controller.RunController`, its ``sites`` among them), and the
    sites' executor, by class path (installed code; the job carries no code of its own)."""
    config = folder / "app" / "config"
    config.mkdir(parents=True, exist_ok=True)
    meta = {"name": name, "resource_spec": {}, "deploy_map": {"app": ["@ALL"]},
            "min_clients": len(run["sites"])}  # fmt: skip
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    controller = {"id": "run", "path": "proxyfl.sites.controller.RunController", "args": run}
    server = {"format_version": 2, "workflows": [controller], "components": []}
    (config / "config_fed_server.json").write_text(json.dumps(server, indent=1))
    executor = {
        "tasks": ["rank"],
        "executor": {"path": "proxyfl.sites.executor.RankExecutor", "args": {}},
    }
    client = {"format_version": 2, "executors": [executor], "components": []}
    (config / "config_fed_client.json").write_text(json.dumps(client, indent=1))
    return folder


@contextlib.contextmanager
def admin_session(kits: Kits | Path, timeout_s: float) -> Iterator[Any]:
    """A FLARE admin session with the administrator's kit (of ``kits``, or the kit
    folder ``kits``), connected within ``timeout_s``."""
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    kit = kits.admin if isinstance(kits, Kits) else kits
    settings = kit / "startup" / "fed_admin.json"
    username = ADMIN
    if settings.is_file():  # a kit provisioned elsewhere may name its administrator otherwise
        username = json.loads(settings.read_text())["admin"]["username"]
    session = new_secure_session(username=username, startup_kit_location=str(kit.resolve()),
                                 timeout=timeout_s)  # fmt: skip
    try:
        yield session
    finally:
        with contextlib.suppress(Exception):
            session.close()


def _connected(session: Any) -> set[str]:
    return {client.name for client in session.get_connected_client_list()}


def _provisioned(project: Project, out: Path) -> Kits:
    """``project``'s kits in ``out`` (:func:`~proxyfl.launch.kits.provision`, the sites'
    job processes forked warm), or :class:`FlareJobError` with the machine's refusal
    status: a folder that cannot be written, a full disk, a provisioning that failed or
    did not end are no rank's fault, and a retry would meet them again."""
    try:
        return provision(project, out, warm_jobs=True)
    except (ProvisionError, OSError, subprocess.TimeoutExpired) as error:
        cause = machine_refusal(error) or str(error)
        raise FlareJobError(f"the job's kits could not be provisioned: {cause}",
                            EXIT_REFUSED) from error  # fmt: skip


def run_flare_job(
    run_dir: Path, arguments: list[str], sites: list[str], connect_timeout_s: float,
    out: TextIO = sys.stdout,
) -> int:  # fmt: skip
    """The job (module doc); its exit status. Raises :class:`FlareJobError`."""
    workspace = run_dir / "flare"
    outcome_file = workspace / OUTCOME_FILE
    outcome_file.unlink(missing_ok=True)
    port = free_port()
    project = Project(name="proxyfl", server_host=SERVER_HOST, port=port, sites=tuple(sites))
    started = time.perf_counter()
    # a site's job process (in a session of its own, or a warm server's shim) outlives its
    # site when the site is stopped first: reaped here, not by the launch's wrapper at exit
    adopt_orphans()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    placement = [[rank, len(sites)] for rank in range(len(sites))]  # all on this machine
    with contextlib.ExitStack() as stack:
        # the kits' keys do not outlive the job (a rerun provisions a project of its own)
        stack.callback(shutil.rmtree, workspace / "kits", ignore_errors=True)
        # the sites' job processes fork from run_job's warm server, as mpiexec's ranks do
        kits = _provisioned(project, workspace / "kits" / f"port-{port}")
        processes = stack.enter_context(FlareProcesses(workspace / "logs", env, out))
        server = start_server(processes, kits, connect_timeout_s)
        for site in sites:
            start_site(processes, site, kits.site(site))
        with admin_session(kits, connect_timeout_s) as session:
            wait_for_sites(session, sites, processes, connect_timeout_s)
            logger.info("FLARE server and %d site(s) up in %.1f s", len(sites),
                        time.perf_counter() - started)  # fmt: skip
            run = {"sites": sites, "placement": placement, "arguments": arguments,
                   "working_directory": str(Path.cwd()),
                   "outcome_file": str(outcome_file.resolve())}  # fmt: skip
            job = write_job(workspace / "job", f"proxyfl-{run_dir.name}", run)
            job_id = session.submit_job(str(job.resolve()))
            try:
                return _follow(session, job_id, sites, processes, server, outcome_file, run_dir)
            except BaseException:
                with contextlib.suppress(Exception):
                    session.abort_job(job_id)
                raise


def start_server(processes: FlareProcesses, kits: Kits, timeout_s: float) -> _Process:
    """The server of ``kits``, once it listens on its port (at most ``timeout_s``)."""
    port = kits.project.port
    if port_taken(port):
        raise FlareJobError(f"127.0.0.1:{port}: the FLARE server's port is taken by another "
                            "process", EXIT_REFUSED)  # fmt: skip
    server = processes.start("server", Participant(kits.server, "server", SERVER_HOST))
    _wait_for(lambda: accepts(port), timeout_s, processes,
              f"the FLARE server to listen on 127.0.0.1:{port}")  # fmt: skip
    return server


def start_site(processes: FlareProcesses, site: str, kit: Path) -> _Process:
    """Site ``site`` from its kit (connecting to the server its kit names)."""
    return processes.start(site, Participant(kit, "site", site))


def _wait_for(ready: Any, timeout_s: float, processes: FlareProcesses, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        for process in processes.ended():
            said = process.tail[-1] if process.tail else "no output"
            raise FlareJobError(f"{process.name} exited ({process.popen.returncode}) before "
                                f"{what}: {said}", EXIT_NO_CONNECTION)  # fmt: skip
        if time.monotonic() > deadline:
            raise FlareJobError(f"timed out after {timeout_s:.0f} s waiting for {what}",
                                EXIT_NO_CONNECTION)  # fmt: skip
        time.sleep(0.2)


def wait_for_sites(session: Any, sites: list[str], processes: FlareProcesses,
                   timeout_s: float) -> None:  # fmt: skip
    """Until every one of ``sites`` has connected to the server; a site whose TLS handshake
    was refused, whose process ended, or that has not connected within ``timeout_s`` is an
    error naming it and why."""
    deadline = time.monotonic() + timeout_s
    while missing := [site for site in sites if site not in _connected(session)]:
        for site in missing:
            process = processes.processes[site]
            refused = process.lines_with(CERTIFICATE_REFUSED)
            if refused:
                why = ("its certificate is not from this project's CA, or the server's not "
                       f"from its (TLS: {refused[-1].strip()[-120:]})")  # fmt: skip
            elif process.popen.poll() is not None:
                why = _ended_by(process.popen.returncode)
            elif time.monotonic() > deadline:
                why = f"not connected within {timeout_s:.0f} s"
            else:
                continue
            raise FlareJobError(f"site {site} could not join the FLARE server at "
                                f"{SERVER_HOST}: {why}; its log: {process.log.name}",
                                EXIT_NO_CONNECTION)  # fmt: skip
        time.sleep(0.5)


def _site_jobs(processes: FlareProcesses, sites: list[str]) -> dict[str, set[int]]:
    """Each site's job processes now (FLARE's workers, in sessions of their own)."""
    import psutil

    jobs: dict[str, set[int]] = {}
    for site in sites:
        with contextlib.suppress(psutil.NoSuchProcess):
            top = psutil.Process(processes.processes[site].popen.pid)
            jobs[site] = set()
            for child in top.children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    if any(_WORKER_MODULE in part for part in child.cmdline()):
                        jobs[site].add(child.pid)
    return jobs


def _follow(session: Any, job_id: str, sites: list[str], processes: FlareProcesses,
            server: _Process, outcome_file: Path, run_dir: Path) -> int:  # fmt: skip
    """Until the job ends: its status, from the outcome every site answered; or the first
    site lost (its process, or its job's, ended before it answered) named, in a failure
    record of its rank and an error."""
    workers: dict[str, set[int]] = {site: set() for site in sites}
    while True:
        outcome = json.loads(outcome_file.read_text()) if outcome_file.exists() else None
        if outcome is not None and None not in outcome["sites"].values():
            return int(outcome["status"])
        lost = _lost_site(sites, processes, workers)
        if lost is None and outcome is not None:  # a site that never answered
            site = next(name for name, status in outcome["sites"].items() if status is None)
            lost = (sites.index(site), site, "it never answered (its job process ended?)")
        if lost is not None:
            rank, site, why = lost
            message = f"site {site} was lost mid-run: {why}"
            record_failure(run_dir, RankFailure(rank=rank, client=f"rank {rank} ({site})",
                                                phase="training", error=message))  # fmt: skip
            raise FlareJobError(message, EXIT_SITE_LOST)
        if server.popen.poll() is not None:
            ended = _ended_by(server.popen.returncode)
            raise FlareJobError(f"the FLARE server ended mid-run: {ended}", EXIT_SITE_LOST)
        status = str(session.get_job_meta(job_id).get("status", ""))
        if status.startswith("FINISHED") and outcome is None:
            time.sleep(1.0)  # the outcome is written before the job finishes
            if not outcome_file.exists():
                raise FlareJobError(f"the FLARE job ended ({status}) without an outcome; the "
                                    f"server's log: {server.log.name}", 1)  # fmt: skip
        time.sleep(0.5)


def _lost_site(sites: list[str], processes: FlareProcesses,
               workers: dict[str, set[int]]) -> tuple[int, str, str] | None:  # fmt: skip
    """``(rank, site, why)`` of the first site whose process has ended, or whose job
    process (a FLARE worker, seen before in ``workers``) has; ``workers`` is updated."""
    import psutil

    for rank, site in enumerate(sites):
        process = processes.processes[site]
        if process.popen.poll() is not None:
            return rank, site, _ended_by(process.popen.returncode)
        for pid in workers[site]:
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    continue
            return rank, site, "its job process ended (out of memory? killed?)"
        workers[site] |= _site_jobs(processes, [site]).get(site, set())
    return None


def _ended_by(returncode: int) -> str:
    if returncode < 0:
        return f"its process was ended by signal {signal.Signals(-returncode).name}"
    return f"its process exited with status {returncode}"


def main(argv: Sequence[str] | None = None) -> int:
    from plumbing.processes import start_command

    start_command()
    parser = argparse.ArgumentParser(prog="python -m proxyfl.launch.flare",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--config", type=Path, required=True, help="the job's config.json")
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=60.0,
        help="seconds the server and the sites have to come up and connect",
    )
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("nvflare").setLevel(logging.WARNING)  # its admin session's chatter
    config = json.loads(options.config.read_text(encoding="utf-8"))
    run_dir = options.config.resolve().parent
    sites = site_names(config.get("centers") or list(range(options.ranks)), options.ranks)
    try:
        return run_flare_job(run_dir, ["--config", str(options.config.resolve())], sites,
                             options.connect_timeout)  # fmt: skip
    except FlareJobError as error:
        print(f"proxyfl.launch.flare: error: {error}", file=sys.stderr, flush=True)
        return error.status
    except KeyboardInterrupt:
        print("proxyfl.launch.flare: stopped", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
