"""The FLARE server's part of a job: :class:`RunController` paces it.

It sends every site the one task ``rank`` (the sites in rank order, the rank program's
arguments, where each rank runs) and waits for all of them. A rank that aborts says so
(:data:`~proxyfl.comm.flare.link.ABORT_TOPIC`); the server then tells every site
(:data:`~proxyfl.comm.flare.link.STOP_TOPIC`) so that no rank waits for a message that
will never come, and the job's status is that rank's. The outcome (each rank's status, the
job's) is written as JSON to ``outcome_file`` for the launcher.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from nvflare.apis.client import Client
from nvflare.apis.controller_spec import Task
from nvflare.apis.fl_constant import ReservedKey, ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.impl.controller import Controller
from nvflare.apis.shareable import Shareable, make_reply
from nvflare.apis.signal import Signal

from proxyfl.comm.flare.link import ABORT_TOPIC, RANK, STATUS, STOP_TOPIC
from proxyfl.sites.executor import ARGUMENTS, PLACEMENT, RANK_TASK, SITES, WORKING_DIRECTORY

# how long the server keeps telling the sites a job is ending (a site whose job process is
# still starting hears it once it has started)
STOP_RELAY_S = 300.0


class RunController(Controller):
    """One job of ``sites`` (rank order) running the rank program with ``arguments`` in
    ``working_directory``."""

    def __init__(
        self, sites: list[str], arguments: list[str], placement: list[list[int]],
        working_directory: str, outcome_file: str, task_timeout_s: float = 7 * 24 * 3600.0,
    ) -> None:  # fmt: skip
        super().__init__()
        self.sites, self.arguments, self.placement = list(sites), list(arguments), placement
        self.working_directory = working_directory
        self.outcome_file = Path(outcome_file)
        self.task_timeout_s = task_timeout_s
        self.aborted_by: tuple[int, int] | None = None  # (rank, status) of the first abort
        self._lock = threading.Lock()

    def start_controller(self, fl_ctx: FLContext) -> None:
        fl_ctx.get_engine().register_aux_message_handler(ABORT_TOPIC, self._on_abort)

    def _on_abort(self, topic: str, request: Shareable, fl_ctx: FLContext) -> Shareable:
        status, rank = int(request.get(STATUS, 1)), int(request.get(RANK, -1))
        site = request.get_peer_prop(ReservedKey.IDENTITY_NAME, "")
        with self._lock:
            first = self.aborted_by is None
            if first:
                self.aborted_by = (rank, status)
        if first:
            self.log_warning(fl_ctx, f"{site} (rank {rank}) ended the job with status {status}")
            others = [name for name in self.sites if name != site]
            # the handler must not wait on the sites: they are told from a thread
            threading.Thread(target=self._tell_to_stop, args=(others, status, fl_ctx),
                             daemon=True).start()  # fmt: skip
        return make_reply(ReturnCode.OK)

    def _tell_to_stop(self, sites: list[str], status: int, fl_ctx: FLContext) -> None:
        """Tell each of ``sites`` the job is ending, again until it has heard it (a site
        whose job has not started yet cannot), for at most ``STOP_RELAY_S``."""
        stop = Shareable()
        stop[STATUS] = status
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
        data[ARGUMENTS] = self.arguments
        data[PLACEMENT] = self.placement
        data[WORKING_DIRECTORY] = self.working_directory
        task = Task(name=RANK_TASK, data=data, timeout=int(self.task_timeout_s))
        self.broadcast_and_wait(task=task, fl_ctx=fl_ctx, targets=self.sites,
                                min_responses=len(self.sites), wait_time_after_min_received=0,
                                abort_signal=abort_signal)  # fmt: skip
        statuses: dict[str, int | None] = {name: None for name in self.sites}
        for client_task in task.client_tasks:
            result = client_task.result
            if result is not None and result.get_return_code() == ReturnCode.OK:
                statuses[client_task.client.name] = int(result.get(STATUS, 1))
        self._write_outcome(statuses)

    def _write_outcome(self, statuses: dict[str, int | None]) -> None:
        if self.aborted_by is not None:
            status = self.aborted_by[1]
        else:
            failed = [s for s in statuses.values() if s != 0]
            status = next((s for s in failed if s is not None), 1) if failed else 0
        outcome = {
            "status": status,
            "sites": statuses,
            "aborted_by_rank": None if self.aborted_by is None else self.aborted_by[0],
        }
        temporary = self.outcome_file.with_name(self.outcome_file.name + ".partial")
        temporary.write_text(json.dumps(outcome, indent=1))
        os.replace(temporary, self.outcome_file)

    def stop_controller(self, fl_ctx: FLContext) -> None:
        pass

    def process_result_of_unknown_task(
        self, client: Client, task_name: str, client_task_id: str, result: Shareable,
        fl_ctx: FLContext,
    ) -> None:  # fmt: skip
        pass
