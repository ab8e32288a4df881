"""Where each run's wall time went: one row per run from its ``machine.json``
(:func:`proxyfl.records.write_machine_json`, :mod:`proxyfl.launch.accounting`).

    wall        the launcher's wall (``mpiexec`` started -> exited), else the slowest
                rank's life (process created -> last record), else its clock's wall
    busiest     the rank with the most work, whose phases the row shows:
    work        = train + eval + comm + checkpoint + server (PrivateKT's server work)
    wall − work what the job spent not working: start-up (interpreter, imports, MPI's
                initialisation), set-up, compilation, records, waiting, the launcher and
                teardown
    peak GB     the most memory a rank held: its GPU's (torch's reserved) where it had
                one, else its resident set

These figures change with every launch and machine, so they are written beside the
report (``OUT/timings.{md,csv}``), never inside its DVC-tracked outputs, and a run without
them (launched before they were recorded, or its machine.json gone) shows "—".
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.report.load import RunResult
from plumbing import atomic
from proxyfl.results import MACHINE_FILE

logger = logging.getLogger(__name__)

MISSING = "—"
SERVER_PHASES = ("server_finetune_seconds", "server_self_train_seconds",
                 "server_sampling_seconds")  # fmt: skip
WORK_PHASES = ("train_seconds", "eval_seconds", "comm_seconds", "checkpoint_seconds",
               *SERVER_PHASES)  # fmt: skip
COLUMNS: tuple[tuple[str, str], ...] = (
    ("wall", "Wall s"), ("startup", "Start-up s"), ("setup", "Set-up s"),
    ("compile", "Compile s"), ("train", "Train s"), ("eval", "Eval s"), ("comm", "Comm s"),
    ("checkpoint", "Checkpoint s"), ("records", "Records s"), ("server", "Server s"),
    ("wait", "Wait s"), ("work", "Work s"), ("not_work", "Wall − work s"),
)  # fmt: skip


@dataclass(frozen=True)
class TimingRow:
    """One run's time accounting (seconds; None where its machine.json does not say)."""

    method: str
    seed: int
    busiest_rank: int | None = None
    wall: float | None = None
    startup: float | None = None
    setup: float | None = None
    compile: float | None = None
    train: float | None = None
    eval: float | None = None
    comm: float | None = None
    checkpoint: float | None = None
    records: float | None = None
    server: float | None = None
    wait: float | None = None
    work: float | None = None
    not_work: float | None = None
    peak_gb: float | None = None


def work_seconds(phases: Mapping[str, float]) -> float:
    """A rank's work: train + eval + comm + checkpoint + PrivateKT's server work."""
    return sum(float(phases.get(name, 0.0)) for name in WORK_PHASES)


