"""Reporting tasks: the runs to report on, and the tables, metrics and curves from them."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from analysis.report import ReportPaths, write_report
from analysis.report.select import RunSelection, select_runs
from analysis.report.timings import write_timings
from camelyon_proxyfl.params.report import ReportConfig


@task(name="finished runs")
def finished_runs(config: ReportConfig) -> RunSelection:
    """Every listed (algorithm, seed) run, finished and made with the listed parameters
    (or, with ``other_configurations: separate``, set apart); a ``ReportError`` names what
    is not."""
    return select_runs(config.runs, config.algorithms, config.seeds,
                       config.expected_fingerprints(), config.other_configurations)  # fmt: skip


@task(name="report files")
def report_files(
    selection: RunSelection,
    out_dir: Path,
    stores_dir: Path | None,
    audit: Path | None = None,
    staging: Path | None = None,
    staging_dir: Path | None = None,
    staging_pictures_mb: float | None = None,
) -> ReportPaths:
    """Tables (md, csv: accuracy, per-centre accuracy, sensitivity/specificity/AUC,
    configuration, privacy, and the privacy audit when ``audit``, its file, exists),
    metrics.json, per-method curves, the Figure 8 plots (and the audit's ROC figure) and
    report.html (with the data line, Table 1 and the failures of the stores in
    ``stores_dir``, the audit and the staging, or a line saying none was recorded; at most
    ``staging_pictures_mb`` MB of slide pictures)."""
    return write_report(selection.runs, out_dir, stores_dir, selection, audit=audit,
                        staging=staging, staging_dir=staging_dir,
                        staging_pictures_mb=staging_pictures_mb)  # fmt: skip


@task(name="timing files")
def timing_files(selection: RunSelection, out_dir: Path) -> tuple[Path, Path]:
    """``out_dir/timings.{md,csv}``: where each run's wall time went, from its
    machine.json (:mod:`analysis.report.timings`). Beside the report, never in its
    DVC-tracked outputs: the figures change with every launch."""
    return write_timings(selection.runs, out_dir)
