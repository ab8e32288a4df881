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
value per (client, seed) (:mod:`~proxyfl.report.stats`). Every file is written atomically
and the output is a deterministic function of the input (PNG files carry no software/date
metadata).

Modules, one job each: :mod:`~proxyfl.report.load` (run directories into validated rows),
:mod:`~proxyfl.report.stats` (the numbers), :mod:`~proxyfl.report.clinical` (sensitivity,
specificity, AUC and the patient bootstrap: pure maths), :mod:`~proxyfl.report.predictions`
(the runs' per-patch predictions into per-centre and clinical rows),
:mod:`~proxyfl.report.context` (the data, patch geometry and configuration),
:mod:`~proxyfl.report.audit` (the privacy audit's file into its tables),
:mod:`~proxyfl.report.render` (markdown, CSV and JSON text), :mod:`~proxyfl.report.plots`
(matplotlib figures), :mod:`~proxyfl.report.html` (the page) and
:mod:`~proxyfl.report.write` (every file of a report). This package re-exports their
public names, so ``from proxyfl.report import load_runs, write_report`` keeps working.
"""

import importlib
from typing import Any

# Each name loads its module on first use (PEP 562): importing one room (the pure
# maths of clinical, for the staging) does not load matplotlib and the page's code.
_HOMES: dict[str, str] = {
    "Audit": "proxyfl.report.audit",
    "AuditRow": "proxyfl.report.audit",
    "MembershipRow": "proxyfl.report.audit",
    "RocCurve": "proxyfl.report.audit",
    "audit_csv": "proxyfl.report.audit",
    "audit_markdown": "proxyfl.report.audit",
    "canary_rows": "proxyfl.report.audit",
    "membership_table": "proxyfl.report.audit",
    "read_audit": "proxyfl.report.audit",
    "roc_curves": "proxyfl.report.audit",
    "MajorityClass": "proxyfl.report.clinical",
    "method_measures": "proxyfl.report.clinical",
    "ConfigurationRow": "proxyfl.report.context",
    "DataSource": "proxyfl.report.context",
    "configuration_table": "proxyfl.report.context",
    "data_source": "proxyfl.report.context",
    "JOINT": "proxyfl.report.load",
    "PAPER_ORDER": "proxyfl.report.load",
    "ReportError": "proxyfl.report.load",
    "RunResult": "proxyfl.report.load",
    "load_runs": "proxyfl.report.load",
    "EMPHASISED": "proxyfl.report.plots",
    "MethodStyle": "proxyfl.report.plots",
    "OKABE_ITO": "proxyfl.report.plots",
    "method_groups": "proxyfl.report.plots",
    "method_style": "proxyfl.report.plots",
    "plot_curves": "proxyfl.report.plots",
    "plot_figure": "proxyfl.report.plots",
    "plot_roc": "proxyfl.report.plots",
    "sample_title": "proxyfl.report.plots",
    "ClinicalRow": "proxyfl.report.predictions",
    "PerCentreRow": "proxyfl.report.predictions",
    "clinical_table": "proxyfl.report.predictions",
    "load_predictions": "proxyfl.report.predictions",
    "per_centre_table": "proxyfl.report.predictions",
    "TableRow": "proxyfl.report.render",
    "dvc_metrics": "proxyfl.report.render",
    "format_csv": "proxyfl.report.render",
    "format_table": "proxyfl.report.render",
    "safe_name": "proxyfl.report.render",
    "AccuracyRow": "proxyfl.report.stats",
    "CurvePoint": "proxyfl.report.stats",
    "EPSILON_SOURCES": "proxyfl.report.stats",
    "PrivacyRow": "proxyfl.report.stats",
    "SampleSize": "proxyfl.report.stats",
    "accuracy_table": "proxyfl.report.stats",
    "curves": "proxyfl.report.stats",
    "majority_row": "proxyfl.report.stats",
    "privacy_table": "proxyfl.report.stats",
    "sample_sizes": "proxyfl.report.stats",
    "ReportPaths": "proxyfl.report.write",
    "write_report": "proxyfl.report.write",
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
