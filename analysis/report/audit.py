"""The empirical privacy audit (``results/audit.json``, written by the audit stage,
:mod:`analysis.audit`) as the report's tables: membership inference on the training runs'
kept models, and the one-run ε lower bound of the canary runs beside the accounted ε.

``audit.json`` holds ``{"settings", "notes", "rows", "violations"}``; every row is one
model of one client of one run (:class:`AuditRow`): ``run`` "training" (membership
inference on a normal training run) or "canary" (the run with canaries that the ε lower
bound comes from). From them:

- :func:`membership_table`: per method and evaluated model (first appearance order), over
  its training rows (clients × seeds): the mean MIA AUC with its [min–max] over those
  models, the mean TPR at 1 % and 0.1 % FPR, the mean accounted ε and its notion;
- :func:`canary_rows`: the canary rows as they are, one per method, client and model;
- :func:`audit_violations`: the file's violations, and any a row shows that it does not
  list (a DP model's ε lower bound above its accounted ε: never expected, always a bug);
- :func:`roc_curves`: the mean ROC curve of every method and model, for the figure.

A file that does not read or does not hold that is a
:class:`~analysis.report.load.ReportError` naming it (:func:`read_audit`). Pure, but for
:func:`read_audit`: every other function returns rows or text and writes nothing.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from analysis.report.load import ReportError, accounted_epsilon, describe_validation_error
from proxyfl.results import LABEL_LDP, SAMPLE_DP

TRAINING, CANARY = "training", "canary"
NO_DP = "none"
_NOTIONS = {SAMPLE_DP: "sample-level DP", LABEL_LDP: "label-level LDP"}
_ATTACKS = {"lira_offline": "LiRA offline", "loss": "loss"}


class AuditRow(BaseModel):
    """One row of ``audit.json``: one kept model of one client of one run, attacked."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    method: str
    seed: int
    client: int
    center: int
    model: Literal["private", "shared"]
    evaluated_model: str
    architecture: str
    released: bool
    run: Literal["training", "canary"]
    privacy_notion: Literal["sample_dp", "label_ldp", "none"]
    epsilon_accounted: float | None
    delta: float
    epsilon_lower_bound: float | None = None
    attack: str
    reference_models: int
    loss_attack_auc: float
    mia_auc: float
    mia_auc_ci: tuple[float, float]
    tpr_at_1pct_fpr: float
    tpr_at_1pct_fpr_ci: tuple[float, float]
    tpr_at_0_1pct_fpr: float
    tpr_at_0_1pct_fpr_ci: tuple[float, float]
    n_members: int = Field(ge=0)
    n_non_members: int = Field(ge=0)
    roc_fpr: tuple[float, ...]
    roc_tpr: tuple[float, ...]
    canaries: int | None = None
    canary_guesses: int | None = None
    canary_correct: int | None = None

    @field_validator("loss_attack_auc", "mia_auc", "tpr_at_1pct_fpr", "tpr_at_0_1pct_fpr",
                     mode="before")  # fmt: skip
    @classmethod
    def _undefined_is_nan(cls, value: Any) -> Any:
        """null: undefined (a canary run whose coins put every canary on one side)."""
        return math.nan if value is None else value

    @field_validator("mia_auc_ci", "tpr_at_1pct_fpr_ci", "tpr_at_0_1pct_fpr_ci", mode="before")
    @classmethod
    def _undefined_interval(cls, value: Any) -> Any:
        return (math.nan, math.nan) if value is None else value

    @model_validator(mode="after")
    def _consistent(self) -> AuditRow:
        if len(self.roc_fpr) != len(self.roc_tpr):
            raise ValueError(f"roc_fpr ({len(self.roc_fpr)} values) and roc_tpr "
                             f"({len(self.roc_tpr)}) must be one curve")  # fmt: skip
        if self.run == TRAINING and (not self.roc_fpr or min(self.n_members,
                                                             self.n_non_members) < 1):  # fmt: skip
            raise ValueError("a training row needs members, non-members and a ROC curve")
        if self.run == CANARY and None in (self.canaries, self.canary_guesses,
                                           self.canary_correct):  # fmt: skip
            raise ValueError("a canary row needs canaries, canary_guesses and canary_correct")
        return self


