"""Reporting tasks: the runs to report on, and the tables, metrics and curves from them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prefect import task

from proxyfl.report import ReportPaths, RunResult, load_runs, write_report


@task(name="finished runs")
def finished_runs(
    runs_dir: Path, algorithms: Sequence[str], seeds: Sequence[int]
) -> list[RunResult]:
    """Every requested (algorithm, seed) run, finished; a ``ReportError`` names what is not."""
    return load_runs(runs_dir, algorithms=algorithms, seeds=seeds)


@task(name="report files")
def report_files(
    runs: Sequence[RunResult], out_dir: Path, stores_dir: Path | None
) -> ReportPaths:
    """Tables (md, csv), metrics.json, per-method curves, the Figure 8 plots and
    report.html (with Table 1 and the failures of the stores in ``stores_dir``)."""
    return write_report(runs, out_dir, stores_dir)
