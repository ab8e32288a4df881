"""Prefect flows: preprocess, train, report and the whole pipeline (each also a CLI)."""

import os

from plumbing.collector import pause_while_a_command_imports

# `python -m flows.X`: the collector off while X imports Prefect, until its __main__
pause_while_a_command_imports()

# Offline by default (these machines reach only package registries): no telemetry, and
# time for a temporary server to start on a loaded machine. A user's own settings win.
for _name, _value in {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "DVC_NO_ANALYTICS": "1",
}.items():
    os.environ.setdefault(_name, _value)
