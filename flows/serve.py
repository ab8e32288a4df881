"""Serve the pipeline's Prefect deployments with one command: the server, the work pool,
the deployments of ``prefect.yaml`` and a worker, each started once the one before is
ready, all stopped together on Ctrl-C.

    python -m flows.serve                 # API and UI on http://127.0.0.1:4200
    camelyon-proxyfl serve --port 4201

then, in another terminal (the command prints the URL to export):

    export PREFECT_API_URL=http://127.0.0.1:4200/api
    prefect deployment run pipeline/pipeline

Run it from the repository root: ``prefect deploy`` records this directory as the flows'
working directory. The server's database lives in ``PREFECT_HOME`` (``make serve``: the
checkout's ``.prefect/``), so runs and artifacts stay across restarts.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from camelyon_proxyfl.params.base import enter_project
from flows.server import ServerStartError, prefect_server
from plumbing.cli import EXIT_BAD_PARAMETERS, ConfigError
from plumbing.collector import imports_done
from plumbing.network import port_taken
from plumbing.processes import end_with_parent, parent_bound_command, stop_tree

POOL = "proxyfl"  # prefect.yaml's work pool
WORKER_STOP_SECONDS = 4.0  # for the worker to stop by itself before SIGKILL: Ctrl-C < 10 s


class ServeError(RuntimeError):
    """A step of serving failed; the message says which and holds its output."""


def _prefect(env: dict[str, str], *args: str) -> str:
    """Run the ``prefect`` command line; its output, or :class:`ServeError` with it."""
    prefect = str(Path(sys.executable).parent / "prefect")
    result = subprocess.run(
        parent_bound_command([prefect, *args]), env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise ServeError(
            f"prefect {' '.join(args)} failed (exit {result.returncode}):\n"
            f"{(result.stdout + result.stderr)[-3000:]}"
        )
    return result.stdout


def ensure_work_pool(env: dict[str, str], pool: str) -> bool:
    """Create the process work pool ``pool`` unless it exists; whether it was created."""
    try:
        _prefect(env, "work-pool", "inspect", pool)
        return False
    except ServeError:
        _prefect(env, "work-pool", "create", pool, "--type", "process")
        return True


def serve(host: str, port: int, pool: str) -> int:
    """Server, pool, deployments, worker; blocks until Ctrl-C (or SIGTERM), then stops all."""
    if not Path("prefect.yaml").is_file():
        raise ServeError(f"no prefect.yaml in {Path.cwd()}: run this from the repository root")
    if port_taken(port, host):
        raise ServeError(
            f"{host}:{port} is in use (another Prefect server?): stop it, or give --port"
        )
    from prefect.settings import get_current_settings

    home = Path(get_current_settings().home)
    home.mkdir(parents=True, exist_ok=True)
    server_log = home / "server.log"
    print(f"starting the Prefect server on {host}:{port} (log: {server_log}) ...", flush=True)
    started = time.monotonic()
    with prefect_server(host=host, port=port, log_path=server_log) as api_url:
        print(f"server up in {time.monotonic() - started:.0f} s", flush=True)
        # prefect.yaml's pull step records {{ $PWD }}: this directory, whoever started us
        env = {**os.environ, "PREFECT_API_URL": api_url, "PWD": str(Path.cwd())}
        created = ensure_work_pool(env, pool)
        print(f"work pool {pool}: {'created' if created else 'exists'}", flush=True)
        _prefect(env, "--no-prompt", "deploy", "--all")
        print("deployed prefect.yaml's deployments (prefect deployment ls)", flush=True)
        prefect = str(Path(sys.executable).parent / "prefect")
        worker = subprocess.Popen(
            # if we are killed outright, the worker goes too (SIGTERM would leave it
            # retrying a dead server for minutes)
            parent_bound_command([prefect, "worker", "start", "--pool", pool]),
            env=env, start_new_session=True,  # Ctrl-C reaches us; we stop it, in order
        )  # fmt: skip
        try:
            ui = api_url.removesuffix("/api")
            print(
                f"ready. UI: {ui}\n"
                f"in another terminal:\n"
                f"  export PREFECT_API_URL={api_url}\n"
                f"  prefect deployment run pipeline/pipeline\n"
                f"Ctrl-C stops the worker (and its runs) and the server.",
                flush=True,
            )
            code = worker.wait()
            print(f"the worker exited with status {code}", file=sys.stderr)
            return 1
        finally:
            stop_tree(worker.pid, timeout_s=WORKER_STOP_SECONDS)
            worker.poll()
            print("worker stopped; stopping the server ...", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.serve", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=4200, help="API and UI port")
    parser.add_argument("--pool", default=POOL, help="process work pool of prefect.yaml")
    args = parser.parse_args(argv)
    try:
        enter_project([])  # prefect.yaml's deployments run in the project's folder
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_PARAMETERS
    # Ctrl-C stops everything, even when started where SIGINT is ignored (a background
    # job of a script); SIGTERM (a service manager, `kill`) stops as Ctrl-C does
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return serve(args.host, args.port, args.pool)
    except KeyboardInterrupt:
        print("stopped", flush=True)
        return 0
    except (ServeError, ServerStartError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    imports_done()  # the collector on again (flows/__init__.py paused it)
    end_with_parent()
    sys.exit(main())
