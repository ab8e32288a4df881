"""A centre's rank, hosted by its FLARE site: :class:`RankExecutor`.

The server's one task (``rank``, :mod:`proxyfl.sites.controller`) names the job's sites
in rank order and the rank program's arguments; the executor runs
:func:`proxyfl.run.run_rank` over a :class:`~proxyfl.comm.world.MessageWorld` whose link is
FLARE's aux messages (:class:`~proxyfl.comm.flare.link.AuxLink`), and answers with the
rank's exit status. The rank's log lines go to the site's standard error with the rank
program's own prefix (``[rank N]``), as under mpiexec.

Every message it takes is checked for its sender's signature, and every one it sends is
signed, with the keys of the site's startup kit (:mod:`proxyfl.comm.flare.signing`): a
message in another site's name, or a stop in the server's, is refused and logged.

A federation's task carries the run's configuration instead of a path to it: the rank runs
in this site's own folders (:mod:`proxyfl.sites.federation`), and the answer carries the
files of the run that may leave the site.
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from nvflare.apis.event_type import EventType
from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable, make_reply
from nvflare.apis.signal import Signal

from plumbing.processes import exit_when_orphaned
from proxyfl.comm.flare.link import (
    MESSAGE_TOPIC,
    PAYLOAD,
    SEQUENCE_HEADER,
    STATUS,
    STOP_TOPIC,
    TAG_HEADER,
    AuxLink,
    Inbox,
    JobStopped,
    Refusals,
)
from proxyfl.comm.flare.signing import (
    EVERY_SITE,
    Credentials,
    CredentialsError,
    UnverifiedSender,
    kit_credentials,
    proven_sender,
)
from proxyfl.comm.inbox import LostMessage
from proxyfl.engine.validation import EXIT_BAD_INPUT, EXIT_STOPPED, clear_failures
from proxyfl.launch.progress import rank_line_format
from proxyfl.sites.federation import (
    CONFIG,
    GRAPH,
    REPLACE,
    RESULTS,
    RUN_NAME,
    FederationError,
    SiteFolders,
    results_that_leave,
)

RANK_TASK = "rank"
SITES = "sites"
ARGUMENTS = "arguments"
PLACEMENT = "placement"  # per rank: [local rank, ranks on its machine]
# the folder the job's relative paths (its stores, its run directory) are relative to
WORKING_DIRECTORY = "working_directory"
ERROR = "error"  # a site's one line, where its rank could not start
# the loggers of the rank program (proxyfl.run configures the root logger under mpiexec;
# here the root logger is FLARE's)
RANK_LOGGERS = ("proxyfl", "plumbing", "camelyon_proxyfl", "analysis")
logger = logging.getLogger(__name__)


class RankExecutor(Executor):
    """Runs this site's rank of the job (module doc)."""

    def __init__(self, send_timeout_s: float = 600.0) -> None:
        super().__init__()
        self.send_timeout_s = send_timeout_s
        self.inbox = Inbox()
        # this site's name, its job's, and its kit's keys (or why it has none): START_RUN's
        self.site = self.job = ""
        self.refusals = Refusals("", logger)
        self.credentials: Credentials | CredentialsError = CredentialsError("no job yet")
        self.members: frozenset[str] | None = None  # the job's sites, once its task names them

    def handle_event(self, event_type: str, fl_ctx: FLContext) -> None:
        if event_type == EventType.START_RUN:  # before any peer can send to this site
            # this job's process, whose site was killed outright, ends at once (the rank's
            # checkpoints are whole or absent): FLARE's own end of it took seconds, more as
            # the machine was busier, with nothing to save and no one left to hear it
            exit_when_orphaned(EXIT_STOPPED, f"proxyfl.sites: {fl_ctx.get_identity_name()}: "
                               "the site is gone; its job process ends")  # fmt: skip
            startup = Path(fl_ctx.get_workspace().get_startup_kit_dir())
            credentials = kit_credentials(startup)
            if isinstance(credentials, CredentialsError):  # said again as the task's error
                logger.error("proxyfl.sites: this site cannot sign its messages: %s", credentials)
            self.begin(fl_ctx.get_identity_name(), str(fl_ctx.get_job_id()), credentials)
            engine = fl_ctx.get_engine()
            engine.register_aux_message_handler(MESSAGE_TOPIC, self._on_message)
            engine.register_aux_message_handler(STOP_TOPIC, self._on_stop)

    def begin(self, name: str, job: str, credentials: Credentials | CredentialsError) -> None:
        """Take messages as the site ``name`` in the job ``job``, checked with
        ``credentials`` (none taken where it is the error of reading them)."""
        self.site, self.job, self.credentials = name, job, credentials
        self.refusals = Refusals(name, logger)

    def join(self, sites: list[str]) -> None:
        """The job's sites are ``sites`` (its task says so): what another participant of
        the project sent before is dropped, and what it sends from now on refused."""
        self.members = frozenset(sites)
        dropped = self.inbox.keep_from(self.members)
        if dropped:
            logger.error("proxyfl.sites: %s dropped %d message(s) from participants that are "
                         "not sites of this job", self.site, dropped)  # fmt: skip

    def _on_message(self, topic: str, request: Shareable, fl_ctx: FLContext) -> Shareable:
        payload = request.get(PAYLOAD)
        if not isinstance(payload, bytes):  # only bytes are ever accepted
            return make_reply(ReturnCode.BAD_REQUEST_DATA)
        sequence, tag = request.get_header(SEQUENCE_HEADER), request.get_header(TAG_HEADER)
        if not isinstance(sequence, int) or not isinstance(tag, str):
            return make_reply(ReturnCode.BAD_REQUEST_DATA)
        try:
            sender = proven_sender(self.credentials, request, self.job, MESSAGE_TOPIC, self.site,
                                   (tag, sequence), payload)  # fmt: skip
            members = self.members
            if members is not None and sender not in members:
                raise UnverifiedSender(f"{sender!r} is not a site of this job")
        except UnverifiedSender as reason:
            return self.refusals.answer(request, MESSAGE_TOPIC, reason)
        try:
            self.inbox.deliver(sender, tag, payload, sequence)
        except LostMessage as lost:  # told it had arrived, its sender sent the next one
            logger.error("proxyfl.sites: %s: %s", self.site, lost)
            self.inbox.stop(JobStopped(1, f"{lost}: the job cannot go on"))
            return make_reply(ReturnCode.BAD_REQUEST_DATA)
        return make_reply(ReturnCode.OK)  # a message asked again is answered again

    def _on_stop(self, topic: str, request: Shareable, fl_ctx: FLContext) -> Shareable:
        status = request.get(STATUS)
        if not isinstance(status, int):
            return make_reply(ReturnCode.BAD_REQUEST_DATA)
        try:
            sender = proven_sender(self.credentials, request, self.job, STOP_TOPIC, EVERY_SITE,
                                   (status,))  # fmt: skip
            assert isinstance(self.credentials, Credentials)  # proven above: they were read
            server = self.credentials.server
            if sender != server:
                raise UnverifiedSender(f"only the server ({server!r}) ends a job")
        except UnverifiedSender as reason:
            return self.refusals.answer(request, STOP_TOPIC, reason)
        self.inbox.stop(JobStopped(status, f"the job is ending with status {status}"))
        return make_reply(ReturnCode.OK)

    def execute(
        self, task_name: str, shareable: Shareable, fl_ctx: FLContext, abort_signal: Signal
    ) -> Shareable:
        if task_name != RANK_TASK:
            return make_reply(ReturnCode.TASK_UNKNOWN)
        from proxyfl.comm.world import MessageWorld

        sites = list(shareable[SITES])
        self.join(sites)
        rank = sites.index(fl_ctx.get_identity_name())
        local_rank, local_size = shareable[PLACEMENT][rank]
        reply = make_reply(ReturnCode.OK)
        if isinstance(self.credentials, CredentialsError):  # it could neither send nor take
            line = (f"proxyfl.run: error: rank {rank} ({sites[rank]}): this site cannot "
                    f"sign its messages: {self.credentials}")  # fmt: skip
            print(line, file=sys.stderr, flush=True)
            reply[STATUS], reply[ERROR] = EXIT_BAD_INPUT, line
            return reply  # the server ends the job on a failed rank's answer
        link = AuxLink(fl_ctx.get_engine(), fl_ctx, sites, rank, self.inbox, self.credentials,
                       self.job, abort_signal, self.send_timeout_s)  # fmt: skip
        world = MessageWorld(link, rank, len(sites), local_rank, local_size)
        run_dir: Path | None = None
        try:
            arguments, working_directory, run_dir = _job_at_this_site(shareable)
        except FederationError as error:  # before any work: bad input, as exit 2 says
            line = f"proxyfl.run: error: rank {rank} ({sites[rank]}): {error}"
            print(line, file=sys.stderr, flush=True)
            status, reply[ERROR] = EXIT_BAD_INPUT, line
        else:
            # the process is this job's alone (FLARE starts one per job): its folder is the
            # job's, as an MPI rank's is its launcher's (a federation's: the site's own)
            os.chdir(working_directory)
            status = _run_until_aborted(world, arguments, abort_signal)
        if status not in (0, None) and self.inbox.stopped is None:
            # the others would wait for this rank's next message: end the job
            with contextlib.suppress(JobStopped):
                link.abort(status)
        reply[STATUS] = int(status or 0)
        if run_dir is not None:  # a federation's site: what may leave it goes back
            reply[RESULTS] = results_that_leave(run_dir, rank, finished=status == 0)
        return reply