class AuditDocument(BaseModel):
    """``audit.json``: the audit's options, what each kind of row means, the rows, and
    every DP model whose ε lower bound exceeds its accounted ε."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    settings: dict[str, Any] = Field(default_factory=dict)
    notes: dict[str, str] = Field(default_factory=dict)
    rows: tuple[AuditRow, ...]
    violations: tuple[str, ...] = ()


@dataclass(frozen=True)
class Audit:
    """An audit file read: where from, and what it holds."""

    path: Path
    document: AuditDocument
    # why it no longer describes the runs it read (analysis.audit.freshness), if it does not
    stale: str | None = None

    @property
    def rows(self) -> tuple[AuditRow, ...]:
        return self.document.rows

    @property
    def notes(self) -> Mapping[str, str]:
        return self.document.notes

    @property
    def settings(self) -> Mapping[str, Any]:
        return self.document.settings


def read_audit(path: Path) -> Audit:
    """The audit at ``path``; a :class:`ReportError` naming the file and what is wrong
    when it is not JSON or not an audit."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ReportError(f"{path}: cannot read the audit ({error})") from None
    except json.JSONDecodeError as error:
        raise ReportError(f"{path}: malformed JSON ({error})") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path}: not an audit (expected a JSON object with 'rows')")
    try:
        document = AuditDocument.model_validate(data)
    except ValidationError as error:
        raise ReportError(f"{path}: not an audit: {describe_validation_error(error)}") from None
    return Audit(path, document)


# --- membership inference ------------------------------------------------------------


@dataclass(frozen=True)
class MembershipRow:
    """One method's model of one kind under membership inference, over its training rows
    (clients × seeds): mean MIA AUC and its [min–max] over those models, mean TPRs."""

    method: str
    evaluated_model: str
    released: str  # yes | no | mixed
    notion: str  # e.g. "sample-level DP, ε = 3.56"
    epsilon_accounted: float | None  # mean over the models that have one
    attack: str
    mia_auc: float
    mia_auc_min: float
    mia_auc_max: float
    tpr_at_1pct_fpr: float
    tpr_at_0_1pct_fpr: float
    n_members: str  # per client, e.g. "409", or "380–409" where they differ
    n_non_members: str
    n_models: int


def grouped(rows: Iterable[AuditRow]) -> list[list[AuditRow]]:
    """The rows by method (first appearance) and, within one, by evaluated model (first
    appearance)."""
    groups: dict[str, dict[str, list[AuditRow]]] = {}
    for row in rows:
        groups.setdefault(row.method, {}).setdefault(row.evaluated_model, []).append(row)
    return [group for models in groups.values() for group in models.values()]


def membership_table(rows: Sequence[AuditRow]) -> list[MembershipRow]:
    """One :class:`MembershipRow` per method and evaluated model of the training rows."""
    return [_membership_row(group) for group in grouped(r for r in rows if r.run == TRAINING)]


def _membership_row(group: Sequence[AuditRow]) -> MembershipRow:
    aucs = [row.mia_auc for row in group]
    epsilons = [_accounted(row) for row in group]
    known = [value for value in epsilons if value is not None]
    epsilon = (math.inf if math.inf in known else float(np.mean(known))) if known else None
    return MembershipRow(
        method=group[0].method,
        evaluated_model=group[0].evaluated_model,
        released=_yes_no({row.released for row in group}),
        notion="; ".join(
            dict.fromkeys(notion_text(row.privacy_notion, epsilon, row.released) for row in group)
        ),
        epsilon_accounted=epsilon,
        attack="; ".join(dict.fromkeys(attack_text(row) for row in group)),
        mia_auc=float(np.mean(aucs)),
        mia_auc_min=min(aucs),
        mia_auc_max=max(aucs),
        tpr_at_1pct_fpr=float(np.mean([row.tpr_at_1pct_fpr for row in group])),
        tpr_at_0_1pct_fpr=float(np.mean([row.tpr_at_0_1pct_fpr for row in group])),
        n_members=_range(row.n_members for row in group),
        n_non_members=_range(row.n_non_members for row in group),
        n_models=len(group),
    )


def _accounted(row: AuditRow) -> float | None:
    """The row's ε (:func:`~analysis.report.load.accounted_epsilon`)."""
    return accounted_epsilon(row.epsilon_accounted, row.privacy_notion)


