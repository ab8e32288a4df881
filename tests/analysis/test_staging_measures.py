"""Staging measures against scikit-learn (kappa, AUC), weights as repetitions, and a
method's measures from its slides' calls."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score, confusion_matrix, roc_auc_score

from analysis.report.staging import (
    NodeCall,
    node_accuracy,
    quadratic_weighted_kappa,
    staging_measures,
    staging_of_runs,
    weighted_confusion,
)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.UndefinedMetricWarning")
def test_kappa_is_scikit_learns_quadratic_kappa_and_weights_are_repetitions() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 30))
        truth = rng.integers(0, 5, n)
        predicted = np.clip(truth + rng.integers(-2, 3, n), 0, 4)
        expected = cohen_kappa_score(truth, predicted, weights="quadratic", labels=range(5))
        assert quadratic_weighted_kappa(truth, predicted, 5) == pytest.approx(expected, nan_ok=True)
        repeats = rng.integers(0, 4, n)
        if repeats.sum() == 0:
            continue
        repeated = cohen_kappa_score(np.repeat(truth, repeats), np.repeat(predicted, repeats),
                                     weights="quadratic", labels=range(5))  # fmt: skip
        batch = np.stack([np.ones(n), repeats])  # two weightings at once
        got = quadratic_weighted_kappa(truth, predicted, 5, batch)
        assert got[1] == pytest.approx(repeated, nan_ok=True)
        assert got[0] == pytest.approx(expected, nan_ok=True)


def test_kappa_of_perfect_of_reversed_and_of_undefined_agreement() -> None:
    stages = np.array([0, 1, 2, 3, 4])
    assert quadratic_weighted_kappa(stages, stages, 5) == pytest.approx(1.0)
    assert quadratic_weighted_kappa(stages, stages[::-1], 5) == pytest.approx(-1.0)
    assert np.isnan(quadratic_weighted_kappa(np.array([3, 3]), np.array([3, 3]), 5))


def test_confusion_and_accuracy_count_each_weighted_slide() -> None:
    truth, predicted = np.array([0, 1, 3, 3]), np.array([0, 2, 3, 0])
    confusion = weighted_confusion(truth, predicted, 4, np.array([1.0, 2.0, 1.0, 3.0]))
    assert confusion[1, 2] == 2 and confusion[3, 0] == 3 and confusion.sum() == 7
    assert node_accuracy(truth, predicted) == pytest.approx(0.5)
    assert node_accuracy(truth, predicted, np.array([1.0, 0.0, 1.0, 0.0])) == pytest.approx(1.0)
    assert np.isnan(node_accuracy(truth, predicted, np.zeros(4)))


def _calls() -> tuple[list[NodeCall], dict[str, str]]:
    rng = np.random.default_rng(3)
    labels = ["negative", "itc", "micro", "macro"]
    calls, stages = [], {}
    truth_of = {
        "patient_000": ["negative"] * 5,
        "patient_001": ["macro", "micro", "negative", "negative", "itc"],
        "patient_002": ["micro", "negative", "negative", "negative", "negative"],
        "patient_003": ["macro", "macro", "micro", "micro", "negative"],
        "patient_004": ["itc", "negative", "negative"],  # two slides could not be read
    }
    true_stage = {"patient_000": "pN0", "patient_001": "pN1", "patient_002": "pN1mi",
                  "patient_003": "pN2", "patient_004": "pN0(i+)"}  # fmt: skip
    for patient, nodes in truth_of.items():
        for node, truth in enumerate(nodes):
            wrong = rng.random() < 0.3
            said = labels[int(rng.integers(0, 4))] if wrong else truth
            score = (0.9 if truth != "negative" else 0.1) + rng.normal(0, 0.05)
            calls.append(NodeCall(patient, f"{patient}_node_{node}", truth, said, float(score)))
        stages[patient] = true_stage[patient]
    return calls, stages


def test_a_methods_measures_come_from_its_calls_with_patient_intervals() -> None:
    calls, stages = _calls()
    measures = staging_measures(calls, stages, n_resamples=500, seed=1)
    assert measures.n_patients == 5 and measures.n_slides == 23
    assert measures.incomplete == {"patient_004": 3}
    assert sum(map(sum, measures.node_confusion)) == 23
    right = sum(c.truth == c.predicted for c in calls)
    assert measures.estimates["node_accuracy"].value == pytest.approx(right / 23)
    any_tumour = [c.truth != "negative" for c in calls]
    assert measures.estimates["slide_auc"].value == pytest.approx(
        roc_auc_score(any_tumour, [c.score for c in calls])
    )
    truth = [stages[p] for p in sorted(stages)]
    said = [measures.stages[p][1] for p in sorted(stages)]
    assert [measures.stages[p][0] for p in sorted(stages)] == truth
    assert measures.estimates["kappa"].value == pytest.approx(
        cohen_kappa_score(
            truth, said, weights="quadratic", labels=["pN0", "pN0(i+)", "pN1mi", "pN1", "pN2"]
        )
    )
    stage_order = ["pN0", "pN0(i+)", "pN1mi", "pN1", "pN2"]
    assert measures.stage_confusion == confusion_matrix(truth, said, labels=stage_order).tolist()
    for estimate in measures.estimates.values():
        assert estimate.low <= estimate.value <= estimate.high or np.isnan(estimate.value)
    again = staging_measures(calls, stages, n_resamples=500, seed=1)
    assert again.estimates == measures.estimates  # the same draws, bit for bit
    perfect = [NodeCall(c.patient, c.slide_id, c.truth, c.truth, c.score) for c in calls]
    best = staging_measures(perfect, stages, n_resamples=200)
    assert best.estimates["kappa"].value == 1.0 and best.estimates["node_accuracy"].value == 1.0
    with pytest.raises(ValueError, match="no test slide"):
        staging_measures([], stages)


def test_a_staging_is_shown_only_beside_the_runs_whose_kept_models_it_staged() -> None:
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    summary = {"methods": {"ProxyFL/seed_0": {"models": {"0": a, "1": b}},
                           "Joint/seed_0": {"models": {"0": b, "1": b}}}}  # fmt: skip
    # narrowed to the reported runs, whose models are still the staged ones
    shown, why = staging_of_runs(summary, {"ProxyFL/seed_0": {0: a, 1: b}})
    assert why == "" and shown is not None and list(shown["methods"]) == ["ProxyFL/seed_0"]
    assert list(summary["methods"]) == ["ProxyFL/seed_0", "Joint/seed_0"]  # not changed
    # a run retrained since (or another directory's run of the same name)
    shown, why = staging_of_runs(summary, {"ProxyFL/seed_0": {0: a, 1: a}})
    assert shown is None
    assert why == "ProxyFL/seed_0 stages centre 1 with another model than it staged"
    # a run that keeps no model for a staged centre any more
    shown, why = staging_of_runs(summary, {"Joint/seed_0": {0: b, 1: None}})
    assert shown is None and "Joint/seed_0 stages centre 1" in why
    # none of the reported runs staged
    shown, why = staging_of_runs(summary, {"FedAvg/seed_0": {0: a}})
    assert shown is None and why.startswith("it stages none of these runs")
    # a summary written before the models were recorded
    old = {"methods": {"ProxyFL/seed_0": {"thresholds": {"0": 0.5}}}}
    shown, why = staging_of_runs(old, {"ProxyFL/seed_0": {0: a}})
    assert shown is None and "does not record which models" in why
