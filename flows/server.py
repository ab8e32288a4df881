"""Run a command against one Prefect server on a free loopback port, started for it.

    python -m flows.server -- dvc repro

Without a server, every flow run starts its own temporary one (and so does every worker
process of a process-pool task runner): 5-15 s each. ``make demo`` runs ``dvc repro``
through this, so its dozen flow runs share one server. When ``PREFECT_API_URL`` is
already set, the command simply runs against that server.

:func:`shared_prefect_api` does the same for one flow run and the worker processes it
starts (``python -m flows.preprocess``). The server dies with the process that started it,
even when that one is killed (:mod:`plumbing.processes`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from plumbing.collector import imports_done
from plumbing.environment import environment_variable
from plumbing.errors import PipelineError
from plumbing.network import free_port
from plumbing.processes import parent_bound_command, stop_tree
from plumbing.refusals import EXIT_REFUSED, machine_refusal
from plumbing.verified import DamagedFileError

log = logging.getLogger(__name__)


class ServerStartError(RuntimeError):
    """The Prefect server did not start: it exited, or did not answer in time; the message
    holds what it said. The machine's refusal, not a bug (exit status 3)."""

    exit_status = EXIT_REFUSED


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# Prefect's server as `prefect server start` runs it, started sooner (flows.prefect_api)
PREFECT_API_COMMAND = (sys.executable, "-m", "flows.prefect_api")


