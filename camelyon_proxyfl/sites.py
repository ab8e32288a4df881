"""``camelyon-proxyfl sites``: the FLARE participants of a federation across hospitals.

    camelyon-proxyfl sites provision --out DIR --server-host HOST [--port PORT]
    camelyon-proxyfl sites start KIT [--data DIR --runs DIR]
    camelyon-proxyfl sites submit ADMIN_KIT [--algorithms ... --seeds ... --rounds N ...]
    camelyon-proxyfl sites test-split STORE... --out DIR

``provision`` writes the startup kits of one project (``nvflare provision``,
:mod:`proxyfl.launch.kits`): the server's (for HOST, the name every site connects to), one
per centre of ``train.centers`` (``centre-C``, each with its own certificate and key), and
an administrator's, all from one new root CA, every connection mutual TLS. Each kit goes
to its participant; the keys in them are secrets.

``start`` runs the participant a kit makes its holder, in the foreground, until stopped
(Ctrl-C, SIGTERM: it and every process it started end). A site says when it has joined
its server; one whose certificate the server refuses (or whose server's it refuses), or
that has not joined within ``--connect-timeout``, ends with one line and
:data:`~proxyfl.launch.flare.EXIT_NO_CONNECTION`. A server whose port is taken ends with
:data:`~plumbing.refusals.EXIT_REFUSED`. A site's own folders
(:class:`~proxyfl.sites.federation.SiteFolders`: its centre's store, its runs) are
``--data`` and ``--runs``, by default ``train.data`` and ``train.runs`` of the project it
is started in.

``submit`` runs the training jobs of ``train:`` (flags as ``camelyon-proxyfl train``'s) on
the federation an administrator's kit reaches, one after another
(:mod:`proxyfl.sites.submit`): each site trains its centre's rank in its own folders,
and the results that may leave the sites come back into ``RUNS/ALGORITHM/seed_S``.

``test-split`` writes, for each store, a copy holding its test split only
(:mod:`wsi.store.test_split`): what a centre gives the other sites, whose clients are
evaluated on every centre's test split; none of its training patches leaves it.
docs/sites.md is the page for a hospital's IT.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from camelyon_proxyfl.params.base import (
    DEFAULT_PARAMS,
    ParamsCommand,
    config_option,
    enter_project,
    from_folder,
    load_sections,
    project_root,
)
from camelyon_proxyfl.params.train import TrainParams, TrainSection
from plumbing.cli import EXIT_BAD_PARAMETERS, ConfigError, exit_on_bad_parameters
from plumbing.network import port_taken
from plumbing.processes import adopt_orphans, parent_bound_command, stop_trees
from plumbing.refusals import EXIT_REFUSED
from plumbing.warm import warm_server
from proxyfl.config import TrainOptions
from proxyfl.engine.validation import clear_failures
from proxyfl.launch.flare import CERTIFICATE_REFUSED, EXIT_NO_CONNECTION, FlareJobError, site_names
from proxyfl.launch.job import SERVER_JOB_IMPORTS, rank_imports
from proxyfl.launch.kits import KitError, Participant, Project, ProvisionError, provision
from proxyfl.launch.kits import store_in_place as keep_stores_in_kit
from proxyfl.launch.placement import Placement
from proxyfl.launch.rundir import write_config
from proxyfl.sites.federation import SiteFolders
from proxyfl.sites.submit import federation_refusal, federation_session, submit_run
from wsi.store.reader import read_store_info
from wsi.store.schema import StoreError, StoreSpaceError, store_path
from wsi.store.test_split import write_test_split

DEFAULT_PORT = 8002  # FLARE's own default for the server's one port
# what a site's FLARE client says once the server has taken its certificate and name
JOINED = "Successfully registered client"
STOP_GRACE_S = 5.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="camelyon-proxyfl sites",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    kits = commands.add_parser("provision", help="the startup kits of the server, each "
                               "centre of params.yaml and an administrator")  # fmt: skip
    kits.add_argument("--config", type=Path, default=Path("params.yaml"), metavar="PARAMS",
                      help="parameters file whose train.centers are the sites")  # fmt: skip
    kits.add_argument("--out", type=Path, required=True, help="folder of the kits")
    kits.add_argument("--server-host", required=True,
                      help="the server's host name, as the sites reach it (in its "
                      "certificate; localhost for a trial on one machine)")  # fmt: skip
    kits.add_argument("--port", type=int, default=DEFAULT_PORT,
                      help="the server's one port, inbound, for the sites and the "
                      f"administrator (default {DEFAULT_PORT})")  # fmt: skip
    kits.add_argument("--project", default="proxyfl", help="the FLARE project's name")
    kits.add_argument("--heart-beat-timeout", type=int, default=60, metavar="SECONDS",
                      help="how long the server waits for a silent site before it drops "
                      "it, and a job that needs it ends (default 60)")  # fmt: skip
    start = commands.add_parser("start", help="run the server or a site from its kit")
    start.add_argument("kit", type=Path, help="the participant's startup kit (its folder)")
    start.add_argument("--connect-timeout", type=float, default=300.0, metavar="SECONDS",
                       help="a site: how long it may take to join its server before it "
                       "gives up (default 300)")  # fmt: skip
    start.add_argument("--data", type=Path, default=None,
                       help="a site: the folder of its centre's store (default: train.data "
                       "of the project it is started in)")  # fmt: skip
    start.add_argument("--runs", type=Path, default=None,
                       help="a site: the folder its runs land in (default: train.runs of "
                       "the project it is started in)")  # fmt: skip
    shared = commands.add_parser("test-split", help="copies of stores holding their test "
                                 "split only: what a centre gives the other sites")  # fmt: skip
    shared.add_argument("stores", type=Path, nargs="+", metavar="STORE",
                        help="a centre's store (center_C.h5)")  # fmt: skip
    shared.add_argument("--out", type=Path, required=True,
                        help="folder of the copies, each center_C.h5 for its store's centre "
                        "C (a store holding training patches there is never replaced)")  # fmt: skip
    commands.add_parser("submit", add_help=False,
                        help="run training jobs on a running federation, from the "
                        "administrator's kit (camelyon-proxyfl sites submit --help)")  # fmt: skip
    return parser


def _submit_parser(argv: Sequence[str]) -> ParamsCommand[TrainParams]:
    command = ParamsCommand(TrainParams, "camelyon-proxyfl sites submit",
                            "Run the training jobs of train: on a running federation, one "
                            "after another, from the administrator's kit.", argv)  # fmt: skip
    command.parser.add_argument("kit", type=Path, help="the administrator's startup kit")
    command.parser.add_argument(
        "--connect-timeout", type=float, default=60.0, metavar="SECONDS",
        help="how long the server and each site of a job may take to answer, and a site "
        "may be gone mid-run, before the job ends (default 60)",
    )  # fmt: skip
    command.parser.add_argument(
        "--replace", action="store_true",
        help="train anew each site's run of the same name (its folder there deleted first); "
        "without it, a site's run of another configuration is refused, an unfinished one "
        "resumes from its checkpoints",
    )  # fmt: skip
    # the sites' placement is the federation's: no launcher, hosts or ranks to choose
    command.add_section(TrainSection, ("train",), exclude=(
        "options", "data", "launcher", "hosts", "hostfile", "ssh_timeout_s", "ranks", "retries",
    ))  # fmt: skip
    command.add_section(TrainOptions, ("train", "options"),
                        group="training options (train.options in params.yaml)")  # fmt: skip
    return command


@exit_on_bad_parameters
def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["submit"]:  # flags of params.yaml's train: section, as train's
        return _submit(words[1:])
    args = _parser().parse_args(argv)
    if args.command == "provision":
        return _provision(args, argv)
    if args.command == "test-split":
        return _test_split(args.stores, args.out)
    return _start(args.kit, args.connect_timeout, args.data, args.runs)


def _test_split(stores: Sequence[Path], out: Path) -> int:
    """Each store's test split as ``OUT/center_C.h5`` (:mod:`wsi.store.test_split`); a
    store that cannot be copied is one ``error:`` line, the others copied: exit 2, or 3
    where the disk had no room (the machine's refusal)."""
    failures: list[StoreError] = []
    for store in stores:
        try:
            center = read_store_info(store, splits=()).attrs.center
            target = store_path(out, center)
            patches = write_test_split(store, target)
        except StoreError as error:
            print(f"error: {error}", file=sys.stderr)
            failures.append(error)
            continue
        print(f"{target}: centre {center}'s test split, {patches} patches (no training patch)")
    if any(isinstance(error, StoreSpaceError) for error in failures):
        return EXIT_REFUSED
    return EXIT_BAD_PARAMETERS if failures else 0


def _site_folders(data: Path | None, runs: Path | None) -> SiteFolders:
    """A site's folders: those given, else the project's ``train.data`` and ``train.runs``
    (the project of the working directory, or of a folder above it), else ``data/patches``
    and ``runs`` here; absolute."""
    here = Path.cwd()
    root = project_root(here)
    if root is not None and (data is None or runs is None):
        train = load_sections(TrainParams, root / DEFAULT_PARAMS).train
        data, runs = data or root / train.data, runs or root / train.runs
    return SiteFolders((here / (data or TrainSection().data)).resolve(),
                       (here / (runs or TrainSection().runs)).resolve())  # fmt: skip


def _submit(argv: list[str]) -> int:
    args, params = _submit_parser(argv).parse()
    # the admin session's retries and relays, said as they happen; what failed is said once
    # here, in the command's own error line
    logging.getLogger("nvflare").setLevel(logging.CRITICAL)
    refused = {config.algorithm: why for config in params.train.job_configs()
               if (why := federation_refusal(config)) is not None}  # fmt: skip
    for algorithm, why in refused.items():  # before anything is submitted
        print(f"error: {algorithm}: {why}", file=sys.stderr)
    if refused:
        return EXIT_BAD_PARAMETERS
    try:
        with federation_session(args.kit, args.connect_timeout) as session:
            return _submit_jobs(session, params.train, args.connect_timeout, args.replace)
    except FlareJobError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return error.status


def _submit_jobs(session: Any, train: TrainSection, connect_timeout_s: float,
                 replace: bool) -> int:  # fmt: skip
    """Every job of ``train`` on the federation of ``session``, one after another: 0, or
    the status of the first job a rank failed (the others still run); a job the federation
    could not run at all (a site not joined, one lost mid-run) ends the command there."""
    status = 0
    for config in train.job_configs():
        assert config.run_dir is not None
        run_name = config.run_dir.relative_to(train.runs).as_posix()
        config.run_dir.mkdir(parents=True, exist_ok=True)
        write_config(config)  # what was asked, beside what comes back
        clear_failures(config.run_dir)  # an earlier attempt's
        try:
            outcome = submit_run(session, config, run_name, connect_timeout_s,
                                 on_status=lambda line: print(line, flush=True),
                                 replace=replace)  # fmt: skip
        except FlareJobError as error:
            print(f"error: {config.algorithm} seed {config.seed}: {error}", file=sys.stderr,
                  flush=True)  # fmt: skip
            return error.status
        except KeyboardInterrupt:
            print(f"{config.algorithm} seed {config.seed}: stopped (the job aborted)",
                  file=sys.stderr, flush=True)  # fmt: skip
            return 130
        for site, line in outcome.errors.items():
            print(f"{site}: {line}", file=sys.stderr)
        if outcome.status != 0:
            failed = ", ".join(f"{site} {code}" for site, code in outcome.sites.items() if code)
            print(f"error: {config.algorithm} seed {config.seed} failed with exit code "
                  f"{outcome.status} (sites: {failed or 'none answered'}); what came back: "
                  f"{config.run_dir}", file=sys.stderr, flush=True)  # fmt: skip
            status = status or outcome.status
            continue
        print(f"{config.algorithm} seed {config.seed}: finished; {len(outcome.files)} files "
              f"back in {config.run_dir} (models, predictions and checkpoints stay at the "
              "sites)", flush=True)  # fmt: skip
    return status


def _provision(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    started_in = enter_project(argv)
    out = from_folder(started_in, args.out)
    path, required = config_option(argv)
    centers = load_sections(TrainParams, path, required=required).train.centers
    try:
        project = Project(args.project, args.server_host, args.port,
                          tuple(site_names(centers, len(centers))),
                          heart_beat_timeout_s=args.heart_beat_timeout)  # fmt: skip
    except ValueError as error:
        raise ConfigError("command line", str(error)) from error
    try:
        kits = provision(project, out, warm_jobs=True)  # where `sites start` runs a site
    except ProvisionError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"{kits.root}: the kits of project {project.name} (a new root CA; the keys in the "
          "kits are secrets: hand each to its participant only)")  # fmt: skip
    print(f"  {kits.server}: the server, on {project.server_host}; open TCP port "
          f"{project.port} inbound to it, and nothing else")  # fmt: skip
    for center, site in zip(centers, project.sites, strict=True):
        print(f"  {kits.site(site)}: centre {center}'s site (it connects out to the server)")
    print(f"  {kits.admin}: the administrator's (submits and follows jobs)")
    print("each starts with: camelyon-proxyfl sites start KIT")
    return 0


def _start(kit: Path, connect_timeout_s: float, data: Path | None, runs: Path | None) -> int:
    try:
        participant = Participant.of(kit)
    except KitError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_PARAMETERS
    env = dict(os.environ)
    if participant.role == "server":
        keep_stores_in_kit(kit)  # where the kit is now, not where it was provisioned
        port = int(_server_target(kit).rsplit(":", 1)[1])
        if port_taken(port, "0.0.0.0"):
            print(f"error: port {port}: the FLARE server's port is taken by another process",
                  file=sys.stderr)  # fmt: skip
            return EXIT_REFUSED
        # each job's process (its controller's) forked from one warm interpreter
        with warm_server(dict(env), SERVER_JOB_IMPORTS) as warm:
            if warm is not None:
                env.update(warm.environment())
            return _run(participant, env, connect_timeout_s)
    folders = _site_folders(data, runs)  # its job processes inherit its folders
    env.update(folders.environment())
    print(f"site {participant.name}: stores in {folders.data}, runs in {folders.runs}",
          file=sys.stderr, flush=True)  # fmt: skip
    own = re.fullmatch(r"centre-(\d+)", participant.name)
    store = store_path(folders.data, int(own.group(1))) if own is not None else None
    if store is not None and not store.is_file():
        print(f"warning: site {participant.name}: no store {store}: every job will fail "
              "here until it is built (or give --data)", file=sys.stderr, flush=True)  # fmt: skip
    # each job's process forked from one interpreter that imported torch and the trainer
    # once for the site's life (its kit's WarmJobLauncher; ~4 s of CPU a job otherwise)
    with warm_server(dict(env), rank_imports(Placement(launcher="flare"))) as warm:
        if warm is not None:
            env.update(warm.environment())
        return _run(participant, env, connect_timeout_s)


def _run(participant: Participant, env: dict[str, str], connect_timeout_s: float) -> int:
    """The participant's FLARE process, until it ends or this command is stopped."""
    adopt_orphans()  # the participant's job processes run in sessions of their own
    # a session of its own: Ctrl-C is this command's to handle (the participant is stopped
    # with everything it started), and it dies with this command all the same
    process = subprocess.Popen(parent_bound_command(participant.command()),
                               cwd=participant.kit, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True, errors="replace",
                               start_new_session=True)  # fmt: skip
    watch = _Watch(participant, process, connect_timeout_s)
    stopped: list[int] = []

    def stop(number: int, _frame: FrameType | None) -> None:
        stopped.append(number)
        watch.ended.set()

    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, stop)
    relay = threading.Thread(target=watch.relay, daemon=True)
    relay.start()
    try:
        while not watch.ended.wait(0.5):
            watch.check_joined()
    finally:
        stop_trees([process.pid], STOP_GRACE_S)
        process.wait()
        relay.join(timeout=5)
    if watch.error is not None:
        print(f"error: {watch.error}", file=sys.stderr, flush=True)
        return EXIT_NO_CONNECTION
    if stopped:
        print(f"{participant.role} {participant.name}: stopped", file=sys.stderr, flush=True)
        return 128 + stopped[0]
    return process.returncode if process.returncode >= 0 else 128 - process.returncode