def notion_text(notion: str, epsilon: float | None, released: bool) -> str:
    """What protects a model: "sample-level DP, ε = 3.56", "label-level LDP, ε = 25.00",
    "none (never leaves)" for a private model, "none (no DP)" for a released one."""
    if notion == NO_DP:
        return "none (no DP)" if released else "none (never leaves)"
    name = _NOTIONS.get(notion, notion)
    if epsilon is None:
        return f"{name}, ε not recorded"
    return f"{name}, ε = {_accounted_epsilon(epsilon)}"


def attack_text(row: AuditRow) -> str:
    """The attack in words: "LiRA offline (4 reference models)" or "loss"."""
    name = _ATTACKS.get(row.attack, row.attack)
    if row.attack == "lira_offline":
        return f"{name} ({row.reference_models} reference models)"
    return name


MEMBERSHIP_HEADER = ("Method", "Model", "Released", "Notion / ε accounted", "Attack",
                     "MIA AUC [min–max]", "TPR @ 1 % FPR", "TPR @ 0.1 % FPR",
                     "Members / non-members")  # fmt: skip
MEMBERSHIP_ALIGN = (":--", ":--", ":--", ":--", ":--", "--:", "--:", "--:", "--:")


def membership_cells(row: MembershipRow) -> tuple[str, ...]:
    """A row of the membership-inference table, as text."""
    return (
        row.method,
        row.evaluated_model,
        row.released,
        row.notion,
        row.attack,
        f"{_fixed(row.mia_auc)} [{_fixed(row.mia_auc_min)}–{_fixed(row.mia_auc_max)}]",
        _fixed(row.tpr_at_1pct_fpr),
        _fixed(row.tpr_at_0_1pct_fpr),
        f"{row.n_members}/{row.n_non_members}",
    )


def membership_note() -> str:
    """The line under the membership-inference table."""
    return (
        "Membership inference on each run's kept models: members are the client's training "
        "patches, non-members its centre's held-out test patches; an AUC of 0.5 and a TPR "
        "equal to the FPR are chance. Mean over clients × seeds, [min–max] over those "
        "models; members / non-members per client. Released: the model leaves its hospital."
    )


# --- one-run ε lower bound -----------------------------------------------------------


def canary_rows(rows: Sequence[AuditRow]) -> list[AuditRow]:
    """The canary rows, one per method, client and model, in the file's order."""
    return [row for row in rows if row.run == CANARY]


def confidence(settings: Mapping[str, Any]) -> float | None:
    """The ε lower bound's confidence (``settings.canary.confidence``), if the file says."""
    canary = settings.get("canary")
    value = canary.get("confidence") if isinstance(canary, Mapping) else None
    return float(value) if isinstance(value, int | float) else None


def canary_header(settings: Mapping[str, Any]) -> tuple[str, ...]:
    level = confidence(settings)
    bound = "ε lower bound" if level is None else f"ε lower bound ({100 * level:g} %)"
    return ("Method", "Client", "Model", "Released", "ε accounted", bound, "Canaries m",
            "Guesses r", "Correct v", "Canary AUC")  # fmt: skip


CANARY_ALIGN = (":--", "--:", ":--", ":--", ":--", "--:", "--:", "--:", "--:", "--:")


def canary_cells(row: AuditRow) -> tuple[str, ...]:
    """A row of the ε lower bound table, as text."""
    if row.privacy_notion == NO_DP:
        accounted = "none (no DP)"
    elif (epsilon := _accounted(row)) is None:
        accounted = "not recorded"
    else:
        accounted = _accounted_epsilon(epsilon)
        if row.privacy_notion != SAMPLE_DP:  # another notion: not what canaries test
            accounted += f" ({_NOTIONS.get(row.privacy_notion, row.privacy_notion)})"
    return (
        row.method,
        str(row.client),
        row.evaluated_model,
        _yes_no({row.released}),
        accounted,
        "—" if row.epsilon_lower_bound is None else _epsilon(row.epsilon_lower_bound),
        str(row.canaries),
        str(row.canary_guesses),
        str(row.canary_correct),
        _fixed(row.mia_auc),
    )


def canary_note(settings: Mapping[str, Any]) -> str:
    """The line under the ε lower bound table."""
    level = confidence(settings)
    at = "" if level is None else f" at {100 * level:g} % confidence"
    return (
        "One-run audit (Steinke, Nasr and Jagielski 2023) of a separate canary run per method: "
        "each of the m canaries is in the client's training data with probability ½; the "
        "attack guesses r of them (the highest-scoring IN, the lowest OUT) and gets v right, "
        f"which bounds the ε the training can have from below{at}. A DP model's lower bound "
        "must not exceed its accounted ε; a model without DP has no ε to keep."
    )


