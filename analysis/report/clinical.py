"""Clinical measures of a classifier's test predictions, and a bootstrap over patients.

Tumour (label 1) is the positive class. For test patches i = 1..N with labels
y_i ∈ {0 healthy, 1 tumour}, scores s_i (the model's softmax probability of tumour),
predictions ŷ_i = [s_i > 1/2] (the argmax of two classes, the first class on a tie) and
weights w_i ≥ 0 (all 1 for the test set as it is; a bootstrap resample's multiplicities)::

    TP = Σ w_i [y_i = 1][ŷ_i = 1]      FN = Σ w_i [y_i = 1][ŷ_i = 0]
    TN = Σ w_i [y_i = 0][ŷ_i = 0]      FP = Σ w_i [y_i = 0][ŷ_i = 1]
    accuracy    = (TP + TN) / Σ w_i
    sensitivity = TP / (TP + FN)       specificity = TN / (TN + FP)
    AUC = Σ_{i: y_i=1} Σ_{j: y_j=0} w_i w_j ([s_i > s_j] + ½ [s_i = s_j])
          / (Σ_{i: y_i=1} w_i · Σ_{j: y_j=0} w_j)

AUC is the Mann–Whitney probability that a random tumour patch scores above a random
healthy one, ties counting one half (the area under the ROC curve). An integer weight is
the same as repeating the patch that many times, so a resample is computed without copying
patches. A measure whose denominator is 0 is undefined (NaN): sensitivity without tumour
patches, specificity without healthy ones, AUC without either.

Every measure takes ``weights`` of shape (N,) or (B, N), B weightings at once, and returns
an array of shape ``weights.shape[:-1]`` (0-d for one weighting, as without weights).

**Patient bootstrap.** Patches of one patient are not independent (one slide gives many),
so the units resampled are the P test patients: a resample draws P patients uniformly
with replacement, and each patch weighs the number of times its patient was drawn
(:func:`resample_counts`, :func:`patch_weights`); a patient is in or out whole. Summed per
patient first (:func:`patient_tables`), a resample costs O(P²), not O(N), whatever the
number of patches (:func:`resampled_measures`). A method's value is the mean of a measure
over its models, each recomputed on the same resample; its 95 % interval is the 2.5th and
97.5th percentiles of the B resampled values (percentile bootstrap,
:func:`percentile_interval`), over the resamples where the value is defined. The draws
come from ``numpy.random.default_rng(seed)``: the same input gives the same interval, bit
for bit. With few patients such an interval is wide, and tends to be too narrow rather
than too wide (a bootstrap can only recombine the patients it has).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

HEALTHY, TUMOUR = 0, 1
LABEL_NAMES: dict[int, str] = {HEALTHY: "healthy", TUMOUR: "tumour"}
THRESHOLD = 0.5  # tumour iff p_tumor > THRESHOLD: the argmax of two classes
N_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
LEVEL = 0.95
MEASURES: tuple[str, ...] = ("sensitivity", "specificity", "auc")


def _weights(labels: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """``weights`` as float64 of shape (..., N), ones for None."""
    n = len(labels)
    if weights is None:
        return np.ones(n, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape[-1:] != (n,):
        raise ValueError(f"weights of shape {weights.shape} for {n} patches")
    return weights


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, NaN where the denominator is 0."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1),
                        np.nan)  # fmt: skip


def predicted_tumour(scores: np.ndarray) -> np.ndarray:
    """ŷ_i = [s_i > 1/2]: tumour where the probability of tumour exceeds one half."""
    return np.asarray(scores, dtype=np.float64) > THRESHOLD


def confusion(
    labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """(TP, FN, TN, FP) along the last axis: shape ``weights.shape[:-1] + (4,)``."""
    labels = np.asarray(labels)
    w = _weights(labels, weights)
    tumour, said = labels == TUMOUR, predicted_tumour(scores)
    masks = (tumour & said, tumour & ~said, ~tumour & ~said, ~tumour & said)
    return np.stack([(w * mask).sum(axis=-1) for mask in masks], axis=-1)


def accuracy(
    labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """(TP + TN) / (TP + FN + TN + FP); NaN without patches."""
    counts = confusion(labels, scores, weights)
    return _ratio(counts[..., 0] + counts[..., 2], counts.sum(axis=-1))


def sensitivity(
    labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """TP / (TP + FN): the share of tumour patches called tumour; NaN without tumour."""
    counts = confusion(labels, scores, weights)
    return _ratio(counts[..., 0], counts[..., 0] + counts[..., 1])


def specificity(
    labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """TN / (TN + FP): the share of healthy patches called healthy; NaN without healthy."""
    counts = confusion(labels, scores, weights)
    return _ratio(counts[..., 2], counts[..., 2] + counts[..., 3])


def auc(labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """The Mann–Whitney AUC (module docstring), in O(N log N): with the patches sorted by
    score and grouped by equal score g, AUC = Σ_g T_g (H_{<g} + ½ H_g) / (Σ T · Σ H), where
    T_g and H_g are group g's tumour and healthy weights and H_{<g} the healthy weight of
    the groups scoring lower. NaN without a tumour or without a healthy patch."""
    labels = np.asarray(labels)
    scores = np.asarray(scores, dtype=np.float64)
    w = _weights(labels, weights)
    if len(labels) == 0:
        return np.full(w.shape[:-1], np.nan)
    order = np.argsort(scores, kind="stable")
    ordered = scores[order]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    tumour = labels[order] == TUMOUR
    w = w[..., order]
    t = np.add.reduceat(w * tumour, starts, axis=-1)
    h = np.add.reduceat(w * ~tumour, starts, axis=-1)
    below = np.cumsum(h, axis=-1) - h
    numerator = (t * (below + 0.5 * h)).sum(axis=-1)
    return _ratio(numerator, t.sum(axis=-1) * h.sum(axis=-1))


MEASURE_FUNCTIONS = {"sensitivity": sensitivity, "specificity": specificity, "auc": auc}


@dataclass(frozen=True)
class MajorityClass:
    """The most frequent label of a test set and its share: the accuracy of always
    answering it. Its macro-accuracy is 1 / (classes present): recall 1 on its class,
    0 on the others."""

    label: int
    rate: float
    n_classes: int
    n_patches: int

    @property
    def name(self) -> str:
        return LABEL_NAMES.get(self.label, f"class {self.label}")

    @property
    def macro_accuracy(self) -> float:
        return 1.0 / self.n_classes


def majority_class(counts: Sequence[int]) -> MajorityClass | None:
    """From the patches per label (index = label): the label of most patches (the lowest
    on a tie, as argmax), max_c n_c / Σ n_c, and the classes present; None without
    patches."""
    array = np.asarray(counts, dtype=np.int64)
    total = int(array.sum())
    if total == 0:
        return None
    label = int(np.argmax(array))
    return MajorityClass(label, float(array[label] / total), int((array > 0).sum()), total)


def resample_counts(
    n_patients: int, n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> np.ndarray:
    """(B, P) int64: how many times resample b drew patient p, for B resamples of P
    patients drawn uniformly with replacement from ``default_rng(seed)``; each row sums
    to P."""
    if n_patients < 1 or n_resamples < 1:
        raise ValueError(f"resample {n_patients} patient(s) {n_resamples} time(s)")
    draws = np.random.default_rng(seed).integers(0, n_patients, size=(n_resamples, n_patients))
    counts = np.zeros((n_resamples, n_patients), dtype=np.int64)
    np.add.at(counts, (np.arange(n_resamples)[:, None], draws), 1)
    return counts


def patch_weights(counts: np.ndarray, patient_of_patch: np.ndarray) -> np.ndarray:
    """(B, N): patch i weighs ``counts[b, patient_of_patch[i]]``, so every patch of a
    patient drawn k times counts k times, and a patient not drawn is left out whole."""
    return counts[:, np.asarray(patient_of_patch, dtype=np.int64)].astype(np.float64)


def percentile_interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The ((1 − level)/2, (1 + level)/2) percentiles of the defined (finite) values,
    linearly interpolated (``numpy.percentile``'s default); NaN, NaN when none is."""
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return np.nan, np.nan
    tail = round(50 * (1 - level), 10)  # 2.5 for 0.95, not 2.5000000000000022
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class ModelScores:
    """One model's test predictions: labels, probability of tumour and each patch's
    patient (any key that names one patient: the unit of the bootstrap)."""

    labels: np.ndarray
    scores: np.ndarray
    patients: np.ndarray


