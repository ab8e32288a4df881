"""Tables, DVC metrics, learning curves and figures from finished training runs.

Input: ``RUNS/{algorithm}/seed_{s}/{metrics.jsonl,run.json}`` as written by
:mod:`proxyfl.run` (docs/files.md §3.4), the final round's per-patch predictions
``predictions/client_{c}.csv`` where recorded, and the centre reports and stores beside
them. Output of :func:`write_report` under ``OUT``::

    tables/accuracy.{md,csv}   per method: the model it evaluates, accuracy and
                               macro-accuracy at the final round, mean ± std over clients ×
                               seeds (primary models only); then the majority class's row
    tables/per_centre.{md,csv} per method and test centre: accuracy of its reported models
    tables/clinical.{md,csv}   per method: sensitivity, specificity, AUC (tumour positive)
                               with 95 % patient-bootstrap intervals
    tables/configuration.{md,csv}  the data, patch geometry and settings of the runs
    tables/privacy.{md,csv}    per client: centre, n_train, σ, δ, ε (and Joint's row)
    tables/audit.{md,csv}      when an audit was recorded (``audit.out``,
                               results/audit.json): membership inference per method and
                               model (MIA AUC, TPR at 1 % and 0.1 % FPR, the accounted ε),
                               the canary runs' one-run ε lower bounds beside the accounted
                               ε, and whether any exceeds it; the CSV holds every row
    metrics.json               {method: {accuracy, macro_accuracy[, sensitivity,
                               specificity, auc]}, "max_epsilon": ε}
    curves/{method}.csv        round, accuracy, accuracy_std, macro_accuracy, ...
    plots/curves.png           Figure 8: accuracy (left) and macro-accuracy (right) per
                               round, mean line and mean ± std band per method, the paper's
                               seven methods in one row, others (PrivateKT) in a second,
                               the majority class as a dashed line
    plots/{accuracy,macro_accuracy}.png   the same panels as single figures
    plots/audit_roc.png        with an audit: the membership-inference ROC curves, log-log

Statistics are the mean and population std (``ddof=0``) over the primary metric rows, one
value per (client, seed) (:mod:`~analysis.report.stats`). Every file is written atomically
and the output is a deterministic function of the input (PNG files carry no software/date
metadata).

Modules, one job each: :mod:`~analysis.report.load` (run directories into validated rows),
:mod:`~analysis.report.stats` (the numbers), :mod:`~analysis.report.clinical` (sensitivity,
specificity, AUC and the patient bootstrap: pure maths), :mod:`~analysis.report.predictions`
(the runs' per-patch predictions into per-centre and clinical rows),
:mod:`~analysis.report.context` (the data, patch geometry and configuration),
:mod:`~analysis.report.audit` (the privacy audit's file into its tables),
:mod:`~analysis.report.render` (markdown, CSV and JSON text), :mod:`~analysis.report.plots`
(matplotlib figures), :mod:`~analysis.report.html` (the page) and
:mod:`~analysis.report.write` (every file of a report). This package re-exports their
public names, so ``from analysis.report import load_runs, write_report`` keeps working.
"""

import importlib
from typing import Any

# Each name loads its module on first use (PEP 562): importing one room (the pure
# maths of clinical, for the staging) does not load matplotlib and the page's code.
_HOMES: dict[str, str] = {
    "Audit": "analysis.report.audit",
    "AuditRow": "analysis.report.audit",
    "MembershipRow": "analysis.report.audit",
    "RocCurve": "analysis.report.audit",
    "audit_csv": "analysis.report.audit",
    "audit_markdown": "analysis.report.audit",
    "canary_rows": "analysis.report.audit",
    "membership_table": "analysis.report.audit",
    "read_audit": "analysis.report.audit",
    "roc_curves": "analysis.report.audit",
    "MajorityClass": "analysis.report.clinical",
    "method_measures": "analysis.report.clinical",
    "ConfigurationRow": "analysis.report.context",
    "DataSource": "analysis.report.context",
    "configuration_table": "analysis.report.context",
    "data_source": "analysis.report.context",
    "JOINT": "analysis.report.load",
    "PAPER_ORDER": "analysis.report.load",
    "ReportError": "analysis.report.load",
    "RunResult": "analysis.report.load",
    "load_runs": "analysis.report.load",
    "EMPHASISED": "analysis.report.plots",
    "MethodStyle": "analysis.report.plots",
    "OKABE_ITO": "analysis.report.plots",
    "method_groups": "analysis.report.plots",
    "method_style": "analysis.report.plots",
    "plot_curves": "analysis.report.plots",
    "plot_figure": "analysis.report.plots",
    "plot_roc": "analysis.report.plots",
    "sample_title": "analysis.report.plots",
    "ClinicalRow": "analysis.report.predictions",
    "PerCentreRow": "analysis.report.predictions",
    "clinical_table": "analysis.report.predictions",
    "load_predictions": "analysis.report.predictions",
    "per_centre_table": "analysis.report.predictions",
    "TableRow": "analysis.report.render",
    "dvc_metrics": "analysis.report.render",
    "format_csv": "analysis.report.render",
    "format_table": "analysis.report.render",
    "safe_name": "analysis.report.render",
    "AccuracyRow": "analysis.report.stats",
    "CurvePoint": "analysis.report.stats",
    "EPSILON_SOURCES": "analysis.report.stats",
    "PrivacyRow": "analysis.report.stats",
    "SampleSize": "analysis.report.stats",
    "accuracy_table": "analysis.report.stats",
    "curves": "analysis.report.stats",
    "majority_row": "analysis.report.stats",
    "privacy_table": "analysis.report.stats",
    "sample_sizes": "analysis.report.stats",
    "ReportPaths": "analysis.report.write",
    "write_report": "analysis.report.write",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
