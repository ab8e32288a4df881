"""Tables, DVC metrics, learning curves and figures from finished training runs.

Input: ``RUNS/{algorithm}/seed_{s}/{metrics.jsonl,run.json}`` as written by
:mod:`proxyfl.run` (docs/design.md §3.4). Output of :func:`write_report` under ``OUT``::

    tables/accuracy.{md,csv}   per method: accuracy and macro-accuracy at the final round,
                               mean ± std over clients × seeds (primary models only)
    tables/privacy.{md,csv}    per client: centre, n_train, σ, δ, ε (and Joint's row)
    metrics.json               {method: {accuracy, macro_accuracy}, "max_epsilon": ε}
    curves/{method}.csv        round, accuracy, accuracy_std, macro_accuracy, ...
    plots/curves.png           Figure 8: accuracy (left) and macro-accuracy (right) per
                               round, mean line and mean ± std band per method
    plots/{accuracy,macro_accuracy}.png   the same panels as single figures

Statistics are the mean and population std (``ddof=0``) over the primary metric rows, one
value per (client, seed) (:mod:`~proxyfl.report.stats`). Every file is written atomically
and the output is a deterministic function of the input (PNG files carry no software/date
metadata).

Modules, one job each: :mod:`~proxyfl.report.load` (run directories into validated rows),
:mod:`~proxyfl.report.stats` (the numbers), :mod:`~proxyfl.report.render` (markdown, CSV
and JSON text), :mod:`~proxyfl.report.plots` (matplotlib figures) and
:mod:`~proxyfl.report.write` (every file of a report). This package re-exports their
public names, so ``from proxyfl.report import load_runs, write_report`` keeps working.
"""

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
    method_style,
    plot_curves,
    plot_figure,
    sample_title,
)
from proxyfl.report.render import dvc_metrics, format_csv, format_table, safe_name
from proxyfl.report.stats import (
    EPSILON_SOURCES,
    AccuracyRow,
    CurvePoint,
    PrivacyRow,
    SampleSize,
    TableRow,
    accuracy_table,
    curves,
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
    "CurvePoint",
    "MethodStyle",
    "PrivacyRow",
    "ReportError",
    "ReportPaths",
    "RunResult",
    "SampleSize",
    "TableRow",
    "accuracy_table",
    "curves",
    "dvc_metrics",
    "format_csv",
    "format_table",
    "load_runs",
    "method_style",
    "plot_curves",
    "plot_figure",
    "privacy_table",
    "safe_name",
    "sample_sizes",
    "sample_title",
    "write_report",
]