@dataclass(frozen=True)
class Estimate:
    """A method's value of one measure (mean over its models) and its bootstrap interval."""

    value: float
    low: float
    high: float


@dataclass(frozen=True)
class MethodMeasures:
    """Sensitivity, specificity and AUC of a method with their intervals, the test patients
    and patches they come from, and how many resamples left a measure undefined."""

    estimates: dict[str, Estimate]
    n_patients: int
    n_patches: int
    n_resamples: int
    undefined_resamples: int


def patient_tables(
    labels: np.ndarray, scores: np.ndarray, patient_of_patch: np.ndarray, n_patients: int
) -> tuple[np.ndarray, np.ndarray]:
    """One model's predictions summed per patient, all a resample needs: C (P, 4), patient
    p's (TP, FN, TN, FP), and the (P, P) pair wins
    A[p, q] = Σ_{i of p, y_i=1} Σ_{j of q, y_j=0} ([s_i > s_j] + ½ [s_i = s_j]).

    With patient p drawn k_p times (every patch weighing k_p), the weighted counts of the
    module docstring are Σ_p k_p C[p] and the AUC's numerator is Σ_p Σ_q k_p k_q A[p, q]:
    the sums over patches grouped by patient (:func:`resampled_measures`)."""
    labels = np.asarray(labels)
    scores = np.asarray(scores, dtype=np.float64)
    index = np.asarray(patient_of_patch, dtype=np.int64)
    tumour, said = labels == TUMOUR, predicted_tumour(scores)
    masks = (tumour & said, tumour & ~said, ~tumour & ~said, ~tumour & said)
    confusion_per_patient = np.stack(
        [np.bincount(index[mask], minlength=n_patients) for mask in masks], axis=1
    ).astype(np.float64)
    wins = np.zeros((n_patients, n_patients))
    tumour_scores, tumour_patients = scores[tumour], index[tumour]
    for q in np.unique(index[~tumour]):
        healthy = np.sort(scores[~tumour & (index == q)])
        below = np.searchsorted(healthy, tumour_scores, side="left")
        ties = np.searchsorted(healthy, tumour_scores, side="right") - below
        wins[:, q] = np.bincount(tumour_patients, weights=below + 0.5 * ties,
                                 minlength=n_patients)  # fmt: skip
    return confusion_per_patient, wins


