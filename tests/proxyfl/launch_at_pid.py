"""Runs one job (its config written by the test) as ``run_job`` would, after setting the
kernel's PID counter of this PID namespace to ``argv[2]``: run by
``test_address_exchange.py`` as PID 1 of a fresh namespace (``unshare --pid --fork``), so
that no other process takes a PID between the counter's setting and the job's forks. Its
cold ranks (``PLUMBING_COLD_RANKS=1``) are then forked one after another by MPICH's fork
launcher: the tree bound supervisor, the fork launcher, then the ranks. With ``argv[3]``,
the counter is set to that as ``run_job`` first warns that it launches the job again (every
process of the first launch has ended then), so that the second launch's ranks straddle
another power of ten (not the same numbers again: the first launch's killed ranks left
their shared-memory regions, named by PID, behind). Prints one JSON object: the job's
outcome and the warnings it logged."""

import json
import logging
import sys
from pathlib import Path

from proxyfl.config import TrainConfig
from proxyfl.launch.job import TrainingJob, TrainingJobFailed, run_job
from proxyfl.launch.placement import Placement

warnings: list[str] = []
COUNTER = Path("/proc/sys/kernel/ns_last_pid")


class _Kept(logging.Handler):
    """Keeps every warning; sets the counter to ``again`` at the first relaunch only."""

    def __init__(self, again: str | None) -> None:
        super().__init__(logging.WARNING)
        self.again = again

    def emit(self, record: logging.LogRecord) -> None:
        warnings.append(record.getMessage())
        if self.again is not None and "launching it again" in record.getMessage():
            COUNTER.write_text(self.again)
            self.again = None


logging.getLogger("proxyfl").addHandler(_Kept(sys.argv[3] if len(sys.argv) > 3 else None))
config = TrainConfig.model_validate_json(Path(sys.argv[1]).read_text())
COUNTER.write_text(sys.argv[2])
try:
    run_job(TrainingJob(config, Placement()), on_line=lambda _: None)
    outcome = "finished"
except TrainingJobFailed as failed:
    outcome = str(failed)
print(json.dumps({"outcome": outcome, "warnings": warnings}))
