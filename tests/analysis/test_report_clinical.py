"""analysis.report.clinical: sensitivity, specificity, AUC and the patient bootstrap, checked
against brute force on small hand-made cases (explicit pairwise counts, explicit copies of
resampled patients)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from analysis.report.clinical import (
    ModelScores,
    accuracy,
    auc,
    confusion,
    majority_class,
    method_measures,
    patch_weights,
    patient_tables,
    percentile_interval,
    resample_counts,
    resampled_measures,
    sensitivity,
    specificity,
)

# Eight patches: labels, probability of tumour (ties at 0.5 and 0.4 on purpose)
LABELS = np.array([1, 0, 0, 1, 1, 1, 0, 1])
SCORES = np.array([0.9, 0.2, 0.6, 0.4, 0.8, 0.5, 0.4, 0.5])


def brute_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Σ over every (tumour, healthy) pair of [s_t > s_h] + ½ [s_t = s_h], over the pairs."""
    tumour = [s for s, y in zip(scores, labels, strict=True) if y == 1]
    healthy = [s for s, y in zip(scores, labels, strict=True) if y == 0]
    wins = sum(1.0 if t > h else 0.5 if t == h else 0.0 for t in tumour for h in healthy)
    return wins / (len(tumour) * len(healthy))


def test_counts_by_hand() -> None:
    # called tumour (> 0.5): 0.9, 0.6, 0.8 -> patches 0, 2, 4; 0.5 is not above one half
    tp, fn, tn, fp = confusion(LABELS, SCORES)
    assert (tp, fn, tn, fp) == (2, 3, 2, 1)  # TP 0, 4; FN 3, 5, 7; TN 1, 6; FP 2
    assert float(sensitivity(LABELS, SCORES)) == pytest.approx(2 / 5)
    assert float(specificity(LABELS, SCORES)) == pytest.approx(2 / 3)
    assert float(accuracy(LABELS, SCORES)) == pytest.approx(4 / 8)
    # pairs: 0.9 beats 3; 0.4 beats 0.2, ties 0.4: 1.5; 0.8: 3; 0.5: 2 (not 0.6) twice
    assert float(auc(LABELS, SCORES)) == pytest.approx((3 + 1.5 + 3 + 2 + 2) / 15)
    assert float(auc(LABELS, SCORES)) == pytest.approx(brute_auc(LABELS, SCORES))


@pytest.mark.parametrize("seed", range(20))
def test_auc_is_the_pairwise_count_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 30))
    labels = rng.integers(0, 2, n)
    labels[:2] = (0, 1)
    scores = np.round(rng.random(n), 1)  # one decimal: many ties
    assert float(auc(labels, scores)) == pytest.approx(brute_auc(labels, scores), abs=1e-12)
    scipy_stats = pytest.importorskip("scipy.stats")
    u = scipy_stats.mannwhitneyu(scores[labels == 1], scores[labels == 0]).statistic
    pairs = (labels == 1).sum() * (labels == 0).sum()
    assert float(auc(labels, scores)) == pytest.approx(u / pairs)


def test_integer_weights_are_copies_and_rows_are_weightings() -> None:
    rng = np.random.default_rng(3)
    weights = rng.integers(0, 4, size=(6, len(LABELS)))
    weights[:, [0, 1]] = 1  # every weighting keeps a tumour and a healthy patch
    for function in (sensitivity, specificity, accuracy, auc):
        together = function(LABELS, SCORES, weights)
        assert together.shape == (6,)
        for b in range(6):
            copies = np.repeat(np.arange(len(LABELS)), weights[b])
            assert together[b] == pytest.approx(float(function(LABELS[copies], SCORES[copies])))


def test_undefined_measures_are_nan() -> None:
    healthy = np.array([0, 0])
    assert np.isnan(sensitivity(healthy, np.array([0.1, 0.9])))
    assert float(specificity(healthy, np.array([0.1, 0.9]))) == 0.5
    assert np.isnan(auc(healthy, np.array([0.1, 0.9])))
    assert np.isnan(specificity(np.array([1]), np.array([0.7])))
    assert np.isnan(auc(np.array([], dtype=int), np.array([])))
    assert np.isnan(accuracy(np.array([], dtype=int), np.array([])))


