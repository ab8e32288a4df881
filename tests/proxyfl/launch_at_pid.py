"""Runs one job (its config written by the test) as ``run_job`` would, after setting the
kernel's PID counter of this PID namespace to ``argv[2]``: run by
``test_address_exchange.py`` as PID 1 of a fresh namespace (``unshare --pid --fork``), so
that no other process takes a PID between the counter's setting and the job's forks. Its
cold ranks (``PLUMBING_COLD_RANKS=1``) are then forked one after another by MPICH's fork
launcher: the tree bound supervisor, the fork launcher, then the ranks. Prints one JSON
object: the job's outcome and the warnings it logged."""

import json
import logging
import sys
from pathlib import Path

from proxyfl.config import TrainConfig
from proxyfl.launch.job import TrainingJob, TrainingJobFailed, run_job
from proxyfl.launch.placement import Placement

warnings: list[str] = []


class _Kept(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        warnings.append(record.getMessage())


logging.getLogger("proxyfl").addHandler(_Kept(logging.WARNING))
config = TrainConfig.model_validate_json(Path(sys.argv[1]).read_text())
Path("/proc/sys/kernel/ns_last_pid").write_text(sys.argv[2])
try:
    run_job(TrainingJob(config, Placement()), on_line=lambda _: None)
    outcome = "finished"
except TrainingJobFailed as failed:
    outcome = str(failed)
print(json.dumps({"outcome": outcome, "warnings": warnings}))
