"""How the report's numbers read: markdown and CSV tables, DVC's metrics.json, curve CSVs.

Every function here returns text or a JSON-able object and writes nothing; the writer
(:mod:`proxyfl.report.write`) puts them in files. Accuracy cells read "0.812 ± 0.034"
(3 decimals), ε has 2 decimals, σ and δ their shortest form (``%g``); a missing value is
"—" in markdown and empty in CSV.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from proxyfl.report.load import JOINT, RunResult
from proxyfl.report.stats import AccuracyRow, CurvePoint, PrivacyRow, TableRow
from proxyfl.results import LABEL_LDP, SAMPLE_DP

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

CURVE_FIELDS: tuple[str, ...] = (
    "round",
    "accuracy",
    "accuracy_std",
    "macro_accuracy",
    "macro_accuracy_std",
)


@dataclass(frozen=True)
class TableLayout:
    """The columns of one kind of table: markdown header, alignment and cells of a row;
    CSV field names and record of a row (mean and std in separate CSV columns)."""

    markdown_header: tuple[str, ...]
    markdown_align: tuple[str, ...]
    markdown_cells: Callable[[Any], tuple[str, ...]]
    csv_fields: tuple[str, ...]
    csv_record: Callable[[Any], dict[str, Any]]


def _accuracy_cells(row: AccuracyRow) -> tuple[str, ...]:
    return (
        row.algorithm,
        _pm(row.accuracy_mean, row.accuracy_std),
        _pm(row.macro_accuracy_mean, row.macro_accuracy_std),
        str(row.n),
    )


def _accuracy_record(row: AccuracyRow) -> dict[str, Any]:
    record = asdict(row)
    record["method"] = record.pop("algorithm")
    return record


def _privacy_cells(row: PrivacyRow) -> tuple[str, ...]:
    return (
        row.client,
        row.center,
        "—" if row.n_train is None else str(row.n_train),
        _general(row.sigma),
        _general(row.delta),
        f"{row.epsilon:.2f}",
        "—" if row.epsilon_per_round is None else _general(row.epsilon_per_round),
        _NOTION_TEXT[row.notion],
        row.source,
    )


# the privacy table's words for each notion (which guarantee an ε is, and over what)
_NOTION_TEXT = {
    SAMPLE_DP: "sample-level (ε, δ)-DP",
    LABEL_LDP: "label-level ε-LDP, r·ε over the r rounds reported (basic composition)",
}


LAYOUTS: dict[type, TableLayout] = {
    AccuracyRow: TableLayout(
        markdown_header=("Method", "Accuracy", "Macro-accuracy", "n"),
        markdown_align=(":--", "--:", "--:", "--:"),
        markdown_cells=_accuracy_cells,
        csv_fields=(
            "method",
            "accuracy_mean",
            "accuracy_std",
            "macro_accuracy_mean",
            "macro_accuracy_std",
            "n",
            "n_seeds",
            "final_round",
        ),
        csv_record=_accuracy_record,
    ),
    PrivacyRow: TableLayout(
        markdown_header=(
            "Client",
            "Centre",
            "n_train",
            "σ",
            "δ",
            "ε",
            "ε per round",
            "Notion",
            "ε from",
        ),
        markdown_align=(":--", ":--", "--:", "--:", "--:", "--:", "--:", ":--", ":--"),
        markdown_cells=_privacy_cells,
        csv_fields=(
            "client",
            "center",
            "n_train",
            "sigma",
            "delta",
            "epsilon",
            "source",
            "n_seeds",
            "notion",
            "epsilon_per_round",
        ),
        csv_record=asdict,
    ),
}


def _layout(rows: Sequence[TableRow]) -> TableLayout:
    kind = type(rows[0])
    if any(type(row) is not kind for row in rows):
        raise TypeError("format_table: rows of one kind only (AccuracyRow or PrivacyRow)")
    return LAYOUTS[kind]


def format_table(rows: Sequence[TableRow]) -> str:
    """The markdown table of accuracy or privacy rows ("" for no rows), newline-terminated.

    Accuracy cells read "0.812 ± 0.034" (3 decimals), ε has 2 decimals.
    """
    if not rows:
        return ""
    layout = _layout(rows)
    lines = [_markdown_line(layout.markdown_header), _markdown_line(layout.markdown_align)]
    lines += [_markdown_line(layout.markdown_cells(row)) for row in rows]
    return "\n".join(lines) + "\n"


def format_csv(rows: Sequence[TableRow]) -> str:
    """CSV of accuracy or privacy rows, mean and std in separate columns ("" for no rows)."""
    if not rows:
        return ""
    layout = _layout(rows)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=layout.csv_fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: _csv_value(value) for key, value in layout.csv_record(row).items()})
    return buffer.getvalue()


def accuracy_note(rows: Sequence[AccuracyRow]) -> str:
    """The line under the accuracy table saying which round and which statistics."""
    finals = sorted({row.final_round for row in rows})
    return (
        f"\nFinal round {', '.join(map(str, finals))}; mean ± population std (ddof=0) "
        "over clients × seeds of the reported model.\n"
    )


def public_pool_note(runs: Iterable[RunResult]) -> str:
    """The sentence saying which public pool PrivateKT's runs used ("" without PrivateKT):
    the paper's share of the clients' training splits, or another centre's whole store."""
    pools = []
    for run in runs:
        if run.algorithm != "PrivateKT":
            continue
        config = run.config
        if config.get("public_pool", "center") == "share":  # runs before the option: center
            share = float(config.get("public_share", 0.2))
            pool = (f"{share:.0%} of each client's training split, held out of its training, "
                    f"labels dropped (the paper's)")  # fmt: skip
        else:
            pool = (f"centre {config.get('public_center')}'s whole store, labels unused "
                    f"(another hospital's data)")  # fmt: skip
        if pool not in pools:
            pools.append(pool)
    return f"\nPrivateKT's public pool: {'; '.join(pools)}.\n" if pools else ""


