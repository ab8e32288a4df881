"""Coverage for every process `make test` starts that runs this project's code.

`make test` puts this folder on ``PYTHONPATH`` and names the coverage configuration in
``CAMELYON_PROXYFL_TEST_COVERAGE`` (pyproject.toml). Every Python process the tests start
inherits both, and runs this file as it starts: pytest and its workers, MPI ranks and the
warm server they fork from, flow, CLI and bench commands, DVC's stage commands, slide and
pool workers. Each starts measuring itself, except the tools whose code is not this
project's: Prefect's server (``flows.prefect_api`` too: a dozen lines of ours before
Prefect's serving) and CLI, uvicorn, DVC's own command and MkDocs, FLARE's
server and ``nvflare provision`` (a FLARE site is measured: it runs our job launcher, and
the server's job process our controller). Measuring them measured nothing of ours and
slowed them by half (coverage's tracer sees every call: a Prefect server took 4.6 s to
start instead of 3.0).
"""

import os
import sys

CONFIG_ENV = "CAMELYON_PROXYFL_TEST_COVERAGE"
NOT_OURS = frozenset({"prefect", "uvicorn", "dvc", "mkdocs", "nvflare.cli",
                      "nvflare.private.fed.app.server.server_train",
                      "flows.prefect_api"})  # fmt: skip


def program(argv: list[str]) -> str:
    """What a Python command line runs: the module after ``-m``, else the script's name."""
    arguments = iter(argv[1:])
    for argument in arguments:
        if argument == "-m":
            return next(arguments, "")
        if argument == "-c":
            return "-c"
        if not argument.startswith("-"):
            return os.path.basename(argument)
    return ""


def _start() -> None:
    config = os.environ.get(CONFIG_ENV)
    if not config or program(getattr(sys, "orig_argv", sys.argv)) in NOT_OURS:
        return
    os.environ["COVERAGE_PROCESS_START"] = config
    try:
        import coverage

        coverage.process_startup()
    except ImportError:
        pass
    finally:  # the children decide for themselves, here
        os.environ.pop("COVERAGE_PROCESS_START", None)


_start()
