"""What the launcher saw of a job's time, added to the run's ``machine.json``.

The ranks account for their own lives (:mod:`proxyfl.engine.timings`: from each process's
creation to its last record). The launcher times the whole job, from starting ``mpiexec``
to its exit; what the slowest rank does not account for is the launcher's own:

    launcher overhead = launcher wall − max over ranks of (startup + wall)

that is ``mpiexec`` starting and forking the ranks, and the ranks' and ``mpiexec``'s
teardown after their last record (freeing MPI, the interpreter's exit, the pipes
draining).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from proxyfl.results import MACHINE_FILE, atomic_write_json

logger = logging.getLogger(__name__)


def record_launcher_wall(
    run_dir: Path, wall_seconds: float, warm_server: str | None = None
) -> dict[str, Any] | None:
    """Add ``launcher`` (its wall and overhead seconds, and ``warm_server``: whose server
    the ranks were forked from, ``job``, ``kept`` or ``shared`` (:class:`plumbing.warm.
    WarmRanks`), None where they started cold) to ``run_dir``'s machine.json's
    ``timings``; returns it, or None (and changes nothing) when the job left no finished
    timings (a failed job, or one killed before its last record)."""
    path = Path(run_dir) / MACHINE_FILE
    try:
        machine = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    timings = machine.get("timings") if isinstance(machine, dict) else None
    if not isinstance(timings, dict):
        return None
    lives = [s for s in timings.get("process_seconds_per_rank") or [] if s is not None]
    slowest = max(lives) if lives else None
    launcher = {
        "wall_seconds": wall_seconds,
        "slowest_rank_process_seconds": slowest,
        "overhead_seconds": None if slowest is None else wall_seconds - slowest,
        "warm_server": warm_server,
    }
    timings["launcher"] = launcher
    atomic_write_json(path, machine)
    logger.debug("%s: launcher wall %.2f s", path, wall_seconds)
    return launcher