@contextlib.contextmanager
def prefect_server(
    host: str = "127.0.0.1",
    port: int | None = None,
    timeout_s: float = 180.0,
    log_path: Path | None = None,
    command: Sequence[str] = PREFECT_API_COMMAND,
) -> Iterator[str]:
    """Start Prefect's server (``command``, which takes ``--host`` and ``--port``) and
    yield its API URL; stop it on exit.

    The server is killed with the calling process if that dies first (Linux).
    """
    port = port or free_port(host)
    api_url = f"http://{host}:{port}/api"
    # its output is kept (in log_path, else a temporary file) for the error that says why
    # it did not start
    output = open(log_path, "w+") if log_path else tempfile.TemporaryFile("w+")  # noqa: SIM115
    # The UI asks the API at PREFECT_UI_API_URL, which otherwise says port 4200; and
    # `prefect deployment run --watch` shows a run's logs (its last: the result line) only
    # when the server streams them out. A user's own settings win.
    environment = {"PREFECT_UI_API_URL": api_url,
                   "PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED": "true",
                   "PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED": "true",
                   **os.environ}  # fmt: skip
    server = subprocess.Popen(
        parent_bound_command([*command, "--host", host, "--port", str(port)]),
        stdout=output, stderr=subprocess.STDOUT, start_new_session=True, env=environment,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout_s
        while not _healthy(api_url):
            exit_code = server.poll()
            if exit_code is not None or time.monotonic() > deadline:
                output.seek(0)
                said = " ".join(output.read()[-2000:].split()) or "nothing"
                when = (f"exited with code {exit_code} before it answered"
                        if exit_code is not None
                        else f"did not answer within {timeout_s:.0f} s")  # fmt: skip
                raise ServerStartError(f"Prefect server on {api_url} {when}; it said: {said}")
            time.sleep(0.1)  # a refused connection costs nothing; 0.5 s polls made every
            # command wait 0.25 s longer on average for its server
        yield api_url
    finally:
        stop_tree(server.pid)  # the server and anything it started
        server.wait()
        output.close()


def address_towards(url: str) -> str:
    """This machine's IP address on the route to ``url``'s host (e.g. a Dask scheduler's
    ``tcp://host:8786``): the address at which that host's network can reach us."""
    parts = urlsplit(url if "://" in url else f"tcp://{url}")
    if not parts.hostname:
        raise ValueError(f"no host in {url!r}")
    family = socket.AF_INET6 if ":" in parts.hostname else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((parts.hostname, parts.port or 80))  # chooses a route, sends nothing
        return str(probe.getsockname()[0])


@contextlib.contextmanager
def shared_prefect_api(host: str = "127.0.0.1") -> Iterator[str | None]:
    """The Prefect API that flow runs in this block, and every worker process they start,
    report to; yields its URL.

    - ``PREFECT_API_URL`` already set (in the environment or the active Prefect settings):
      that server; nothing is started.
    - Otherwise, outside any flow run: one server on ``host`` (:func:`prefect_server`),
      for the block.
    - Inside a running flow: nothing is done (yields the configured URL or ``None``); the
      flow runs of the block report wherever their parent does.

    For the block, the URL is set in ``os.environ`` and in this process's Prefect settings,
    the process-global ones included: threads here and the workers of a process pool or
    of a local Dask cluster (which inherit the environment and the settings) then report to
    it instead of each starting a temporary server of its own. Logs and events still
    buffered are sent before the block ends.
    """
    from prefect.context import FlowRunContext
    from prefect.settings import get_current_settings

    configured = get_current_settings().api.url
    if FlowRunContext.get() is not None:
        yield configured
        return
    with contextlib.ExitStack() as stack:
        if configured:
            api_url = configured
        else:
            started = time.monotonic()
            api_url = stack.enter_context(prefect_server(host=host))
            log.info(
                "Prefect server for this run: %s (up in %.1f s)",
                api_url.removesuffix("/api"),
                time.monotonic() - started,
            )
        stack.enter_context(_reporting_to(api_url))
        yield api_url


@contextlib.contextmanager
def _reporting_to(api_url: str) -> Iterator[None]:
    """``api_url`` as the Prefect API of this process, its threads and its children."""
    import prefect.context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with contextlib.ExitStack() as stack:
        stack.enter_context(temporary_settings({PREFECT_API_URL: api_url}))
        stack.enter_context(environment_variable("PREFECT_API_URL", api_url))
        # New threads do not inherit the caller's settings context and fall back to the
        # process-global one, read from the environment at import: the thread that forwards
        # a process pool's logs and events would start a temporary server of its own. This
        # is how prefect.testing.utilities.prefect_test_harness installs its settings
        # (private, hence prefect pinned to 3.8 in pyproject.toml).
        stack.enter_context(prefect.context._temporary_global_settings_context(
            prefect.context.get_settings_context()
        ))  # fmt: skip
        try:
            yield
        finally:
            _deliver_logs_and_events()


def _deliver_logs_and_events(timeout_s: float = 30.0) -> None:
    """Send the logs and events Prefect still holds while their server is up: at exit,
    they would be retried against a closed port for a minute or more."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=timeout_s)
    EventsWorker.drain_all(timeout=timeout_s)


SERVER_HINT = ("start it (make serve) or unset PREFECT_API_URL, and the command starts "
               "a server of its own")  # fmt: skip
"""What to do when the Prefect API a command reports to does not answer."""

BUG_REPORT = "docs/troubleshooting.md#reporting-a-bug"
"""Where a traceback goes: the one kind of failure the pipeline does not explain."""


class _ExpectedTracebacks(logging.Filter):
    """Drops the records that carry the traceback of an expected error (Prefect's "Task
    run failed with exception" and "Encountered exception during execution"): the command
    says the error in one line, and the Prefect UI keeps the traceback."""

    def __init__(self, expected: tuple[type[BaseException], ...]) -> None:
        super().__init__()
        self.expected = expected

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is None:
            return True
        return not isinstance(error, self.expected) and machine_refusal(error) is None


@contextlib.contextmanager
def tracebacks_for_bugs_only(expected: tuple[type[BaseException], ...]) -> Iterator[None]:
    """While inside, the console shows no traceback of an ``expected`` error: a filter on
    every stream handler of Prefect's loggers and of the root logger (not on the handler
    that sends logs to the Prefect API)."""
    names = ("", "prefect", "prefect.flow_runs", "prefect.task_runs")
    handlers = {h for name in names for h in logging.getLogger(name).handlers
                if isinstance(h, logging.StreamHandler)}  # fmt: skip
    quiet = _ExpectedTracebacks(expected)
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)


PID_TAG, HOST_TAG = "pid:", "host:"
"""Tags of the flow runs a command starts: the process that runs them, and its host."""


def runner_tags() -> tuple[str, str]:
    """``pid:PID`` and ``host:NAME`` of this process: a flow run of a process that is gone
    (killed outright, the machine powered off) can be told from one still running."""
    return f"{PID_TAG}{os.getpid()}", f"{HOST_TAG}{socket.gethostname()}"


def crash_orphaned_runs() -> list[str]:
    """Mark Crashed the flow runs the API still shows Running or Pending whose process, on
    this host, is gone (:func:`runner_tags`): SIGKILL and power loss let no process say
    so. Returns their names; runs of other hosts, or without the tags (a deployment's
    worker), are left alone."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    host = f"{HOST_TAG}{socket.gethostname()}"
    unfinished = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING,
                                                                   StateType.PENDING])),
        tags=FlowRunFilterTags(all_=[host]),
    )  # fmt: skip
    crashed = []
    with get_client(sync_client=True) as client:
        for run in client.read_flow_runs(flow_run_filter=unfinished):
            pids = [int(t.removeprefix(PID_TAG)) for t in run.tags
                    if t.startswith(PID_TAG) and t.removeprefix(PID_TAG).isdigit()]  # fmt: skip
            if not pids or psutil.pid_exists(pids[0]):
                continue
            message = (f"its process ({pids[0]} on {host.removeprefix(HOST_TAG)}) ended "
                       "without a word: killed outright, or the machine lost power")  # fmt: skip
            client.set_flow_run_state(run.id, Crashed(message=message), force=True)
            crashed.append(run.name)
    return crashed


