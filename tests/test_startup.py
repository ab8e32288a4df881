"""A command starts with what every run of it needs, not what only its work does: torch
(~3 s of a start on 2 cores) is imported by the functions that train, map and audit, and
scipy.stats (~1 s) by those that score; so ``--help``, a refusal of bad input and a stage
found up to date start in the time Prefect takes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# every flow command's module and the CLI's (each imports its subcommands on use), and the
# privacy planner's (`python -m proxyfl.privacy`: Opacus with its first ε, not its --help)
COMMANDS = ("flows.pipeline", "flows.preprocess", "flows.train", "flows.canary",
            "flows.audit", "flows.stage", "flows.report", "camelyon_proxyfl.cli",
            "proxyfl.privacy.planned")  # fmt: skip
ONLY_FOR_THE_WORK = ("torch", "opacus", "scipy.stats", "scipy.optimize", "matplotlib")


def test_no_command_imports_what_only_its_work_needs() -> None:
    probe = (
        "import importlib, json, sys\n"
        f"found = {{}}\nfor name in {COMMANDS!r}:\n"
        "    importlib.import_module(name)\n"
        f"    found[name] = [m for m in {ONLY_FOR_THE_WORK!r} if m in sys.modules]\n"
        "print(json.dumps(found))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found == {name: [] for name in COMMANDS}, found
