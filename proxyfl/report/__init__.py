"""Tables, DVC metrics, learning curves and figures from finished training runs.

Input: ``RUNS/{algorithm}/seed_{s}/{metrics.jsonl,run.json}`` as written by
:mod:`proxyfl.run` (docs/design.md §3.4), the final round's per-patch predictions
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

from proxyfl.report.audit import (
    Audit,
    AuditRow,
    MembershipRow,
    RocCurve,
    audit_csv,
    audit_markdown,
    canary_rows,
    membership_table,
    read_audit,
    roc_curves,
)
from proxyfl.report.clinical import MajorityClass, method_measures
from proxyfl.report.context import ConfigurationRow, DataSource, configuration_table, data_source
from proxyfl.report.load import (
    JOINT,
    PAPER_ORDER,
    ReportError,
    RunResult,
    load_runs,
)
from proxyfl.report.plots import (
    EMPHASISED,
    OKABE_ITO,
    MethodStyle,
    method_groups,
    method_style,
    plot_curves,
    plot_figure,
    plot_roc,
    sample_title,
)
from proxyfl.report.predictions import (
    ClinicalRow,
    PerCentreRow,
    clinical_table,
    load_predictions,
    per_centre_table,
)
from proxyfl.report.render import TableRow, dvc_metrics, format_csv, format_table, safe_name
from proxyfl.report.stats import (
    EPSILON_SOURCES,
    AccuracyRow,
    CurvePoint,
    PrivacyRow,
    SampleSize,
    accuracy_table,
    curves,
    majority_row,
    privacy_table,
    sample_sizes,
)
from proxyfl.report.write import ReportPaths, write_report

__all__ = [
    "EMPHASISED",
    "EPSILON_SOURCES",
    "JOINT",
    "OKABE_ITO",
    "PAPER_ORDER",
    "AccuracyRow",
    "Audit",
    "AuditRow",
    "ClinicalRow",
    "ConfigurationRow",
    "CurvePoint",
    "DataSource",
    "MajorityClass",
    "MembershipRow",
    "MethodStyle",
    "PerCentreRow",
    "PrivacyRow",
    "ReportError",
    "ReportPaths",
    "RocCurve",
    "RunResult",
    "SampleSize",
    "TableRow",
    "accuracy_table",
    "audit_csv",
    "audit_markdown",
    "canary_rows",
    "clinical_table",
    "configuration_table",
    "curves",
    "data_source",
    "dvc_metrics",
    "format_csv",
    "format_table",
    "load_predictions",
    "load_runs",
    "majority_row",
    "membership_table",
    "method_groups",
    "method_measures",
    "method_style",
    "per_centre_table",
    "plot_curves",
    "plot_figure",
    "plot_roc",
    "privacy_table",
    "read_audit",
    "roc_curves",
    "safe_name",
    "sample_sizes",
    "sample_title",
    "write_report",
]
