"""Run a command against one Prefect server on a free loopback port, started for it.

    python -m flows.server -- dvc repro

Without a server, every flow run starts its own temporary one (and so does every worker
process of a process-pool task runner): 5-15 s each. ``make demo`` runs ``dvc repro``
through this, so its dozen flow runs share one server. When ``PREFECT_API_URL`` is
already set, the command simply runs against that server.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path


class ServerStartError(RuntimeError):
    """The Prefect server did not answer in time; the message holds its last output."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def prefect_server(
    host: str = "127.0.0.1", port: int | None = None, timeout_s: float = 180.0,
    log_path: Path | None = None,
) -> Iterator[str]:
    """Start ``prefect server start`` and yield its API URL; stop it on exit."""
    port = port or free_port(host)
    api_url = f"http://{host}:{port}/api"
    prefect = Path(sys.executable).parent / "prefect"
    log = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115
    server = subprocess.Popen(
        [str(prefect), "server", "start", "--host", host, "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout_s
        while not _healthy(api_url):
            if server.poll() is not None or time.monotonic() > deadline:
                detail = Path(log_path).read_text()[-2000:] if log_path else ""
                raise ServerStartError(
                    f"Prefect server on {api_url} did not start within {timeout_s:.0f} s "
                    f"(exit code {server.poll()}). {detail}"
                )
            time.sleep(0.5)
        yield api_url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if log_path:
            log.close()  # type: ignore[union-attr]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.server", description=__doc__)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --, e.g. -- dvc repro")
    if os.environ.get("PREFECT_API_URL"):
        return subprocess.call(command)
    with prefect_server() as api_url:
        print(f"Prefect server for this run: {api_url.removesuffix('/api')}", flush=True)
        return subprocess.call(command, env={**os.environ, "PREFECT_API_URL": api_url})


if __name__ == "__main__":
    sys.exit(main())