def read_machine(run_dir: Path) -> dict[str, Any] | None:
    """``run_dir/machine.json`` (None: absent or unreadable)."""
    try:
        machine = json.loads((Path(run_dir) / MACHINE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        logger.info("%s: no time accounting (%s)", run_dir, error)
        return None
    return machine if isinstance(machine, dict) else None


def read_machine_timings(run_dir: Path) -> dict[str, Any] | None:
    """``run_dir/machine.json``'s ``timings`` (None: absent, unreadable or unfinished)."""
    machine = read_machine(run_dir)
    timings = machine.get("timings") if machine else None
    return timings if isinstance(timings, dict) else None


def peak_memory_gb(ranks: Sequence[Any] | None) -> float | None:
    """The most memory one rank held, from machine.json's ``ranks``: a GPU's reserved
    memory where the rank recorded one, else its resident set (None: not recorded)."""
    peaks = []
    for rank in ranks or []:
        memory = rank.get("memory") if isinstance(rank, dict) else None
        if isinstance(memory, dict):
            value = memory.get("peak_gpu_reserved_gb", memory.get("peak_rss_gb"))
            if value is not None:
                peaks.append(float(value))
    return max(peaks) if peaks else None


def timing_row(
    method: str,
    seed: int,
    timings: Mapping[str, Any] | None,
    ranks: Sequence[Any] | None = None,
) -> TimingRow:
    """The row of one run from its machine.json ``timings`` and ``ranks`` (a row of "—"
    without)."""
    per_rank = timings.get("per_rank") if timings else None
    if not isinstance(per_rank, list) or not per_rank:
        return TimingRow(method, seed, peak_gb=peak_memory_gb(ranks))
    busiest = max(range(len(per_rank)), key=lambda r: work_seconds(per_rank[r]))
    phases = per_rank[busiest]
    assert timings is not None
    wall = _job_wall(timings)
    work = work_seconds(phases)
    has_startup = "startup_seconds" in phases  # runs made before it was recorded: —
    return TimingRow(
        method=method, seed=seed, busiest_rank=busiest, wall=wall,
        startup=phases["startup_seconds"] if has_startup else None,
        setup=phases.get("setup_seconds"), compile=phases.get("compile_seconds"),
        train=phases.get("train_seconds"),
        eval=phases.get("eval_seconds"), comm=phases.get("comm_seconds"),
        checkpoint=phases.get("checkpoint_seconds"), records=phases.get("records_seconds"),
        server=sum(float(phases.get(name, 0.0)) for name in SERVER_PHASES),
        wait=phases.get("wait_seconds"), work=work,
        not_work=None if wall is None else wall - work, peak_gb=peak_memory_gb(ranks),
    )  # fmt: skip


def _job_wall(timings: Mapping[str, Any]) -> float | None:
    launcher = timings.get("launcher")
    if isinstance(launcher, dict) and launcher.get("wall_seconds") is not None:
        return float(launcher["wall_seconds"])
    lives = [s for s in timings.get("process_seconds_per_rank") or [] if s is not None]
    if lives:
        return float(max(lives))
    wall = timings.get("wall_seconds")
    return None if wall is None else float(wall)


def timing_rows(runs: Sequence[RunResult]) -> list[TimingRow]:
    """One row per run, in the runs' order."""
    rows = []
    for run in runs:
        machine = read_machine(run.path) or {}
        timings = machine.get("timings")
        rows.append(timing_row(run.algorithm, run.seed,
                               timings if isinstance(timings, dict) else None,
                               machine.get("ranks")))  # fmt: skip
    return rows


def _cell(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1f}"


def timings_markdown(rows: Sequence[TimingRow]) -> str:
    """The markdown table, with a line saying what the columns are."""
    header = ["Method", "Seed", "Busiest rank", *(title for _, title in COLUMNS), "Peak GB"]
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|"]  # fmt: skip
    for row in rows:
        cells = [row.method, str(row.seed),
                 MISSING if row.busiest_rank is None else str(row.busiest_rank),
                 *(_cell(getattr(row, key)) for key, _ in COLUMNS),
                 MISSING if row.peak_gb is None else f"{row.peak_gb:.2f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    note = ("\nSeconds of the busiest rank (the most train + eval + comm + checkpoint + "
            "server work); wall: the launcher's, from mpiexec's start to its exit; peak GB: "
            "the most memory any rank held (its GPU's reserved memory, else its resident "
            f"set). {MISSING}: the run's machine.json does not record it.\n")  # fmt: skip
    return "\n".join(lines) + "\n" + note


def timings_csv(rows: Sequence[TimingRow]) -> str:
    """The same rows as CSV (an empty cell where the table says "—")."""
    buffer = io.StringIO()
    fields = ["method", "seed", "busiest_rank", *(f"{key}_seconds" for key, _ in COLUMNS),
              "peak_gb"]  # fmt: skip
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(fields)
    for row in rows:
        values = [getattr(row, key) for key, _ in COLUMNS]
        writer.writerow([row.method, row.seed, "" if row.busiest_rank is None else row.busiest_rank,
                         *("" if v is None else f"{v:.3f}" for v in values),
                         "" if row.peak_gb is None else f"{row.peak_gb:.3f}"])  # fmt: skip
    return buffer.getvalue()


def write_timings(runs: Sequence[RunResult], out_dir: Path) -> tuple[Path, Path]:
    """``out_dir/timings.md`` and ``timings.csv`` (atomically); returns their paths."""
    rows = timing_rows(runs)
    markdown, table = Path(out_dir) / "timings.md", Path(out_dir) / "timings.csv"
    atomic.write_text(markdown, timings_markdown(rows))
    atomic.write_text(table, timings_csv(rows))
    return markdown, table
