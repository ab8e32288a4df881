"""How well a method stages patients: node classes, slide-level detection and the pN stage,
each with a bootstrap interval over patients.

Each test slide is one node: its true class ``t`` and the class ``p`` its tumour map gives
(:mod:`wsi.lesions`), both indices into :data:`wsi.nodes.NODE_LABELS`, and its *slide
score*, the largest probability of tumour on its map. Each test patient has its true pN
stage and the stage of its predicted node classes (:func:`wsi.nodes.patient_stage`),
indices into :data:`wsi.nodes.PATIENT_STAGES`. With weights w (1 as the test set is; a
bootstrap resample's multiplicities):

- **node accuracy** = Σ w_i [t_i = p_i] / Σ w_i over slides;
- **slide AUC** of "any tumour" (class other than negative) against the slide score: the
  Mann-Whitney AUC of :func:`analysis.report.clinical.auc`;
- **quadratic weighted kappa** of the patients' stages, the Camelyon-17 challenge's score
  (Bandi et al. 2019, §III-C; scikit-learn's ``cohen_kappa_score(weights="quadratic")``
  for unit weights): with the K x K weighted confusion matrix O (rows true, columns
  predicted), its marginals' outer product E = O·1 1ᵀO / Σ O and the penalty
  W_ij = (i - j)², κ = 1 - Σ W∘O / Σ W∘E; undefined (NaN) when Σ W∘E = 0 (every patient
  in one stage and every prediction the same).

The **stage confusion** counts the test patients by true stage (rows) and predicted stage
(columns), both in :data:`~wsi.nodes.PATIENT_STAGES` order: κ's ``O`` with unit weights.

The bootstrap resamples patients, as :mod:`analysis.report.clinical`'s does: a patient's
slides are in or out together, each weighing the number of times the patient was drawn;
95 % percentile intervals, from ``default_rng(seed)``. A test set of a few patients (the
demo's eight) gives intervals that say mostly that it is small.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from analysis.report.clinical import (
    BOOTSTRAP_SEED,
    LEVEL,
    N_RESAMPLES,
    Estimate,
    auc,
    percentile_interval,
    resample_counts,
)
from wsi.nodes import NODE_LABELS, PATIENT_STAGES, patient_stage

SUMMARY_FORMAT = 2
"""The format of ``results/staging.json`` (2: a threshold per test patient, the stage
confusion, the wrong calls per slide)."""
STAGING_MEASURES: tuple[str, ...] = ("kappa", "node_accuracy", "slide_auc")
MEASURE_TITLES = {"kappa": "pN-stage κ (quadratic)", "node_accuracy": "node accuracy",
                  "slide_auc": "slide AUC (any tumour)"}  # fmt: skip


@dataclass(frozen=True)
class NodeCall:
    """One test slide: its patient, true and predicted node class, and slide score."""

    patient: str
    slide_id: str
    truth: str
    predicted: str
    score: float  # the largest probability of tumour on its map (0: no tissue predicted)
    extent_um: float | None = None  # its largest lesion's extent (None: no lesion)


@dataclass(frozen=True)
class StagingMeasures:
    """A method's staging: estimates with intervals, the node and stage confusion matrices
    (rows true, columns predicted, in :data:`NODE_LABELS` and :data:`PATIENT_STAGES`
    order), each patient's true and predicted stage, and the patients staged from fewer
    nodes than expected."""

    estimates: dict[str, Estimate]
    node_confusion: list[list[int]]
    stage_confusion: list[list[int]]
    stages: dict[str, tuple[str, str]]  # patient -> (true, predicted)
    incomplete: dict[str, int]  # patient -> nodes read, where fewer than expected
    n_patients: int
    n_slides: int
    n_resamples: int


def weighted_confusion(
    truth: np.ndarray, predicted: np.ndarray, n_classes: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """``O[..., i, j] = Σ w [truth = i] [predicted = j]``: shape ``weights.shape[:-1] + (K, K)``."""
    truth, predicted = np.asarray(truth, dtype=np.int64), np.asarray(predicted, dtype=np.int64)
    w = np.ones(len(truth)) if weights is None else np.asarray(weights, dtype=np.float64)
    cell = truth * n_classes + predicted
    one_hot = np.zeros((len(truth), n_classes * n_classes))
    one_hot[np.arange(len(truth)), cell] = 1.0
    return (w @ one_hot).reshape(*w.shape[:-1], n_classes, n_classes)


def quadratic_weighted_kappa(
    truth: np.ndarray, predicted: np.ndarray, n_classes: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """κ with quadratic penalties (module docstring); NaN where undefined."""
    observed = weighted_confusion(truth, predicted, n_classes, weights)
    total = observed.sum(axis=(-2, -1))
    expected = observed.sum(axis=-1)[..., :, None] * observed.sum(axis=-2)[..., None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = expected / total[..., None, None]
    index = np.arange(n_classes)
    penalty = (index[:, None] - index[None, :]).astype(np.float64) ** 2
    disagreement = (penalty * observed).sum(axis=(-2, -1))
    chance = (penalty * expected).sum(axis=(-2, -1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(chance > 0, 1.0 - disagreement / np.where(chance > 0, chance, 1), np.nan)


def node_accuracy(
    truth: np.ndarray, predicted: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """Σ w [truth = predicted] / Σ w; NaN without slides."""
    same = (np.asarray(truth) == np.asarray(predicted)).astype(np.float64)
    w = np.ones(len(same)) if weights is None else np.asarray(weights, dtype=np.float64)
    total = w.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (w * same).sum(axis=-1) / np.where(total > 0, total, 1), np.nan)


def staging_measures(
    calls: Sequence[NodeCall],
    true_stages: Mapping[str, str],
    *,
    nodes_per_patient: int = 5,
    n_resamples: int = N_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = LEVEL,
) -> StagingMeasures:
    """The measures of the module docstring over ``calls`` (the test slides of a method's
    models), with ``true_stages`` each patient's stage from the labels file; a patient
    with fewer than ``nodes_per_patient`` calls is staged from those and listed."""
    if not calls:
        raise ValueError("no test slide was staged")
    patients = sorted({call.patient for call in calls})
    index_of = {patient: i for i, patient in enumerate(patients)}
    slide_patient = np.array([index_of[call.patient] for call in calls])
    truth = np.array([NODE_LABELS.index(call.truth) for call in calls])
    predicted = np.array([NODE_LABELS.index(call.predicted) for call in calls])
    scores = np.array([call.score for call in calls], dtype=np.float64)
    any_tumour = (truth != NODE_LABELS.index("negative")).astype(np.int64)

    stages = {}
    for patient in patients:
        mine = [call for call in calls if call.patient == patient]
        stages[patient] = (true_stages[patient], patient_stage(call.predicted for call in mine))
    true_stage = np.array([PATIENT_STAGES.index(stages[p][0]) for p in patients])
    said_stage = np.array([PATIENT_STAGES.index(stages[p][1]) for p in patients])
    counts = np.bincount(slide_patient, minlength=len(patients))

    def measures(patient_weights: np.ndarray | None) -> dict[str, np.ndarray]:
        slide_weights = None if patient_weights is None else patient_weights[..., slide_patient]
        return {
            "kappa": quadratic_weighted_kappa(
                true_stage, said_stage, len(PATIENT_STAGES), patient_weights
            ),
            "node_accuracy": node_accuracy(truth, predicted, slide_weights),
            "slide_auc": auc(any_tumour, scores, slide_weights),
        }

    point = measures(None)
    resampled = measures(resample_counts(len(patients), n_resamples, seed).astype(np.float64))
    estimates = {
        name: Estimate(float(point[name]), *percentile_interval(resampled[name], level))
        for name in STAGING_MEASURES
    }
    confusion = weighted_confusion(truth, predicted, len(NODE_LABELS)).astype(int).tolist()
    stage_confusion = weighted_confusion(true_stage, said_stage, len(PATIENT_STAGES))
    return StagingMeasures(
        estimates=estimates,
        node_confusion=confusion,
        stage_confusion=stage_confusion.astype(int).tolist(),
        stages=stages,
        incomplete={
            p: int(counts[index_of[p]]) for p in patients if counts[index_of[p]] < nodes_per_patient
        },
        n_patients=len(patients),
        n_slides=len(calls),
        n_resamples=n_resamples,
    )


class StagingFileError(ValueError):
    """A staging summary the report cannot read: names the file and why."""


def read_staging(path: str | Path) -> dict[str, Any]:
    """The staging summary at ``path`` (``results/staging.json``), checked for what the
    report reads; a :class:`StagingFileError` naming it otherwise."""
    try:
        summary = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise StagingFileError(f"{path}: not a staging summary ({error})") from None
    if not isinstance(summary, dict) or summary.get("format") != SUMMARY_FORMAT:
        raise StagingFileError(f"{path}: not a staging summary of format {SUMMARY_FORMAT} "
                               f"(written by another version: run the staging again)")  # fmt: skip
    for key in ("measures", "methods", "failures"):
        if key not in summary:
            raise StagingFileError(f"{path}: no {key!r} in it")
    return summary


def staging_of_runs(
    summary: Mapping[str, Any], models: Mapping[str, Mapping[int, str | None]]
) -> tuple[dict[str, Any] | None, str]:
    """The part of ``summary`` that stages the reported runs, and why none is when none is.

    ``models`` maps each reported run (``ALGORITHM/seed_S``) to the recorded digest of the
    model that would stage each centre now (None: it keeps none). The staging is of these
    runs when every run it staged that is reported was staged, centre by centre, with the
    model the run keeps now: then its methods are narrowed to the reported ones. A staging
    that names none of them, records no models (written before it did), or staged a model
    the run no longer keeps (retrained since, or another directory's run of the same name)
    is not of these runs: ``(None, why)``.
    """
    staged = {key: entry for key, entry in summary["methods"].items() if key in models}
    if not staged:
        return None, f"it stages none of these runs (it stages {', '.join(summary['methods'])})"
    for key, entry in staged.items():
        recorded = entry.get("models")
        if not isinstance(recorded, Mapping):
            return None, "it does not record which models it staged (written before it did)"
        for center, digest in recorded.items():
            if models[key].get(int(center)) != digest:
                return None, f"{key} stages centre {center} with another model than it staged"
    return {**summary, "methods": staged}, ""


def _interval(entry: Mapping[str, float | None]) -> str:
    value, low, high = entry["value"], entry["low"], entry["high"]
    if value is None:
        return "n/a"
    if low is None or high is None:
        return f"{value:.3f}"
    return f"{value:.3f} [{low:.3f}, {high:.3f}]"


def staging_rows(summary: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The staging table's header and rows: a row per method and seed, each measure with
    its 95 % patient-bootstrap interval, the patients and slides it comes from."""
    measures = summary["measures"]
    header = ["method", *(MEASURE_TITLES[m] for m in measures), "patients", "slides",
              "thresholds (centre: per test patient)"]  # fmt: skip
    rows = []
    for key, entry in summary["methods"].items():
        thresholds = "; ".join(f"{c}: " + ", ".join(f"{t:g}" for t in chosen.values())
                               for c, chosen in entry["thresholds"].items())  # fmt: skip
        rows.append([key, *(_interval(entry[m]) for m in measures), str(entry["n_patients"]),
                     str(entry["n_slides"]), thresholds])  # fmt: skip
    return header, rows


def staging_notes(summary: Mapping[str, Any]) -> list[str]:
    """What the table's numbers are, and what they cannot say."""
    methods = summary["methods"].values()
    fewest = min((e["n_patients"] for e in methods), default=0)
    notes = [
        f"Test patients of every centre, each staged by its own centre's model; 95 % "
        f"intervals: percentile bootstrap over patients. With {fewest} test patient(s) the "
        f"intervals say mostly that the test set is small.",
        "Each test patient is staged at the threshold that classes the nodes of its "
        "centre's other test patients best (cross-fitted: never its own labels, never a "
        "patient the model trained on; the lowest candidate where the centre tests one "
        "patient): the thresholds column lists them per centre, in patient order.",
    ]
    truths = {pair[0] for e in methods for pair in e["stages"].values()}
    if len(truths) == 1:
        notes.append(
            f"Every test patient is {truths.pop()}: κ measures agreement beyond chance, and "
            f"with one true stage there is none to measure: κ is 0 whatever the predictions, "
            f"or undefined (n/a) where every prediction is that stage too."
        )
    incomplete = sorted({p for e in methods for p in e["incomplete"]})
    if incomplete:
        notes.append(f"Staged from fewer than five readable slides: {', '.join(incomplete)}.")
    notes += [f"Not mapped: centre {f['center']}, {f['slide']} (patient {f['patient']}): "
              f"{f['reason']}" for f in summary["failures"]]  # fmt: skip
    return notes


STAGE_CONFUSION_CORNER = "true \\ predicted"


def stage_confusion_rows(entry: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """A method's stage confusion as a table: header (the predicted stages) and a row per
    true stage, patients counted."""
    header = [STAGE_CONFUSION_CORNER, *PATIENT_STAGES]
    rows = [
        [stage, *(str(count) for count in counts)]
        for stage, counts in zip(PATIENT_STAGES, entry["stage_confusion"], strict=True)
    ]
    return header, rows


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def staging_table(summary: Mapping[str, Any]) -> str:
    """The staging table in Markdown, with its notes, then each method's stage confusion."""
    lines = [*_markdown(*staging_rows(summary)), "", *staging_notes(summary), ""]
    for key, entry in summary["methods"].items():
        lines += [f"Stage confusion of {key} (patients; rows true, columns predicted):", "",
                  *_markdown(*stage_confusion_rows(entry)), ""]  # fmt: skip
    return "\n".join(lines)


def pictures_to_show(
    wrong_calls: Mapping[str, Mapping[str, int]],
    sizes: Mapping[str, Mapping[str, int]],
    budget_bytes: float,
) -> dict[str, list[str]]:
    """Which slides' pictures the page embeds, per centre, within ``budget_bytes`` of
    pictures (``sizes``: each picture's bytes, per centre and slide): the slides most
    methods called wrong first (``wrong_calls``), then the others in a fixed order that
    mixes centres (by the SHA-256 of ``centre/slide``), each taken while it fits."""

    def mixed(center: str, slide: str) -> str:
        return hashlib.sha256(f"{center}/{slide}".encode()).hexdigest()

    ranked = sorted((-wrong_calls.get(c, {}).get(s, 0), mixed(c, s), c, s)
                    for c, slides in sizes.items() for s in slides)  # fmt: skip
    shown: dict[str, list[str]] = {}
    spent = 0
    for _, _, center, slide in ranked:
        if spent + sizes[center][slide] <= budget_bytes:
            spent += sizes[center][slide]
            shown.setdefault(center, []).append(slide)
    return {c: sorted(slides) for c, slides in shown.items()}
