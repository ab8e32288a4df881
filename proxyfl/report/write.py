"""The report's files: every table, metrics.json, curve and figure of some runs, and
``report.html`` holding them all with the stores' Table 1, written atomically through
:mod:`plumbing.atomic` under one output directory."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from plumbing import atomic
from proxyfl.report.html import Preprocessing, report_html
from proxyfl.report.load import ReportError, RunResult
from proxyfl.report.plots import plot_curves, plot_figure, sample_title
from proxyfl.report.render import (
    accuracy_note,
    curve_csv,
    dvc_metrics,
    format_csv,
    format_table,
    other_configurations_markdown,
    public_pool_note,
    safe_name,
    summary_line,
)
from proxyfl.report.select import RunSelection
from proxyfl.report.stats import (
    CurvePoint,
    accuracy_table,
    curves,
    privacy_table,
    sample_sizes,
)
from proxyfl.results import json_safe
from wsi.summary import scan_center_reports

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReportPaths:
    """The files :func:`write_report` wrote."""

    accuracy_md: Path
    accuracy_csv: Path
    privacy_md: Path
    privacy_csv: Path
    metrics_json: Path
    curves: Mapping[str, Path]
    accuracy_png: Path
    macro_accuracy_png: Path
    curves_png: Path
    report_html: Path
    other_configurations_md: Path | None = None  # runs of other parameters, tabled apart

    def all(self) -> list[Path]:
        fixed = [self.accuracy_md, self.accuracy_csv, self.privacy_md, self.privacy_csv]
        other = [self.other_configurations_md] if self.other_configurations_md else []
        return [*fixed, *other, self.metrics_json, *self.curves.values(), *self.plots(),
                self.report_html]  # fmt: skip

    def plots(self) -> list[Path]:
        return [self.accuracy_png, self.macro_accuracy_png, self.curves_png]


def write_report(
    runs: Sequence[RunResult],
    out_dir: Path,
    stores_dir: Path | None = None,
    selection: RunSelection | None = None,
) -> ReportPaths:
    """Write tables, metrics.json, per-method curves, the figures and ``report.html`` under
    ``out_dir``; the page's Table 1 and failures come from the centre reports beside the
    stores in ``stores_dir`` (none shown when it is None). ``selection`` (how ``runs`` were
    chosen, :func:`~proxyfl.report.select.select_runs`) adds its note on runs not listed
    and, in ``tables/other_configurations.md`` and on the page, the runs of other
    parameters, each set apart and labelled with them.

    Every file is replaced atomically; curve CSVs of methods no longer present are removed.
    """
    if not runs:
        raise ReportError("no runs to report")
    out_dir = Path(out_dir)
    accuracy = accuracy_table(runs)
    privacy = privacy_table(runs)
    per_round = curves(runs)
    tables = out_dir / "tables"
    paths = ReportPaths(
        accuracy_md=tables / "accuracy.md",
        accuracy_csv=tables / "accuracy.csv",
        privacy_md=tables / "privacy.md",
        privacy_csv=tables / "privacy.csv",
        metrics_json=out_dir / "metrics.json",
        curves={name: out_dir / "curves" / f"{safe_name(name)}.csv" for name in per_round},
        accuracy_png=out_dir / "plots" / "accuracy.png",
        macro_accuracy_png=out_dir / "plots" / "macro_accuracy.png",
        curves_png=out_dir / "plots" / "curves.png",
        report_html=out_dir / "report.html",
    )
    unlisted = selection.unlisted_note() if selection is not None else ""
    note = accuracy_note(accuracy) + (f"\n{unlisted}\n" if unlisted else "")
    groups = selection.other_groups() if selection is not None else {}
    others = {label: accuracy_table(group) for label, group in groups.items()}
    other_md = tables / "other_configurations.md"
    if others:
        paths = replace(paths, other_configurations_md=other_md)
        atomic.write_text(other_md, other_configurations_markdown(others))
    elif other_md.exists():  # from an earlier report: these runs are no longer apart
        other_md.unlink()
    atomic.write_text(paths.accuracy_md, format_table(accuracy) + note)
    atomic.write_text(paths.accuracy_csv, format_csv(accuracy))
    atomic.write_text(paths.privacy_md, format_table(privacy) + public_pool_note(runs))
    atomic.write_text(paths.privacy_csv, format_csv(privacy))
    # NaN (a method without test examples) would make metrics.json invalid JSON: null.
    metrics = json_safe(dvc_metrics(accuracy, privacy))
    atomic.write_json(paths.metrics_json, metrics)
    _write_curves(per_round, paths.curves)
    title = sample_title(sample_sizes(runs))
    plot_curves(per_round, "accuracy", "Accuracy", paths.accuracy_png, title=title)
    plot_curves(
        per_round, "macro_accuracy", "Macro-accuracy", paths.macro_accuracy_png, title=title
    )
    plot_figure(per_round, paths.curves_png, title=title)
    page = report_html(
        accuracy=accuracy, privacy=privacy, accuracy_note=note, summary=summary_line(metrics),
        figure_png=paths.curves_png.read_bytes(), figure_title=title, runs=runs,
        runs_dir=str(runs[0].path.parent.parent),
        preprocessing=None if stores_dir is None else read_preprocessing(Path(stores_dir)),
        links=[path.relative_to(out_dir).as_posix()
               for path in paths.all() if path != paths.report_html],
        unlisted_note=unlisted, other_configurations=others,
    )  # fmt: skip
    atomic.write_text(paths.report_html, page)
    logger.info("report of %d run(s) written to %s", len(runs), out_dir)
    return paths


def _write_curves(per_round: Mapping[str, list[CurvePoint]], paths: Mapping[str, Path]) -> None:
    """One CSV per method, then remove the curve CSVs of methods no longer reported (DVC
    plots every file of the folder)."""
    for algorithm, points in per_round.items():
        atomic.write_text(paths[algorithm], curve_csv(points))
    for directory in {path.parent for path in paths.values()}:
        for stale in sorted(set(directory.glob("*.csv")) - set(paths.values())):
            logger.info("removing stale curve %s", stale)
            stale.unlink()


def read_preprocessing(stores_dir: Path) -> Preprocessing:
    """The centre reports beside the stores in ``stores_dir``; one that cannot be read is
    named on the page (and logged) rather than failing the report of finished runs."""
    reports, unreadable = scan_center_reports(stores_dir)
    for error in unreadable:
        logger.warning("report.html: %s", error)
    return Preprocessing(str(stores_dir), reports, [(str(e.path), e.reason) for e in unreadable])
