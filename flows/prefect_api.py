"""Prefect's server in the foreground, as ``prefect server start`` runs it, started sooner.

    python -m flows.prefect_api --host 127.0.0.1 --port 4200

The app of ``prefect.server.api.server.create_app(final=True)`` (the API, the UI and the
services) under uvicorn, with the keep-alive, websocket pings and log level of Prefect's
settings: what Prefect 3.8's ``prefect server start`` runs for one worker
(``prefect.cli._server_utils._run_in_foreground``; pinned in pyproject.toml).
:func:`flows.server.prefect_server` starts this, so every command's own server, ``make
serve``'s and ``make demo``'s are one.

It spares two costs of every start, neither of them serving:

* the command line's own imports (cyclopts and the modules of Prefect's commands);
* the cyclic collector walking the server's imports (:mod:`plumbing.collector`): they are
  imported with it paused (``flows/__init__.py``), the collections included
  (``prefect_dask`` brings ``distributed``: the block registry's hash at every start
  loads them), and frozen before the server starts.

``python -m bench.bench_startup`` (h) measures the start to its first answer both ways:
6.12 s of CPU before, 5.11 s now (Zen 4, a migrated home, medians of 7).
"""

from __future__ import annotations

import argparse
import sys

import prefect
import prefect.plugins
import uvicorn
from prefect.server.api.server import create_app
from prefect.settings import (
    PREFECT_SERVER_API_KEEPALIVE_TIMEOUT,
    PREFECT_SERVER_API_WEBSOCKET_PING_INTERVAL,
    PREFECT_SERVER_API_WEBSOCKET_PING_TIMEOUT,
    PREFECT_SERVER_LOGGING_LEVEL,
)

from plumbing.collector import imports_done
from plumbing.network import port_taken

# What the app's start loads for the block registry's hash, loaded (once, cached) while
# `python -m flows.prefect_api` imports, with the collector paused (flows/__init__.py)
prefect.plugins.load_prefect_collections()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.prefect_api",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=4200, help="API and UI port")
    args = parser.parse_args(argv)
    if port_taken(args.port, args.host):  # in the words of `prefect server start`
        print(f"Port {args.port} is already in use. Please specify a different port with "
              "the `--port` flag.", file=sys.stderr)  # fmt: skip
        return 1
    uvicorn.run(
        app=create_app(final=True),
        app_dir=str(prefect.__module_path__.parent),
        host=args.host,
        port=args.port,
        timeout_keep_alive=PREFECT_SERVER_API_KEEPALIVE_TIMEOUT.value(),
        ws_ping_interval=PREFECT_SERVER_API_WEBSOCKET_PING_INTERVAL.value(),
        ws_ping_timeout=PREFECT_SERVER_API_WEBSOCKET_PING_TIMEOUT.value(),
        log_level=PREFECT_SERVER_LOGGING_LEVEL.value().lower(),
    )
    return 0


if __name__ == "__main__":
    imports_done()
    sys.exit(main())