def audit_violations(audit: Audit) -> list[str]:
    """The violations the file lists, then any row's the file does not: a sample-level DP
    model whose ε lower bound exceeds its accounted ε."""
    found = list(audit.document.violations)
    for row in audit.rows:
        bound, accounted = row.epsilon_lower_bound, row.epsilon_accounted
        if (row.privacy_notion == SAMPLE_DP and bound is not None and accounted is not None
                and math.isfinite(accounted) and bound > accounted):  # fmt: skip
            line = (f"{row.method} seed {row.seed} client {row.client} {row.evaluated_model}: "
                    f"ε lower bound {bound:.3f} > accounted ε {accounted:.3f}")  # fmt: skip
            if not any(line.partition(":")[0] == known.partition(":")[0] for known in found):
                found.append(line)
    return found


NO_VIOLATION = "no violation: every DP model's lower bound is below its accounted ε"


def check_line(audit: Audit) -> str:
    """Whether every DP model's ε lower bound is at or below its accounted ε."""
    violations = audit_violations(audit)
    if violations:
        return ("VIOLATION: an ε lower bound exceeds its accounted ε, so the training does "
                "not keep its privacy promise (a bug): " + "; ".join(violations) + ".")  # fmt: skip
    if not canary_rows(audit.rows):
        return "No canary run audited: no ε lower bound to check."
    return f"Check: {NO_VIOLATION}."


# --- the audit's settings and notes ----------------------------------------------------


def settings_line(settings: Mapping[str, Any]) -> str:
    """The audit's options in one sentence ("" when the file states none)."""
    parts = []
    references = settings.get("reference_models")
    if isinstance(references, int):
        parts.append(f"LiRA offline with {references} reference models per client and "
                     f"architecture" if references else "the loss attack only")  # fmt: skip
    bootstrap = settings.get("bootstrap")
    if isinstance(bootstrap, int):
        parts.append(f"{bootstrap} bootstrap resamples for the 95 % intervals")
    canary = settings.get("canary")
    if isinstance(canary, Mapping):
        methods = canary.get("algorithms")
        if isinstance(methods, list) and methods:
            run = f"canary runs of {', '.join(map(str, methods))}"
            if isinstance(canary.get("count"), int):
                run += f", {canary['count']} canaries per client"
            if isinstance(canary.get("kind"), str):
                run += f" ({canary['kind']} canaries)"
            if isinstance(canary.get("guesses"), list):
                run += f", k ∈ {{{', '.join(map(str, canary['guesses']))}}}"
            parts.append(run)
        elif isinstance(methods, list):
            parts.append("no canary run")
    return f"Audit settings: {'; '.join(parts)}." if parts else ""


_NOTE_LABELS = {
    TRAINING: "Training rows",
    CANARY: "Canary rows",
    "epsilon_lower_bound": "ε lower bound",
    "privacy_notion": "Privacy notion",
}


# what a stale audit's reader is told to do
RERUN_AUDIT = "its rows are of the runs as they were; run the audit again (`python -m flows.audit`)"


def audit_notes(audit: Audit) -> list[tuple[str, str]]:
    """The file's notes, each with a label: (label, text); first, when the audit is
    stale, why and what to do."""
    stale = [("Stale", f"{audit.stale}: {RERUN_AUDIT}")] if audit.stale else []
    return stale + [(_NOTE_LABELS.get(key, key), text) for key, text in audit.notes.items()]


# --- files -----------------------------------------------------------------------------


def audit_markdown(audit: Audit) -> str:
    """``tables/audit.md``: the membership-inference table and the ε lower bound table,
    each under its heading with a line saying what it is, the check and the notes."""
    membership = membership_table(audit.rows)
    canaries = canary_rows(audit.rows)
    settings = settings_line(audit.settings)
    parts = ["# Empirical privacy audit\n"]
    if audit.stale:
        parts.append(f"\n**Stale**: {audit.stale}: {RERUN_AUDIT}.\n")
    if settings:
        parts.append(f"\n{settings}\n")
    parts.append(f"\n## Membership inference (training runs)\n\n{membership_note()}\n\n")
    parts.append(_markdown(MEMBERSHIP_HEADER, MEMBERSHIP_ALIGN,
                           [membership_cells(row) for row in membership])
                 if membership else "No training run audited.\n")  # fmt: skip
    parts.append(f"\n## One-run ε lower bound (canary runs)\n\n{canary_note(audit.settings)}\n\n")
    parts.append(_markdown(canary_header(audit.settings), CANARY_ALIGN,
                           [canary_cells(row) for row in canaries])
                 if canaries else "No canary run audited.\n")  # fmt: skip
    parts.append(f"\n{check_line(audit)}\n")
    if notes := audit_notes(audit):
        parts.append("\n" + "".join(f"- {label}: {text}\n" for label, text in notes))
    return "".join(parts)


