"""The FLARE server's part of a job: :class:`RunController` paces it.

It sends every site the one task ``rank`` (the sites in rank order, the rank program's
arguments, where each rank runs) and waits for all of them. A rank that aborts says so
(:data:`~proxyfl.comm.flare.link.ABORT_TOPIC`); the server then tells every site
(:data:`~proxyfl.comm.flare.link.STOP_TOPIC`) so that no rank waits for a message that
will never come, and the job's status is that rank's. An abort counts only where its
sender's signature proves it came from the site of the rank it names, and the stop is
signed by the server (:mod:`proxyfl.comm.flare.signing`). A rank that answers its task
with a failure without having aborted (it could not sign, or its abort was lost) ends the
job all the same. The outcome (each rank's status, the
job's) is written as JSON to ``outcome_file`` for the launcher on this machine.

A job submitted to a running federation (:mod:`proxyfl.sites.submit`) carries the
run's configuration instead (``config``, ``run_name``: :mod:`proxyfl.sites.federation`);
each site answers with the files that may leave it, and the outcome and those files are
written into the job's result folder on the server (:data:`OUTCOME_FILE`,
:data:`RESULTS_FOLDER`), which FLARE keeps with the job for its administrator to download.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from nvflare.apis.client import Client
from nvflare.apis.controller_spec import ClientTask, Task
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.impl.controller import Controller
from nvflare.apis.shareable import Shareable, make_reply
from nvflare.apis.signal import Signal

from plumbing.processes import exit_when_orphaned
from proxyfl.comm.flare.link import (
    ABORT_TOPIC,
    RANK,
    SERVER,
    STATUS,
    STOP_TOPIC,
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
from proxyfl.engine.validation import EXIT_STOPPED
from proxyfl.sites.executor import (
    ARGUMENTS,
    ERROR,
    PLACEMENT,
    RANK_TASK,
    SITES,
    WORKING_DIRECTORY,
)
from proxyfl.sites.federation import (
    CONFIG,
    GRAPH,
    REPLACE,
    RESULTS,
    RUN_NAME,
    FederationError,
    checked_results,
    write_results,
)

# how long the server keeps telling the sites a job is ending (a site whose job process is
# still starting hears it once it has started)
STOP_RELAY_S = 300.0
# in a federation job's result folder on the server (what its administrator downloads)
OUTCOME_FILE = "outcome.json"
RESULTS_FOLDER = "run"  # the files the sites sent back, as they lie in the run directory


class RunController(Controller):
    """One job of ``sites`` (rank order) running the rank program with ``arguments`` in
    ``working_directory`` (the local launcher's), or with the configuration ``config`` in
    each site's own runs folder as ``run_name`` (a federation's)."""

    def __init__(
        self, sites: list[str], placement: list[list[int]], arguments: list[str] | None = None,
        working_directory: str | None = None, outcome_file: str | None = None,
        config: dict[str, Any] | None = None, run_name: str | None = None,
        replace: bool = False, task_timeout_s: float = 7 * 24 * 3600.0,
        graph: list[Any] | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        if (config is None) == (arguments is None):
            raise ValueError("a job runs either with arguments (one machine) or a config")
        self.sites, self.placement = list(sites), placement
        self.arguments, self.working_directory = arguments, working_directory
        self.config, self.run_name, self.replace = config, run_name, replace
        self.graph = graph  # a file: graph's matrices (proxyfl.sites.federation.GRAPH)
        self.outcome_file = Path(outcome_file) if outcome_file is not None else None
        self.task_timeout_s = task_timeout_s
        self.aborted_by: tuple[int, int] | None = None  # (rank, status) of the first abort
        self._lock = threading.Lock()
        # the job's name and the server kit's keys (or why it has none): start_controller's
        self.job = ""
        self.credentials: Credentials | CredentialsError = CredentialsError("no job yet")
        self.refusals = Refusals("the server", logging.getLogger(__name__))

    def start_controller(self, fl_ctx: FLContext) -> None:
        # as a site's job process (proxyfl.sites.executor): the server killed outright, its
        # job's process ends at once
        exit_when_orphaned(EXIT_STOPPED, "proxyfl.sites: the server is gone; its job process ends")
        startup = Path(fl_ctx.get_workspace().get_startup_kit_dir())
        credentials = kit_credentials(startup)
        if isinstance(credentials, CredentialsError):  # no abort checked, no stop signed
            self.log_error(fl_ctx, f"the server cannot sign or check messages: {credentials}")
        self.begin(str(fl_ctx.get_job_id()), credentials)
        fl_ctx.get_engine().register_aux_message_handler(ABORT_TOPIC, self._on_abort)

    def begin(self, job: str, credentials: Credentials | CredentialsError) -> None:
        """Take aborts in the job ``job``, checked with ``credentials`` (none taken where it
        is the error of reading them)."""
        self.job, self.credentials = job, credentials

    def _on_abort(self, topic: str, request: Shareable, fl_ctx: FLContext) -> Shareable:
        status, rank = request.get(STATUS), request.get(RANK)
        if not isinstance(status, int) or not isinstance(rank, int):
            return make_reply(ReturnCode.BAD_REQUEST_DATA)
        try:
            site = proven_sender(self.credentials, request, self.job, ABORT_TOPIC, SERVER,
                                 (status, rank))  # fmt: skip
            if site not in self.sites or self.sites.index(site) != rank:
                raise UnverifiedSender(f"{site!r} is not rank {rank} of this job")
        except UnverifiedSender as reason:
            return self.refusals.answer(request, ABORT_TOPIC, reason)
        self._end_job(rank, status, fl_ctx)
        return make_reply(ReturnCode.OK)

    def _end_job(self, rank: int, status: int, fl_ctx: FLContext) -> None:
        """Rank ``rank`` ended the job with ``status``: tell every other site, once (the
        first rank to end it decides the job's status)."""
        with self._lock:
            first = self.aborted_by is None
            if first:
                self.aborted_by = (rank, status)
        if first:
            site = self.sites[rank]
            self.log_warning(fl_ctx, f"{site} (rank {rank}) ended the job with status {status}")
            others = [name for name in self.sites if name != site]
            # neither an aux handler nor a task's callback may wait on the sites: they are
            # told from a thread
            threading.Thread(target=self._tell_to_stop, args=(others, status, fl_ctx),
                             daemon=True).start()  # fmt: skip

    def _on_result(self, client_task: ClientTask, fl_ctx: FLContext) -> None:
        """A rank that answered with a failure ends the job, where it has not told the
        server so itself (its abort lost, or it could not sign one): its status, or 1
        where FLARE answered for it (its task raised, or was refused)."""
        result, name = client_task.result, client_task.client.name
        if result is None or name not in self.sites:
            return
        status = result.get(STATUS) if result.get_return_code() == ReturnCode.OK else 1
        if status != 0:
            self._end_job(self.sites.index(name), status if isinstance(status, int) else 1,
                          fl_ctx)  # fmt: skip

    def _tell_to_stop(self, sites: list[str], status: int, fl_ctx: FLContext) -> None:
        """Tell each of ``sites`` the job is ending, signed by the server, again until it
        has heard it (a site whose job has not started yet cannot), for at most
        ``STOP_RELAY_S``."""
        if isinstance(self.credentials, CredentialsError):
            self.log_error(fl_ctx, f"the sites cannot be told to stop: {self.credentials}")
            return
        stop = Shareable()
        stop[STATUS] = status
        self.credentials.sign(stop, self.job, STOP_TOPIC, EVERY_SITE, (status,))
        engine = fl_ctx.get_engine()
        deadline = time.monotonic() + STOP_RELAY_S
        while sites and time.monotonic() < deadline:
            replies = engine.send_aux_request(targets=sites, topic=STOP_TOPIC, request=stop,
                                              timeout=5.0, fl_ctx=fl_ctx)  # fmt: skip
            sites = [name for name in sites if replies.get(name) is None
                     or replies[name].get_return_code() != ReturnCode.OK]  # fmt: skip
            if sites:
                time.sleep(0.5)

    def control_flow(self, abort_signal: Signal, fl_ctx: FLContext) -> None:
        data = Shareable()
        data[SITES] = self.sites
        data[PLACEMENT] = self.placement
        if self.config is not None:
            data[CONFIG], data[RUN_NAME] = json.dumps(self.config), self.run_name
            data[REPLACE] = self.replace
            if self.graph is not None:
                data[GRAPH] = self.graph
        else:
            data[ARGUMENTS], data[WORKING_DIRECTORY] = self.arguments, self.working_directory
        task = Task(name=RANK_TASK, data=data, timeout=int(self.task_timeout_s),
                    result_received_cb=self._on_result)  # fmt: skip
        self.broadcast_and_wait(task=task, fl_ctx=fl_ctx, targets=self.sites,
                                min_responses=len(self.sites), wait_time_after_min_received=0,
                                abort_signal=abort_signal)  # fmt: skip
        statuses: dict[str, int | None] = {name: None for name in self.sites}
        errors: dict[str, str] = {}
        results: dict[str, bytes] = {}
        for client_task in task.client_tasks:
            result = client_task.result
            if result is not None and result.get_return_code() == ReturnCode.OK:
                name = client_task.client.name
                statuses[name] = int(result.get(STATUS, 1))
                if result.get(ERROR):
                    errors[name] = str(result.get(ERROR))
                try:
                    results |= checked_results(result.get(RESULTS) or {},
                                               self.sites.index(name))  # fmt: skip
                except FederationError as error:
                    self.log_error(fl_ctx, str(error))
                    errors[name] = str(error)
                    statuses[name] = statuses[name] or 1
        if self.outcome_file is not None:
            self._write_outcome(self.outcome_file, statuses, errors)
        else:  # a federation's: into the job's result folder, kept with the job
            folder = Path(fl_ctx.get_workspace().get_result_root(fl_ctx.get_job_id()))
            write_results(folder / RESULTS_FOLDER, results)
            self._write_outcome(folder / OUTCOME_FILE, statuses, errors)

    def _write_outcome(self, path: Path, statuses: dict[str, int | None],
                       errors: dict[str, str]) -> None:  # fmt: skip
        if self.aborted_by is not None:
            status = self.aborted_by[1]
        else:
            failed = [s for s in statuses.values() if s != 0]
            status = next((s for s in failed if s is not None), 1) if failed else 0
        outcome = {
            "status": status,
            "sites": statuses,
            "aborted_by_rank": None if self.aborted_by is None else self.aborted_by[0],
            "errors": errors,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".partial")
        temporary.write_text(json.dumps(outcome, indent=1))
        os.replace(temporary, path)

    def stop_controller(self, fl_ctx: FLContext) -> None:
        pass

    def process_result_of_unknown_task(
        self, client: Client, task_name: str, client_task_id: str, result: Shareable,
        fl_ctx: FLContext,
    ) -> None:  # fmt: skip
        pass
