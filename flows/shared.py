"""Run a command with the servers that everything it starts shares.

    python -m flows.shared -- dvc repro

- one Prefect server on a free loopback port, as ``python -m flows.server`` starts (or the
  one ``PREFECT_API_URL`` names), so that its flow runs do not each start their own;
- one warm MPI server (:func:`proxyfl.launch.job.warm_ranks`, shared with the command's
  processes): the training jobs of every stage fork their ranks from it, its imports done
  once for the whole command instead of once a stage while Prefect starts the stage's
  flow run (the demo's start-up: 2.8-3.6 s a job with a server per stage, 0.1-0.2 s with
  this one). It runs with the CPU kernels' pin of the parameters file
  (``machine.cpu_kernels``, :mod:`plumbing.kernels`), as the stages' ranks do. A stage
  whose ranks need another environment, or run elsewhere than on this machine, starts
  its own as it would without it (each job's machine.json says which server its ranks
  were forked from).

``make demo`` runs ``dvc repro`` through this. Both servers die with this process, even
when it is killed. A module apart from ``python -m flows.server`` (one Prefect server
only) so that the stages, which import that module, do not depend on the launcher's code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path

from camelyon_proxyfl.params.base import DEFAULT_PARAMS, enter_project, load_sections
from camelyon_proxyfl.params.machine import MachineParams
from flows.server import ServerStartError, prefect_server
from plumbing.cli import ConfigError
from plumbing.collector import imports_done
from plumbing.kernels import pinned_environment
from proxyfl.launch.job import warm_ranks
from proxyfl.launch.placement import Placement


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flows.shared", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument(
        "--config", type=Path, default=None,
        help="the parameters file whose machine.cpu_kernels the stages' ranks run with "
        f"(default: the project's {DEFAULT_PARAMS}; none: native)",
    )  # fmt: skip
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --, e.g. -- dvc repro")
    try:
        if args.config is None:  # the command runs in the project's folder, as dvc's do
            enter_project([])
        machine = load_sections(MachineParams, args.config or DEFAULT_PARAMS,
                                required=False).machine  # fmt: skip
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    pinned = pinned_environment(machine.cpu_kernels, {})
    with contextlib.ExitStack() as stack:  # the server imports meanwhile
        stack.enter_context(warm_ranks(Placement(), env=pinned, shared=True))
        if os.environ.get("PREFECT_API_URL"):
            return subprocess.call(command)
        try:
            api_url = stack.enter_context(prefect_server())
        except ServerStartError as error:
            print(f"error: {error}", file=sys.stderr)
            return error.exit_status
        print(f"Prefect server for this run: {api_url.removesuffix('/api')}", flush=True)
        return subprocess.call(command, env={**os.environ, "PREFECT_API_URL": api_url})


if __name__ == "__main__":
    imports_done()  # the collector on again (flows/__init__.py paused it)
    sys.exit(main())