def resampled_measures(
    confusion_per_patient: np.ndarray, wins: np.ndarray, counts: np.ndarray
) -> dict[str, np.ndarray]:
    """Sensitivity, specificity and AUC of one model on each of B patient resamples
    (``counts``, (B, P): k_bp), from its :func:`patient_tables`: with K = k C (B, 4),
    sensitivity = K_TP / (K_TP + K_FN), specificity = K_TN / (K_TN + K_FP), and
    AUC = Σ_pq k_p A[p, q] k_q / ((K_TP + K_FN)(K_TN + K_FP)); equal to the patch-level
    definitions with :func:`patch_weights` (every sum is of multiples of ½: exact)."""
    k = counts.astype(np.float64)
    totals = k @ confusion_per_patient
    tumour, healthy = totals[:, 0] + totals[:, 1], totals[:, 2] + totals[:, 3]
    return {
        "sensitivity": _ratio(totals[:, 0], tumour),
        "specificity": _ratio(totals[:, 2], healthy),
        "auc": _ratio(((k @ wins) * k).sum(axis=1), tumour * healthy),
    }


def method_measures(
    models: Sequence[ModelScores],
    n_resamples: int = N_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = LEVEL,
) -> MethodMeasures:
    """For each measure m of :data:`MEASURES`: the method's value (1/M) Σ_k m(model k) on
    the whole test set, and the percentile interval of (1/M) Σ_k m(model k; resample b)
    over the B patient resamples (module docstring). The patients are those of every
    model's predictions, sorted (so their order, and the draws, depend on the input only);
    every model is recomputed on the same resample. ``undefined_resamples``: resamples
    where some measure is undefined (e.g. no tumour patch drawn), left out of its
    percentiles."""
    if not models:
        raise ValueError("no models to measure")
    patients = np.unique(np.concatenate([np.asarray(m.patients).astype(str) for m in models]))
    counts = resample_counts(len(patients), n_resamples, seed)
    values: dict[str, list[float]] = {name: [] for name in MEASURES}
    resampled: dict[str, list[np.ndarray]] = {name: [] for name in MEASURES}
    for model in models:
        index = np.searchsorted(patients, np.asarray(model.patients).astype(str))
        per_resample = resampled_measures(
            *patient_tables(model.labels, model.scores, index, len(patients)), counts
        )
        for name in MEASURES:
            values[name].append(float(MEASURE_FUNCTIONS[name](model.labels, model.scores)))
            resampled[name].append(per_resample[name])
    estimates, undefined = {}, np.zeros(n_resamples, dtype=bool)
    for name in MEASURES:
        per_resample = np.mean(np.stack(resampled[name]), axis=0)  # NaN if any model's is
        undefined |= ~np.isfinite(per_resample)
        low, high = percentile_interval(per_resample, level)
        estimates[name] = Estimate(float(np.mean(values[name])), low, high)
    return MethodMeasures(
        estimates=estimates,
        n_patients=len(patients),
        n_patches=max(len(m.labels) for m in models),
        n_resamples=n_resamples,
        undefined_resamples=int(undefined.sum()),
    )
