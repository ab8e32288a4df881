"""The report's files: every table, metrics.json, curve and figure of some runs, the
privacy audit's tables and figure when an audit was recorded, and ``report.html`` holding
them all with the stores' Table 1, written atomically through :mod:`plumbing.atomic` under
one output directory. Every file is a function of the runs, the stores' reports and
attributes and the audit file alone (no clock, fixed bootstrap seed, sorted orders): the
same input gives the same bytes."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from analysis.audit.record import changed_since_audit
from analysis.report.audit import (
    RERUN_AUDIT,
    Audit,
    audit_csv,
    audit_markdown,
    read_audit,
    roc_curves,
)
from analysis.report.clinical import BOOTSTRAP_SEED, LEVEL, N_RESAMPLES, MajorityClass
from analysis.report.context import (
    client_centres,
    configuration_table,
    data_source,
    describe_geometry,
    majority_from_reports,
    report_centres,
    store_geometry,
)
from analysis.report.html import Preprocessing, report_html
from analysis.report.load import ReportError, RunResult
from analysis.report.plots import plot_curves, plot_figure, plot_roc, sample_title
from analysis.report.predictions import (
    MethodPredictions,
    clinical_table,
    load_predictions,
    merged_majority,
    per_centre_table,
    without_predictions,
)
from analysis.report.render import (
    accuracy_note,
    clinical_note,
    configuration_note,
    curve_csv,
    data_note,
    dvc_metrics,
    format_csv,
    format_table,
    majority_note,
    other_configurations_markdown,
    per_centre_csv,
    per_centre_markdown,
    per_centre_note,
    public_pool_note,
    safe_name,
    summary_line,
)
from analysis.report.select import RunSelection
from analysis.report.staging import (
    StagingFileError,
    pictures_to_show,
    read_staging,
    staging_of_runs,
    staging_table,
)
from analysis.report.stats import (
    CurvePoint,
    accuracy_table,
    curves,
    majority_row,
    privacy_table,
    sample_sizes,
)
from plumbing import atomic
from plumbing.verified import recorded_digest
from proxyfl.kept import deployed_model
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
    per_centre_md: Path
    per_centre_csv: Path
    clinical_md: Path
    clinical_csv: Path
    configuration_md: Path
    configuration_csv: Path
    metrics_json: Path
    curves: Mapping[str, Path]
    accuracy_png: Path
    macro_accuracy_png: Path
    curves_png: Path
    report_html: Path
    other_configurations_md: Path | None = None  # runs of other parameters, tabled apart
    audit_md: Path | None = None  # the privacy audit's tables, when one was recorded
    audit_csv: Path | None = None
    audit_roc_png: Path | None = None  # its membership-inference ROC figure
    staging_md: Path | None = None  # the staging's table, when a staging was recorded

    def all(self) -> list[Path]:
        fixed = [self.accuracy_md, self.accuracy_csv, self.privacy_md, self.privacy_csv,
                 self.per_centre_md, self.per_centre_csv, self.clinical_md, self.clinical_csv,
                 self.configuration_md, self.configuration_csv]  # fmt: skip
        other = [self.other_configurations_md] if self.other_configurations_md else []
        audit = [path for path in (self.audit_md, self.audit_csv) if path is not None]
        staging = [self.staging_md] if self.staging_md is not None else []
        return [*fixed, *other, *audit, *staging, self.metrics_json, *self.curves.values(),
                *self.plots(), self.report_html]  # fmt: skip

    def plots(self) -> list[Path]:
        audit = [self.audit_roc_png] if self.audit_roc_png is not None else []
        return [self.accuracy_png, self.macro_accuracy_png, self.curves_png, *audit]


@atomic.written_together  # the whole set of files, or the previous set as it was
def write_report(
    runs: Sequence[RunResult],
    out_dir: Path,
    stores_dir: Path | None = None,
    selection: RunSelection | None = None,
    *,
    audit: Path | None = None,
    staging: Path | None = None,
    staging_dir: Path | None = None,
    staging_pictures_mb: float | None = None,
    n_resamples: int = N_RESAMPLES,
) -> ReportPaths:
    """Write tables, metrics.json, per-method curves, the figures and ``report.html`` under
    ``out_dir``, all together or none (:func:`plumbing.atomic.all_or_nothing`: a failure
    half-way, a full disk, leaves the previous report's files as they were); the page's
    Table 1 and failures, the data line (synthetic or real slides) and the patch geometry
    come from the centre reports and stores in ``stores_dir`` (not shown when it is None).
    ``selection`` (how ``runs`` were chosen, :func:`~analysis.report.select.select_runs`)
    adds its note on runs not listed and, in
    ``tables/other_configurations.md`` and on the page, the runs of other parameters, each
    set apart and labelled with them. The runs' per-patch predictions (when recorded) give
    the per-centre accuracy, the clinical table (``n_resamples`` patient resamples per
    method) and the majority class; else the centre reports' test counts give the latter.

    ``audit`` is the privacy audit's file (``audit.out``, :mod:`analysis.report.audit`):
    when it exists, ``tables/audit.{md,csv}``, ``plots/audit_roc.png`` and the page's audit
    section show it; when it is None or absent, the page says no audit was recorded and
    no audit file is written. A file that is there but malformed is a ReportError naming it.

    ``staging`` is the staging's summary (``stage.summary``, :mod:`analysis.staging`) and
    ``staging_dir`` its centres' folders (``stage.out``, where the pictures are): when the
    summary exists, ``tables/staging.md`` and the page's staging section (the table, and
    per centre the test slides' pictures, within ``staging_pictures_mb`` MB when given:
    the slides most methods called wrong first) show it; else the page says none was
    recorded.

    Every file is replaced atomically; curve CSVs of methods no longer present are removed,
    and so are the audit's files of an earlier report when there is no audit now, and the
    temporaries an earlier report's cut-short writes left.
    """
    if not runs:
        raise ReportError("no runs to report")
    recorded = _read_audit(audit)
    staged, staging_absent = _read_staging(staging, runs)
    out_dir = Path(out_dir)
    tables = out_dir / "tables"
    # what an earlier report could not remove (its writes cut short on a folder that was
    # read-only then, or by a power loss): its temporaries, once their writer is gone
    for folder in (out_dir, tables, out_dir / "curves", out_dir / "plots"):
        atomic.remove_stale_temporaries(folder)
    paths = ReportPaths(
        accuracy_md=tables / "accuracy.md",
        accuracy_csv=tables / "accuracy.csv",
        privacy_md=tables / "privacy.md",
        privacy_csv=tables / "privacy.csv",
        per_centre_md=tables / "per_centre.md",
        per_centre_csv=tables / "per_centre.csv",
        clinical_md=tables / "clinical.md",
        clinical_csv=tables / "clinical.csv",
        configuration_md=tables / "configuration.md",
        configuration_csv=tables / "configuration.csv",
        metrics_json=out_dir / "metrics.json",
        curves={},
        accuracy_png=out_dir / "plots" / "accuracy.png",
        macro_accuracy_png=out_dir / "plots" / "macro_accuracy.png",
        curves_png=out_dir / "plots" / "curves.png",
        report_html=out_dir / "report.html",
    )
    preprocessing = None if stores_dir is None else read_preprocessing(Path(stores_dir))
    centres = report_centres(runs)
    source = data_source(None if preprocessing is None else preprocessing.reports, centres,
                         str(stores_dir))  # fmt: skip
    if source.kind == "unknown":
        logger.warning("report: the data are unknown (%s)", source.detail)
    geometry = describe_geometry(
        *store_geometry(None if preprocessing is None else preprocessing.reports, centres)
    )
    predictions = load_predictions(runs)
    majority, majority_source = _majority(predictions, preprocessing, client_centres(runs))
    missing = without_predictions(predictions)

    accuracy = accuracy_table(runs)
    shown = [*accuracy, majority_row(majority)] if majority is not None else accuracy
    privacy = privacy_table(runs)
    per_centre = per_centre_table(predictions)
    clinical = clinical_table(predictions, n_resamples, BOOTSTRAP_SEED, LEVEL)
    configuration = configuration_table(runs, source, geometry)
    per_round = curves(runs)
    paths = replace(
        paths, curves={name: out_dir / "curves" / f"{safe_name(name)}.csv" for name in per_round}
    )
    unlisted = selection.unlisted_note() if selection is not None else ""
    note = accuracy_note(accuracy) + majority_note(majority, majority_source)
    data = data_note(source)
    groups = selection.other_groups() if selection is not None else {}
    others = {label: accuracy_table(group) for label, group in groups.items()}
    other_md = tables / "other_configurations.md"
    if others:
        paths = replace(paths, other_configurations_md=other_md)
        atomic.write_text(other_md, other_configurations_markdown(others))
    elif other_md.exists():  # from an earlier report: these runs are no longer apart
        other_md.unlink()
    atomic.write_text(paths.accuracy_md, format_table(shown) + note
                      + (f"\n{unlisted}\n" if unlisted else "") + data)  # fmt: skip
    atomic.write_text(paths.accuracy_csv, format_csv(shown))
    atomic.write_text(paths.privacy_md, format_table(privacy) + public_pool_note(runs))
    atomic.write_text(paths.privacy_csv, format_csv(privacy))
    centre_note = per_centre_note(missing)
    atomic.write_text(paths.per_centre_md, per_centre_markdown(per_centre, centre_note + data))
    atomic.write_text(paths.per_centre_csv, per_centre_csv(per_centre))
    measured = any(row.n_models for row in clinical)
    clinical_text = clinical_note(clinical, missing, n_resamples, BOOTSTRAP_SEED, LEVEL)
    atomic.write_text(paths.clinical_md, (format_table(clinical) if measured else "")
                      + clinical_text + data)  # fmt: skip
    atomic.write_text(paths.clinical_csv, format_csv(clinical))
    atomic.write_text(paths.configuration_md,
                      format_table(configuration) + configuration_note() + data)  # fmt: skip
    atomic.write_text(paths.configuration_csv, format_csv(configuration))
    paths = _write_audit(recorded, paths, tables, out_dir / "plots")
    staging_md = tables / STAGING_MD
    if staged is not None:
        atomic.write_text(staging_md, staging_table(staged))
        paths = replace(paths, staging_md=staging_md)
    elif staging_md.exists():  # from an earlier report: no staging to show now
        staging_md.unlink()
    # NaN (a method without test examples) would make metrics.json invalid JSON: null.
    metrics = json_safe(dvc_metrics(shown, privacy, clinical))  # with the majority class
    atomic.write_json(paths.metrics_json, metrics)
    _write_curves(per_round, paths.curves)
    title = sample_title(sample_sizes(runs))
    plot_curves(per_round, "accuracy", "Accuracy", paths.accuracy_png, title=title,
                majority=majority)  # fmt: skip
    plot_curves(per_round, "macro_accuracy", "Macro-accuracy", paths.macro_accuracy_png,
                title=title, majority=majority)  # fmt: skip
    plot_figure(per_round, paths.curves_png, title=title, majority=majority)
    pictures, pictures_total = _staging_pictures(staged, staging_dir, staging_pictures_mb)
    page = report_html(
        accuracy=shown, privacy=privacy, accuracy_note=note, summary=summary_line(metrics),
        figure_png=atomic.read_written(paths.curves_png), figure_title=title, runs=runs,
        runs_dir=str(runs[0].path.parent.parent), preprocessing=preprocessing,
        links=[path.relative_to(out_dir).as_posix()
               for path in paths.all() if path != paths.report_html],
        unlisted_note=unlisted, other_configurations=others, data=source,
        configuration=configuration, configuration_note=configuration_note(),
        per_centre=per_centre, per_centre_note=centre_note,
        clinical=clinical, clinical_note=clinical_text,
        audit=recorded, audit_absent=_absent(audit),
        audit_roc_png=atomic.read_written(paths.audit_roc_png) if paths.audit_roc_png else None,
        audit_roc_title=ROC_TITLE,
        staging=staged, staging_absent=staging_absent,
        staging_pictures=pictures, staging_pictures_total=pictures_total,
        staging_pictures_mb=staging_pictures_mb,
    )  # fmt: skip
    atomic.write_text(paths.report_html, page)
    logger.info("report of %d run(s) written to %s", len(runs), out_dir)
    return paths


AUDIT_MD, AUDIT_CSV, AUDIT_ROC_PNG = "audit.md", "audit.csv", "audit_roc.png"
ROC_TITLE = "Membership inference: ROC of the reported attack"


def _read_audit(path: Path | None) -> Audit | None:
    """The audit at ``path``; None when no path is given or no file is there (logged)."""
    if path is None:
        return None
    path = Path(path)
    if not path.exists():
        logger.info("report: no privacy audit (%s absent)", path)
        return None
    if not path.is_file():
        raise ReportError(f"{path}: not a file (the privacy audit's rows, audit.out)")
    audit = read_audit(path)
    stale = changed_since_audit(path)
    if stale is not None:
        logger.warning("report: the privacy audit %s is stale: %s: %s", path, stale, RERUN_AUDIT)
        audit = replace(audit, stale=stale)
    return audit


def _absent(path: Path | None, what: str = "audit") -> str:
    """Why the page has no audit (or staging): the file it looked for, or that none was
    given."""
    return f"no {what} file given" if path is None else f"{path} absent"


STAGING_MD = "staging.md"


def _read_staging(
    path: Path | None, runs: Sequence[RunResult]
) -> tuple[dict[str, Any] | None, str]:
    """The staging summary at ``path``, narrowed to ``runs``
    (:func:`~analysis.report.staging.staging_of_runs`), or None and why it is not shown:
    no path given, no file there, or a staging of other models than the runs keep."""
    if path is None or not Path(path).exists():
        absent = _absent(path, "staging")
        logger.info("report: no staging (%s)", absent)
        return None, absent
    try:
        summary = read_staging(path)
    except StagingFileError as error:
        raise ReportError(str(error)) from None
    shown, why = staging_of_runs(summary, _staging_models(runs))
    if shown is None:
        why = f"{path} is not a staging of these runs: {why}; `camelyon-proxyfl stage` stages them"
        logger.warning("report: no staging shown: %s", why)
    return shown, why


def _staging_models(runs: Sequence[RunResult]) -> dict[str, dict[int, str | None]]:
    """Per run (``ALGORITHM/seed_S``), the recorded digest of the kept model that stages
    each of its centres now (:func:`proxyfl.kept.deployed_model`; None: none, or none
    kept)."""
    models: dict[str, dict[int, str | None]] = {}
    for run in runs:
        centers = [int(c) for c in run.config.get("centers") or ()]
        digests: dict[int, str | None] = {}
        for center in centers:
            deployed = deployed_model(run.path, run.algorithm, centers, center)
            # as the staging records it (analysis.staging.models.staging_model)
            digests[center] = (None if deployed is None
                               else recorded_digest(deployed[1]) or "unrecorded")  # fmt: skip
        models[f"{run.algorithm}/seed_{run.seed}"] = digests
    return models


def _staging_pictures(
    summary: Mapping[str, Any] | None, staging_dir: Path | None, budget_mb: float | None
) -> tuple[dict[str, list[tuple[str, bytes]]], int]:
    """Per centre, the test slides' pictures the page shows (slide id, PNG bytes), chosen
    by :func:`~analysis.report.staging.pictures_to_show` within ``budget_mb`` MB of PNG
    (the page embeds them base64, 4/3 as large), and how many pictures there are in all;
    a picture the summary names that is not there is a ReportError naming it."""
    if summary is None or staging_dir is None:
        return {}, 0
    paths = {center: {slide: Path(staging_dir) / f"center_{center}" / relative
                      for slide, relative in slides.items()}
             for center, slides in summary.get("pictures", {}).items()}  # fmt: skip

    def unreadable(center: str, slide: str, error: OSError) -> ReportError:
        fix = f"stage centre {center} again: `camelyon-proxyfl stage --centers {center}`"
        return ReportError(f"{paths[center][slide]}: the picture of {slide} cannot be read "
                           f"({error.strerror}); {fix}")  # fmt: skip

    sizes: dict[str, dict[str, int]] = {}
    for center, slides in paths.items():
        for slide, path in slides.items():
            try:
                sizes.setdefault(center, {})[slide] = path.stat().st_size
            except OSError as error:
                raise unreadable(center, slide, error) from None
    budget = float("inf") if budget_mb is None else budget_mb * 1e6
    shown = pictures_to_show(summary.get("wrong_calls", {}), sizes, budget)
    pictures: dict[str, list[tuple[str, bytes]]] = {}
    for center, slides in shown.items():
        for slide in slides:
            try:
                pictures.setdefault(center, []).append((slide, paths[center][slide].read_bytes()))
            except OSError as error:
                raise unreadable(center, slide, error) from None
    return pictures, sum(len(slides) for slides in sizes.values())


def _write_audit(audit: Audit | None, paths: ReportPaths, tables: Path, plots: Path) -> ReportPaths:
    """``tables/audit.{md,csv}`` and ``plots/audit_roc.png`` (when the audit has training
    rows) of ``audit``; without one, those of an earlier report are removed (the report
    must not show an audit it no longer has)."""
    md, table, png = tables / AUDIT_MD, tables / AUDIT_CSV, plots / AUDIT_ROC_PNG
    curves = roc_curves(audit.rows) if audit is not None else []
    stale = [png] if not curves else []
    if audit is None:
        stale += [md, table]
    for path in stale:
        if path.exists():
            logger.info("removing the stale audit file %s", path)
            path.unlink()
    if audit is None:
        return paths
    atomic.write_text(md, audit_markdown(audit))
    atomic.write_text(table, audit_csv(audit))
    if curves:
        plot_roc(curves, png, title=ROC_TITLE)
    return replace(paths, audit_md=md, audit_csv=table, audit_roc_png=png if curves else None)


def _majority(
    predictions: Mapping[str, MethodPredictions],
    preprocessing: Preprocessing | None,
    centres: Sequence[int],
) -> tuple[MajorityClass | None, str]:
    """The merged test set's majority class and where it comes from: the predictions'
    labels, else the centre reports' test counts of the clients' centres, else None."""
    majority = merged_majority(predictions)
    if majority is not None:
        return majority, "from the predictions' labels"
    if preprocessing is not None:
        majority = majority_from_reports(preprocessing.reports, centres)
        if majority is not None:
            return majority, "from the centre reports' test counts"
    return None, ""


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