def test_majority_class() -> None:
    tumour = majority_class([3, 5])
    assert tumour is not None
    assert (tumour.label, tumour.name, tumour.rate, tumour.n_patches) == (1, "tumour", 0.625, 8)
    assert tumour.macro_accuracy == 0.5
    tie = majority_class([4, 4])
    assert tie is not None and (tie.label, tie.rate) == (0, 0.5)  # argmax: the first class
    only = majority_class([0, 7])
    assert only is not None and (only.rate, only.macro_accuracy) == (1.0, 1.0)
    assert majority_class([0, 0]) is None


def test_resample_counts_draw_patients_with_replacement_reproducibly() -> None:
    counts = resample_counts(4, 500, seed=0)
    assert counts.shape == (500, 4) and (counts.sum(axis=1) == 4).all()
    assert (counts >= 0).all() and counts.max() > 1  # with replacement: some drawn twice
    np.testing.assert_array_equal(counts, resample_counts(4, 500, seed=0))
    assert not np.array_equal(counts, resample_counts(4, 500, seed=1))
    # every patient is drawn 1/P of the time: 500 · 4 draws, about 500 each
    assert np.allclose(counts.sum(axis=0), 500, rtol=0.15)
    # the draws are numpy's default_rng(seed).integers(0, P, (B, P)), counted per row
    draws = np.random.default_rng(0).integers(0, 4, size=(500, 4))
    np.testing.assert_array_equal(counts, [np.bincount(d, minlength=4) for d in draws])
    with pytest.raises(ValueError):
        resample_counts(0)


def test_patch_weights_keep_patients_whole() -> None:
    patient_of_patch = np.array([0, 0, 1, 1, 1, 2, 3, 3])
    counts = resample_counts(4, 50, seed=2)
    weights = patch_weights(counts, patient_of_patch)
    assert weights.shape == (50, 8)
    for b in range(50):
        for patient in range(4):
            own = weights[b, patient_of_patch == patient]
            assert (own == counts[b, patient]).all()  # all in, k times each, or all out
        # the same as copying each drawn patient's patches, once per draw
        copies = np.concatenate([np.flatnonzero(patient_of_patch == p)
                                 for p in range(4) for _ in range(counts[b, p])])  # fmt: skip
        assert sorted(copies.tolist()) == sorted(np.repeat(np.arange(8), weights[b].astype(int)))


@pytest.mark.parametrize("seed", range(5))
def test_per_patient_sums_give_the_patch_level_measures(seed: int) -> None:
    """The bootstrap sums per patient first: the result must be the patch-level definitions
    on the resample's patch weights, to the last bit of every resample."""
    rng = np.random.default_rng(seed)
    n, n_patients = 60, 7
    labels = rng.integers(0, 2, n)
    scores = np.round(rng.random(n), 1)  # ties within and across patients
    patient_of_patch = rng.integers(0, n_patients, n)
    counts = resample_counts(n_patients, 300, seed=seed)
    fast = resampled_measures(*patient_tables(labels, scores, patient_of_patch, n_patients),
                              counts)  # fmt: skip
    weights = patch_weights(counts, patient_of_patch)
    for name, function in (("sensitivity", sensitivity), ("specificity", specificity),
                           ("auc", auc)):  # fmt: skip
        np.testing.assert_array_equal(fast[name], function(labels, scores, weights))


def test_percentile_interval() -> None:
    values = np.arange(101, dtype=float)
    assert percentile_interval(values) == (2.5, 97.5)
    assert percentile_interval(np.array([np.nan, 1.0, 3.0]), level=0.5) == (1.5, 2.5)
    low, high = percentile_interval(np.array([np.nan, np.nan]))
    assert np.isnan(low) and np.isnan(high)


def _models() -> list[ModelScores]:
    """Two models on the same 8 patches of 4 patients."""
    patients = np.array(["a", "a", "b", "b", "c", "c", "d", "d"])
    other = np.array([0.7, 0.1, 0.3, 0.6, 0.9, 0.2, 0.45, 0.55])
    return [ModelScores(LABELS, SCORES, patients), ModelScores(LABELS, other, patients)]