def run_flow_command(
    run: Callable[[], object],
    failures: tuple[type[Exception], ...],
    host: str = "127.0.0.1",
) -> int:
    """A flow command's exit status: ``run()`` with one Prefect server for it and all its
    workers (:func:`shared_prefect_api`); 0, or after printing one ``error: ...`` line and
    no traceback: 2 when a file it read does not verify
    (:class:`~plumbing.verified.DamagedFileError`: bad input, which the message says how
    to repair), the error's own ``exit_status`` when it has one (a host a launch lost: 2),
    else 1 when it fails with another of the project's errors
    (:class:`~plumbing.errors.PipelineError`), one of ``failures`` or no server can start.
    A machine's refusal (no space, a folder that cannot be written, a server that does
    not answer: :func:`plumbing.refusals.machine_refusal`): one line and 3. Any other
    exception is a bug: its traceback, then where to report it, and 1."""
    from prefect import tags as prefect_tags

    # a log handler that fails says nothing (the stdlib's advice for a program in use):
    # Prefect's log worker would write "--- Error logging to API ---" and, without a line
    # end, the server's error, into the line that says what happened (a server that stopped
    # answering, a full disk), which the run's own failure then says in one line
    logging.raiseExceptions = False
    expected = (PipelineError, *failures, ServerStartError)
    try:
        with tracebacks_for_bugs_only(expected), shared_prefect_api(host):
            orphans = crash_orphaned_runs()
            if orphans:  # the UI would show them running forever
                print(f"note: {len(orphans)} flow run(s) of a process that is gone marked "
                      f"Crashed: {', '.join(orphans)}", file=sys.stderr)  # fmt: skip
            with prefect_tags(*runner_tags()):
                run()
    except DamagedFileError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (PipelineError, *failures, ServerStartError) as error:
        print(f"error: {error}", file=sys.stderr)
        return getattr(error, "exit_status", 1)  # 2 where the error says it is bad input
    except Exception as error:
        refusal = machine_refusal(error, SERVER_HINT)
        if refusal is not None:  # the machine said no (disk, folder, server): no traceback
            print(f"error: {refusal}", file=sys.stderr)
            return EXIT_REFUSED
        # a bug: the one case that deserves a traceback
        traceback.print_exc()
        print(f"error: {type(error).__name__} is a bug, not a bad input: please report it "
              f"with the traceback above ({BUG_REPORT})", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.server", description=__doc__)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --, e.g. -- dvc repro")
    if os.environ.get("PREFECT_API_URL"):
        return subprocess.call(command)
    try:
        with prefect_server() as api_url:
            print(f"Prefect server for this run: {api_url.removesuffix('/api')}", flush=True)
            return subprocess.call(command, env={**os.environ, "PREFECT_API_URL": api_url})
    except ServerStartError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_status


if __name__ == "__main__":
    imports_done()  # the collector on again (flows/__init__.py paused it)
    sys.exit(main())