def _server_target(kit: Path) -> str:
    (server, *_) = json.loads((kit / "startup" / "fed_server.json").read_text())["servers"]
    return str(server["service"]["target"])


class _Watch:
    """The participant's lines, passed on; for a site, whether it joined its server."""

    def __init__(self, participant: Participant, process: subprocess.Popen[str],
                 connect_timeout_s: float) -> None:  # fmt: skip
        self.participant, self.process = participant, process
        self.deadline = time.monotonic() + connect_timeout_s
        self.joined = participant.role == "server"
        self.error: str | None = None
        self.ended = threading.Event()

    def relay(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if not self.joined and JOINED in line:
                self.joined = True
                print(f"site {self.participant.name}: joined its server", file=sys.stderr,
                      flush=True)  # fmt: skip
            elif not self.joined and any(words in line for words in CERTIFICATE_REFUSED):
                self._fail("its certificate is not from the server's CA, or the server's "
                           f"not from its (TLS: {line.strip()[-120:]})")  # fmt: skip
        self.ended.set()

    def check_joined(self) -> None:
        if not self.joined and time.monotonic() > self.deadline:
            self._fail("not joined within the connect timeout: is the server up, and its "
                       "port open to this machine?")  # fmt: skip

    def _fail(self, why: str) -> None:
        self.error = f"site {self.participant.name} could not join its server: {why}"
        self.ended.set()


if __name__ == "__main__":
    sys.exit(main())