def _job_at_this_site(task: Shareable) -> tuple[list[str], Path, Path | None]:
    """The rank program's arguments, the folder it runs in and, for a federation's job,
    the run directory at this site (:mod:`proxyfl.sites.federation`): its configuration
    carried in the task, written into the site's own runs folder with its own stores."""
    if CONFIG not in task:  # the local launcher's: its config.json, in its folder
        if SiteFolders.configured():  # never a file and folder of the administrator's here
            raise FederationError(
                "this site runs a federation's jobs in its own folders: "
                "a job naming a configuration file and a folder is refused"
            )
        return list(task[ARGUMENTS]), Path(task[WORKING_DIRECTORY]), None
    from pydantic import ValidationError

    folders = SiteFolders.from_environment()
    try:
        config_file = folders.write_run_config(str(task[CONFIG]), str(task[RUN_NAME]),
                                               replace=bool(task.get(REPLACE)),
                                               graph=task.get(GRAPH))  # fmt: skip
    except ValidationError as error:
        raise FederationError(f"the job's configuration is not valid here: {error}") from error
    except OSError as error:
        raise FederationError(f"{folders.runs}: the run's folder cannot be written "
                              f"({error.strerror or error})") from error  # fmt: skip
    clear_failures(config_file.parent)  # an earlier attempt's are not this one's
    return ["--config", str(config_file)], folders.runs.parent, config_file.parent