def test_method_value_is_the_mean_over_models_and_the_interval_holds_it() -> None:
    models = _models()
    measures = method_measures(models, n_resamples=400, seed=0)
    assert (measures.n_patients, measures.n_patches, measures.n_resamples) == (4, 8, 400)
    for name, function in (("sensitivity", sensitivity), ("specificity", specificity),
                           ("auc", auc)):  # fmt: skip
        expected = np.mean([float(function(m.labels, m.scores)) for m in models])
        estimate = measures.estimates[name]
        assert estimate.value == pytest.approx(expected)
        assert estimate.low <= estimate.value <= estimate.high
        assert 0.0 <= estimate.low < estimate.high <= 1.0  # 4 patients: not a point
    again = method_measures(_models(), n_resamples=400, seed=0)
    assert again == measures  # identical input, identical intervals, bit for bit
    assert method_measures(models, n_resamples=400, seed=1) != measures


def test_every_model_is_recomputed_on_the_same_patient_resample() -> None:
    """The interval is the percentiles of, per resample b, the mean over models of each
    model's measure on the copies of the patients drawn in b: rebuilt here by brute force
    from the same draws, the patients taken in sorted order."""
    models = _models()
    n_resamples = 200
    counts = resample_counts(4, n_resamples, seed=0)  # patients a, b, c, d: sorted
    values = []
    for b in range(n_resamples):
        per_model = []
        for model in models:
            copies = np.concatenate([np.flatnonzero(model.patients == p)
                                     for index, p in enumerate("abcd")
                                     for _ in range(counts[b, index])])  # fmt: skip
            per_model.append(brute_auc(model.labels[copies], model.scores[copies])
                             if len(set(model.labels[copies])) == 2 else np.nan)  # fmt: skip
        values.append(np.mean(per_model))
    values = np.array(values)
    measures = method_measures(models, n_resamples=n_resamples, seed=0)
    low, high = np.percentile(values[np.isfinite(values)], [2.5, 97.5])
    assert measures.estimates["auc"].low == pytest.approx(low)
    assert measures.estimates["auc"].high == pytest.approx(high)
    assert measures.undefined_resamples >= int((~np.isfinite(values)).sum())


def test_patch_order_does_not_change_the_result() -> None:
    models = _models()
    order = np.array([5, 2, 7, 0, 3, 6, 1, 4])
    shuffled = [ModelScores(m.labels[order], m.scores[order], m.patients[order]) for m in models]
    assert method_measures(shuffled, 300) == method_measures(models, 300)


def test_patients_are_the_units_not_patches() -> None:
    """A patient with many patches is one unit: the resamples draw 2 patients, so the
    intervals are those of 2 units, whatever their patch counts."""
    labels = np.array([1] * 10 + [0] * 10)
    scores = np.concatenate([np.linspace(0.6, 0.9, 10), np.linspace(0.1, 0.4, 10)])
    patients = np.array(["p"] * 10 + ["q"] * 10)
    measures = method_measures([ModelScores(labels, scores, patients)], 300)
    assert measures.n_patients == 2
    # a resample of {p, p} or {q, q} has one class only: AUC undefined about half the time
    assert 100 < measures.undefined_resamples < 200
    assert measures.estimates["auc"].value == 1.0


def test_no_models_is_an_error() -> None:
    with pytest.raises(ValueError, match="no models"):
        method_measures([])


def test_weights_must_match_patches() -> None:
    with pytest.raises(ValueError, match="weights of shape"):
        sensitivity(LABELS, SCORES, np.ones(3))


@pytest.mark.parametrize("n", [2, 3])
def test_auc_of_every_ordering_of_a_tiny_set(n: int) -> None:
    """Every assignment of labels and scores from {0, ½, 1} on n patches."""
    for labels in itertools.product((0, 1), repeat=n):
        if len(set(labels)) < 2:
            continue
        for scores in itertools.product((0.0, 0.5, 1.0), repeat=n):
            y, s = np.array(labels), np.array(scores)
            assert float(auc(y, s)) == pytest.approx(brute_auc(y, s))
