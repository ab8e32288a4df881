"""How the report's numbers read: markdown and CSV tables, DVC's metrics.json, curve CSVs.

Every function here returns text or a JSON-able object and writes nothing; the writer
(:mod:`analysis.report.write`) puts them in files. Accuracy cells read "0.812 ± 0.034"
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

from analysis.report.clinical import MajorityClass
from analysis.report.context import ConfigurationRow, DataSource
from analysis.report.load import JOINT, RunResult
from analysis.report.predictions import ClinicalRow, PerCentreRow
from analysis.report.stats import AccuracyRow, CurvePoint, PrivacyRow
from proxyfl.results import LABEL_LDP, SAMPLE_DP

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

TableRow = AccuracyRow | PrivacyRow | ClinicalRow | ConfigurationRow

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
    if row.baseline:  # a constant answer: no model, no spread, no sample
        return (row.algorithm, row.evaluated_model, _number(row.accuracy_mean),
                _number(row.macro_accuracy_mean), "—")  # fmt: skip
    return (
        row.algorithm,
        row.evaluated_model or "—",
        _pm(row.accuracy_mean, row.accuracy_std, row.n),
        _pm(row.macro_accuracy_mean, row.macro_accuracy_std, row.n),
        str(row.n),
    )


def _accuracy_record(row: AccuracyRow) -> dict[str, Any]:
    record = asdict(row)
    record["method"] = record.pop("algorithm")
    if record.pop("baseline"):
        record.update(evaluated_model="", n=None, n_seeds=None, final_round=None)
    return record


def _clinical_cells(row: ClinicalRow) -> tuple[str, ...]:
    if row.n_models == 0:
        return (row.algorithm, row.evaluated_model or "—", NO_PREDICTIONS, "—", "—", "0",
                "—", "—")  # fmt: skip
    return (
        row.algorithm,
        row.evaluated_model,
        _interval(row.sensitivity, row.sensitivity_low, row.sensitivity_high),
        _interval(row.specificity, row.specificity_low, row.specificity_high),
        _interval(row.auc, row.auc_low, row.auc_high),
        str(row.n_models),
        str(row.n_patients),
        str(row.n_patches),
    )


def _clinical_record(row: ClinicalRow) -> dict[str, Any]:
    record = asdict(row)
    record["method"] = record.pop("algorithm")
    if row.n_models == 0:
        record.update(n_patients=None, n_patches=None, n_resamples=None,
                      undefined_resamples=None)  # fmt: skip
    return record


def _configuration_cells(row: ConfigurationRow) -> tuple[str, ...]:
    return (row.setting, row.value, row.used_by)


def _privacy_cells(row: PrivacyRow) -> tuple[str, ...]:
    return (
        row.client,
        row.center,
        "—" if row.n_train is None else str(row.n_train),
        _general(row.sigma),
        _general(row.delta),
        _epsilon_cell(row.epsilon),
        "—" if row.epsilon_per_round is None else _general(row.epsilon_per_round),
        _NOTION_TEXT[row.notion],
        row.source,
    )


# the privacy table's words for each notion (which guarantee an ε is, and over what)
_NOTION_TEXT = {
    SAMPLE_DP: "sample-level (ε, δ)-DP",
    LABEL_LDP: "label-level ε-LDP, r·ε over the r rounds reported (basic composition)",
}


NO_PREDICTIONS = "no predictions recorded"

LAYOUTS: dict[type, TableLayout] = {
    AccuracyRow: TableLayout(
        markdown_header=("Method", "Model", "Accuracy", "Macro-accuracy", "n"),
        markdown_align=(":--", ":--", "--:", "--:", "--:"),
        markdown_cells=_accuracy_cells,
        csv_fields=(
            "method",
            "evaluated_model",
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
    ClinicalRow: TableLayout(
        markdown_header=("Method", "Model", "Sensitivity [95 % CI]", "Specificity [95 % CI]",
                         "AUC [95 % CI]", "Models", "Test patients", "Test patches"),
        markdown_align=(":--", ":--", "--:", "--:", "--:", "--:", "--:", "--:"),
        markdown_cells=_clinical_cells,
        csv_fields=("method", "evaluated_model", "n_models", "sensitivity", "sensitivity_low",
                    "sensitivity_high", "specificity", "specificity_low", "specificity_high",
                    "auc", "auc_low", "auc_high", "n_patients", "n_patches", "n_resamples",
                    "undefined_resamples"),
        csv_record=_clinical_record,
    ),
    ConfigurationRow: TableLayout(
        markdown_header=("Setting", "Value", "Used by"),
        markdown_align=(":--", ":--", ":--"),
        markdown_cells=_configuration_cells,
        csv_fields=("setting", "value", "used_by"),
        csv_record=asdict,
    ),
}  # fmt: skip


def _layout(rows: Sequence[TableRow]) -> TableLayout:
    kind = type(rows[0])
    if any(type(row) is not kind for row in rows):
        kinds = ", ".join(t.__name__ for t in LAYOUTS)
        raise TypeError(f"format_table: rows of one kind only ({kinds})")
    return LAYOUTS[kind]


def format_table(rows: Sequence[TableRow]) -> str:
    """The markdown table of rows of one kind of :data:`LAYOUTS` ("" for no rows),
    newline-terminated.

    Accuracy cells read "0.812 ± 0.034" (3 decimals), ε has 2 decimals.
    """
    if not rows:
        return ""
    layout = _layout(rows)
    lines = [_markdown_line(layout.markdown_header), _markdown_line(layout.markdown_align)]
    lines += [_markdown_line(layout.markdown_cells(row)) for row in rows]
    return "\n".join(lines) + "\n"


def format_csv(rows: Sequence[TableRow]) -> str:
    """CSV of rows of one kind of :data:`LAYOUTS`, mean and std (and interval ends) in
    separate columns ("" for no rows)."""
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
    finals = sorted({row.final_round for row in rows if not row.baseline})
    return (
        f"\nFinal round {', '.join(map(str, finals))}; mean ± population std (ddof=0) "
        "over the reported models (Model: private, central, local ...): one a client and "
        "seed, one a seed for a central model, which every client holds; n counts them.\n"
    )


def majority_note(majority: MajorityClass | None, source: str) -> str:
    """The sentence saying what the majority-class row is and where its rate comes from
    ("" when no test set's labels are known)."""
    if majority is None:
        return ("\nMajority class: not known (no predictions recorded and no centre report "
                "with the clients' test counts).\n")  # fmt: skip
    return (
        f"\nMajority class: {majority.rate:.1%} of the {majority.n_patches} merged test "
        f"patches are {majority.name} ({source}); a model that always answers "
        f"{majority.name} scores {majority.rate:.3f} accuracy and {majority.macro_accuracy:.3f} "
        "macro-accuracy.\n"
    )


def data_note(source: DataSource) -> str:
    """The data line under a table: synthetic or real slides, and which root."""
    return f"\n{source.sentence()}\n"


def per_centre_cells(
    rows: Sequence[PerCentreRow],
) -> tuple[tuple[str, ...], tuple[str, ...], list[tuple[str, ...]]]:
    """Header, markdown alignment and cells of the per-centre table: one row per method,
    one column per test centre ("0.812 ± 0.034", "—" where none), then the models."""
    centres = sorted({row.center for row in rows if row.center is not None})
    patches = {c: max(r.n_patches for r in rows if r.center == c) for c in centres}
    header = ("Method", "Model", *(f"Centre {c} ({patches[c]} patches)" for c in centres),
              "Models")  # fmt: skip
    align = (":--", ":--", *("--:" for _ in centres), "--:")
    table: list[tuple[str, ...]] = []
    for algorithm in dict.fromkeys(row.algorithm for row in rows):
        own = [row for row in rows if row.algorithm == algorithm]
        by_centre = {row.center: row for row in own}
        if own[0].center is None:
            cells = [NO_PREDICTIONS, *("—" for _ in centres[1:])] if centres else []
            table.append((algorithm, own[0].evaluated_model or "—", *cells, "0"))
            continue
        cells = [_pm(by_centre[c].accuracy_mean, by_centre[c].accuracy_std,
                     by_centre[c].n_models)
                 if c in by_centre and not math.isnan(by_centre[c].accuracy_mean) else "—"
                 for c in centres]  # fmt: skip
        models = max(row.n_models for row in own)
        table.append((algorithm, own[0].evaluated_model, *cells, str(models)))
    return header, align, table


def per_centre_markdown(rows: Sequence[PerCentreRow], note: str) -> str:
    """per_centre.md: the table of :func:`per_centre_cells` and ``note`` under it; without
    any predictions, only the note."""
    if not any(row.center is not None for row in rows):
        return ("No predictions recorded: no per-centre accuracy (it needs the runs' per-patch "
                "predictions, RUN_DIR/predictions/client_C.csv, which runs made before they "
                "were recorded lack).\n" + note)  # fmt: skip
    header, align, cells = per_centre_cells(rows)
    lines = [_markdown_line(header), _markdown_line(align), *map(_markdown_line, cells)]
    return "\n".join(lines) + "\n" + note


PER_CENTRE_FIELDS = ("method", "evaluated_model", "center", "accuracy_mean", "accuracy_std",
                     "n_models", "n_patches")  # fmt: skip


def per_centre_csv(rows: Sequence[PerCentreRow]) -> str:
    """per_centre.csv: one line per method and centre (a method without predictions: one
    line, centre and values empty)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=PER_CENTRE_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        record = asdict(row)
        record["method"] = record.pop("algorithm")
        if row.center is None:
            record.update(n_models=None, n_patches=None)
        writer.writerow({key: _csv_value(record[key]) for key in PER_CENTRE_FIELDS})
    return buffer.getvalue()


def per_centre_note(missing: Sequence[str]) -> str:
    """What the per-centre table holds, and the methods without predictions."""
    note = (
        "\nAccuracy of each method's reported model on each centre's test patches (a patch "
        "is called tumour when the model's probability of tumour exceeds 0.5), mean ± "
        "population std (ddof=0) over its models (clients × seeds; seeds for a central "
        "model, which every client holds). Every client is tested on every "
        "centre's test split: only its own centre's is from the hospital it trained on.\n"
    )
    return note + _missing_note(missing)


def clinical_note(
    rows: Sequence[ClinicalRow],
    missing: Sequence[str],
    n_resamples: int,
    seed: int,
    level: float,
) -> str:
    """How the clinical table was computed: the measures, the patient bootstrap, how many
    test patients it rests on (and, when they are few, that the intervals are wide and
    rough), the resamples left out and the methods without predictions."""
    measured = [row for row in rows if row.n_models > 0]
    if not measured:
        return (
            "\nNo predictions recorded: sensitivity, specificity and AUC need the runs' "
            "per-patch predictions (RUN_DIR/predictions/client_C.csv), which runs made "
            "before they were recorded lack.\n"
        ) + _missing_note(missing)
    patients = _range(row.n_patients for row in measured)
    patches = _range(row.n_patches for row in measured)
    fewest = min(row.n_patients for row in measured)
    percent = f"{100 * level:g} %"
    tails = f"{100 * (1 - level) / 2:g}th and {100 - 100 * (1 - level) / 2:g}th"
    note = (
        "\nTumour is the positive class; a patch is called tumour when the model's probability "
        "of tumour exceeds 0.5. Sensitivity = TP / (TP + FN), specificity = TN / (TN + FP), "
        "AUC = the probability that a random tumour patch scores above a random healthy one "
        "(Mann–Whitney, ties count ½). A method's value is the mean over its reported models "
        f"(clients × seeds; seeds for a central model). {percent} intervals: percentile "
        f"bootstrap over the {patients} test "
        f"patients ({patches} test patches), the independent units (a patient's patches are "
        f"not): {n_resamples} resamples of the patients with replacement "
        f"(numpy default_rng({seed})), the same resamples for every model of a method, the "
        f"method's value recomputed on each; the {tails} percentiles.\n"
    )
    if fewest < FEW_PATIENTS:
        note += (
            f"\nOnly {fewest} test patient{'s' if fewest != 1 else ''}: these intervals are "
            f"wide, and with so few patients they tend to be too narrow rather than too wide "
            f"(a bootstrap can only recombine the {fewest} patients there are): read them as "
            "a rough guide, not as evidence that one method beats another.\n"
        )
    undefined = max(row.undefined_resamples for row in measured)
    if undefined:
        note += (f"\nIn up to {undefined} of the {n_resamples} resamples a measure was "
                 "undefined (no tumour or no healthy patch drawn); they are left out of its "
                 "percentiles.\n")  # fmt: skip
    return note + _missing_note(missing)


FEW_PATIENTS = 30  # below this many test patients the page says the intervals are rough


def _missing_note(missing: Sequence[str]) -> str:
    if not missing:
        return ""
    return (
        f"\nNo predictions recorded for: {', '.join(missing)} (runs made before per-patch "
        "predictions were recorded, or files missing): a method without any has empty "
        "cells, one with some is computed from the models that have them (Models).\n"
    )


def _range(values: Iterable[int]) -> str:
    numbers = sorted(set(values))
    return str(numbers[0]) if len(numbers) == 1 else f"{numbers[0]}–{numbers[-1]}"


def configuration_note() -> str:
    """Where the configuration table's values come from."""
    return ("\nFrom run.json's config of the runs reported (the keys of train.options in "
            "params.yaml); data and patches from the centre reports beside the stores. Used by: "
            "the methods a setting applies to.\n")  # fmt: skip


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
    parts = [
        "# Runs made with other parameters\n\nNot in accuracy.md: each table holds "
        "runs made with the parameters in its heading (the report's own differ).\n"
    ]
    for label, rows in tables.items():
        parts.append(f"\n## Made with {label}\n\n{format_table(rows)}{accuracy_note(rows)}")
    return "".join(parts)


MAJORITY_KEY = "majority_class"
"""metrics.json's entry of the majority-class baseline (not a method)."""


def dvc_metrics(
    accuracy: Sequence[AccuracyRow],
    privacy: Sequence[PrivacyRow],
    clinical: Sequence[ClinicalRow] = (),
) -> dict[str, Any]:
    """The few numbers experiments are compared by (``dvc exp show``, ``dvc metrics
    diff``): ``{method: {accuracy, macro_accuracy}, "max_epsilon": ε}``, the means of the
    accuracy table and the largest sample-level ε of any client (Joint's pooled data
    excluded when there are clients), and PrivateKT's label-level ε-LDP apart as
    ``max_epsilon_label_ldp``; keys free of dots and spaces. A method with predictions
    adds its sensitivity, specificity and auc (the clinical table's values) to its entry.
    Baseline rows (the majority class) are not methods: the score every method must beat,
    under ``majority_class`` (:data:`MAJORITY_KEY`). The tables hold the rest."""
    metrics: dict[str, Any] = {
        safe_name(row.algorithm): {
            "accuracy": row.accuracy_mean,
            "macro_accuracy": row.macro_accuracy_mean,
        }
        for row in accuracy
        if not row.baseline
    }
    for row in accuracy:
        if row.baseline:
            metrics[MAJORITY_KEY] = {"accuracy": row.accuracy_mean,
                                     "macro_accuracy": row.macro_accuracy_mean}  # fmt: skip
    for row in clinical:
        if row.n_models > 0 and safe_name(row.algorithm) in metrics:
            metrics[safe_name(row.algorithm)].update(
                sensitivity=row.sensitivity, specificity=row.specificity, auc=row.auc
            )
    sample_level = [row for row in privacy if row.notion == SAMPLE_DP]
    clients = [row.epsilon for row in sample_level if row.client != JOINT] or [
        row.epsilon for row in sample_level
    ]
    largest = max(clients) if clients else None
    # strict JSON has no infinity: null, and a flag that says it is one (σ = 0: no DP)
    metrics["max_epsilon"] = None if largest is not None and math.isinf(largest) else largest
    if largest is not None and math.isinf(largest):
        metrics["max_epsilon_infinite"] = True
    label_level = [row.epsilon for row in privacy if row.notion == LABEL_LDP]
    if label_level:  # another notion: never folded into max_epsilon
        metrics["max_epsilon_label_ldp"] = max(label_level)
    return metrics


def summary_line(metrics: dict[str, Any]) -> str:
    """:func:`dvc_metrics` as one line: ``accuracy / macro-accuracy`` per method, the
    largest sample-level ε and, when PrivateKT ran, its label-level ε-LDP apart."""
    methods = ", ".join(
        f"{name} {_number(values['accuracy'])} / {_number(values['macro_accuracy'])}"
        for name, values in metrics.items() if isinstance(values, dict) and name != MAJORITY_KEY
    )  # fmt: skip
    largest = NO_DP if metrics.get("max_epsilon_infinite") else _number(metrics.get("max_epsilon"))
    line = f"accuracy / macro-accuracy: {methods}; max ε {largest}"
    if metrics.get("max_epsilon_label_ldp") is not None:
        line += f" (sample-level DP), {_number(metrics['max_epsilon_label_ldp'])} (label-level LDP)"
    return line


NO_DP = "∞ (σ = 0: no DP)"


def _epsilon_cell(epsilon: float) -> str:
    """ε to two decimals; an infinite one says why (no noise: no guarantee)."""
    return NO_DP if math.isinf(epsilon) else f"{epsilon:.2f}"


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


def _pm(mean: float, std: float, n: int) -> str:
    """``0.812 ± 0.031``; the mean alone for one model (no spread to show)."""
    return f"{mean:.3f}" if n == 1 else f"{mean:.3f} ± {std:.3f}"


def _interval(value: float, low: float, high: float) -> str:
    """``0.812 [0.700, 0.900]``; "—" for an undefined value or interval."""
    if math.isnan(value):
        return "—"
    if math.isnan(low) or math.isnan(high):
        return f"{value:.3f} [—]"
    return f"{value:.3f} [{low:.3f}, {high:.3f}]"


def _general(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def _csv_value(value: Any) -> Any:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value