def _run_until_aborted(world: Any, arguments: list[str], abort_signal: Signal) -> int:
    """:func:`run_rank_logged`, stopped once FLARE aborts the task (the job is aborted, or
    this site is gone: FLARE's job process then aborts its own run) even where the rank
    never waits for a message (Joint's one rank trained on, its site killed): a
    ``KeyboardInterrupt`` in this, the rank's thread, as SIGINT stops an MPI rank."""
    done, lock = threading.Event(), threading.Lock()

    def interrupt_when_aborted() -> None:
        while not done.wait(0.5):
            if abort_signal.triggered:
                with lock:
                    if not done.is_set():
                        _thread.interrupt_main()
                return

    if threading.current_thread() is threading.main_thread():  # FLARE runs tasks there
        threading.Thread(target=interrupt_when_aborted, daemon=True).start()
    try:
        try:
            return run_rank_logged(world, arguments)
        finally:
            with lock:
                done.set()
    except KeyboardInterrupt:  # raised just as the rank ended: it ended stopped all the same
        return EXIT_STOPPED


def run_rank_logged(world: Any, arguments: list[str]) -> int:
    """:func:`proxyfl.run.run_rank`, its log lines on standard error prefixed with the rank;
    its exit status (a :class:`JobStopped`'s, a ``SystemExit``'s, 1 for a bug's traceback)."""
    import mpi4py

    # MPI is never started at a site: run.json still names its library (a call MPI allows
    # before its start), but MPI_Init would open a listener on the site's network (MPICH's)
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    from proxyfl.run import run_rank

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(rank_line_format(f"rank {world.Get_rank()}")))
    loggers = [logging.getLogger(name) for name in RANK_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    try:
        return run_rank(world, arguments)
    except JobStopped as stopped:
        print(f"proxyfl.run: rank {world.Get_rank()} stopped: {stopped}", file=sys.stderr,
              flush=True)  # fmt: skip
        return stopped.status
    except KeyboardInterrupt:  # FLARE aborted the task (_run_until_aborted)
        print(f"proxyfl.run: rank {world.Get_rank()} stopped: FLARE aborted the job",
              file=sys.stderr, flush=True)  # fmt: skip
        return EXIT_STOPPED
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    except Exception:  # a bug's traceback, as -m mpi4py prints it before aborting
        for line in traceback.format_exc().splitlines():
            print(f"[rank {world.Get_rank()}] {line}", file=sys.stderr, flush=True)
        return 1
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
        sys.stderr.flush()