AUDIT_CSV_FIELDS: tuple[str, ...] = (
    "method", "seed", "client", "center", "model", "evaluated_model", "architecture",
    "released", "run", "privacy_notion", "epsilon_accounted", "delta", "epsilon_lower_bound",
    "attack", "reference_models", "loss_attack_auc", "mia_auc", "mia_auc_low", "mia_auc_high",
    "tpr_at_1pct_fpr", "tpr_at_1pct_fpr_low", "tpr_at_1pct_fpr_high", "tpr_at_0_1pct_fpr",
    "tpr_at_0_1pct_fpr_low", "tpr_at_0_1pct_fpr_high", "n_members", "n_non_members",
    "canaries", "canary_guesses", "canary_correct",
)  # fmt: skip


def audit_csv(audit: Audit) -> str:
    """``tables/audit.csv``: every row of the audit, its scalar fields (each interval as
    ``_low`` and ``_high``; no ROC curve); a missing value is empty."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=AUDIT_CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in audit.rows:
        record = row.model_dump(exclude={"roc_fpr", "roc_tpr"})
        for name in ("mia_auc", "tpr_at_1pct_fpr", "tpr_at_0_1pct_fpr"):
            record[f"{name}_low"], record[f"{name}_high"] = record.pop(f"{name}_ci")
        writer.writerow({key: _csv_value(record[key]) for key in AUDIT_CSV_FIELDS})
    return buffer.getvalue()


# --- the ROC figure's curves -----------------------------------------------------------


@dataclass(frozen=True)
class RocCurve:
    """The mean ROC curve of one method's model over its training rows (clients × seeds):
    the mean TPR at each FPR of the rows' common grid."""

    method: str
    evaluated_model: str
    released: bool
    fpr: tuple[float, ...]
    tpr: tuple[float, ...]
    n_models: int

    @property
    def label(self) -> str:
        return f"{self.method}: {self.evaluated_model}"


def roc_curves(rows: Sequence[AuditRow]) -> list[RocCurve]:
    """One :class:`RocCurve` per method and evaluated model of the training rows (the
    order of :func:`membership_table`); a row whose FPR grid differs from the group's
    first is interpolated onto it."""
    curves = []
    for group in grouped(row for row in rows if row.run == TRAINING):
        grid = np.asarray(group[0].roc_fpr, dtype=np.float64)
        tprs = [np.asarray(row.roc_tpr, dtype=np.float64) if row.roc_fpr == group[0].roc_fpr
                else np.interp(grid, row.roc_fpr, row.roc_tpr) for row in group]  # fmt: skip
        mean = np.mean(np.stack(tprs), axis=0)
        curves.append(RocCurve(group[0].method, group[0].evaluated_model,
                               all(row.released for row in group), tuple(map(float, grid)),
                               tuple(map(float, mean)), len(group)))  # fmt: skip
    return curves


# --- formatting ------------------------------------------------------------------------


def _markdown(header: Sequence[str], align: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [header, align, *rows]
    return "".join("| " + " | ".join(cells) + " |\n" for cells in lines)


def _yes_no(values: set[bool]) -> str:
    return "mixed" if len(values) > 1 else ("yes" if values.pop() else "no")


def _range(values: Iterable[int]) -> str:
    numbers = sorted(set(values))
    return str(numbers[0]) if len(numbers) == 1 else f"{numbers[0]}–{numbers[-1]}"


def _fixed(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.3f}"


def _epsilon(value: float) -> str:
    if math.isnan(value):
        return "—"
    return "∞" if math.isinf(value) else f"{value:.2f}"


def _accounted_epsilon(value: float) -> str:
    """An accounted ε; an infinite one says why (σ = 0: no noise, no guarantee)."""
    return "∞ (σ = 0: no DP)" if math.isinf(value) else _epsilon(value)


def _csv_value(value: Any) -> Any:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value