def other_configurations_markdown(tables: Mapping[str, Sequence[AccuracyRow]]) -> str:
    """Accuracy tables of runs made with other parameters than the report's, one per set
    of parameters, each headed by them: never part of the report's own rows."""
    parts = ["# Runs made with other parameters\n\nNot in accuracy.md: each table holds "
             "runs made with the parameters in its heading (the report's own differ).\n"]
    for label, rows in tables.items():
        parts.append(f"\n## Made with {label}\n\n{format_table(rows)}{accuracy_note(rows)}")
    return "".join(parts)


def dvc_metrics(accuracy: Sequence[AccuracyRow], privacy: Sequence[PrivacyRow]) -> dict[str, Any]:
    """The few numbers experiments are compared by (``dvc exp show``, ``dvc metrics
    diff``): ``{method: {accuracy, macro_accuracy}, "max_epsilon": ε}``, the means of the
    accuracy table and the largest sample-level ε of any client (Joint's pooled data
    excluded when there are clients), and PrivateKT's label-level ε-LDP apart as
    ``max_epsilon_label_ldp``; keys free of dots and spaces. The tables hold the rest."""
    metrics: dict[str, Any] = {
        safe_name(row.algorithm): {
            "accuracy": row.accuracy_mean,
            "macro_accuracy": row.macro_accuracy_mean,
        }
        for row in accuracy
    }
    sample_level = [row for row in privacy if row.notion == SAMPLE_DP]
    clients = [row.epsilon for row in sample_level if row.client != JOINT] or [
        row.epsilon for row in sample_level
    ]
    metrics["max_epsilon"] = max(clients) if clients else None
    label_level = [row.epsilon for row in privacy if row.notion == LABEL_LDP]
    if label_level:  # another notion: never folded into max_epsilon
        metrics["max_epsilon_label_ldp"] = max(label_level)
    return metrics


def summary_line(metrics: dict[str, Any]) -> str:
    """:func:`dvc_metrics` as one line: ``accuracy / macro-accuracy`` per method, the
    largest sample-level ε and, when PrivateKT ran, its label-level ε-LDP apart."""
    methods = ", ".join(
        f"{name} {_number(values['accuracy'])} / {_number(values['macro_accuracy'])}"
        for name, values in metrics.items() if isinstance(values, dict)
    )  # fmt: skip
    line = f"accuracy / macro-accuracy: {methods}; max ε {_number(metrics.get('max_epsilon'))}"
    if metrics.get("max_epsilon_label_ldp") is not None:
        line += f" (sample-level DP), {_number(metrics['max_epsilon_label_ldp'])} (label-level LDP)"
    return line


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def curve_csv(points: Iterable[CurvePoint]) -> str:
    """One method's per-round curve as CSV: :data:`CURVE_FIELDS`, one line per round."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CURVE_FIELDS)
    for p in points:
        cells = (p.accuracy_mean, p.accuracy_std, p.macro_accuracy_mean, p.macro_accuracy_std)
        writer.writerow([p.round, *(_csv_value(c) for c in cells)])
    return buffer.getvalue()


def safe_name(name: str) -> str:
    """``name`` with every character outside [A-Za-z0-9_-] replaced by "_" (DVC keys, files)."""
    return _UNSAFE.sub("_", name)


def _markdown_line(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _pm(mean: float, std: float) -> str:
    return f"{mean:.3f} ± {std:.3f}"


def _general(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def _csv_value(value: Any) -> Any:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value
