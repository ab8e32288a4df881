from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wsi.center import InsufficientPatchesError, SamplingParams, plan_center
from wsi.sampling import SlidePatches, sample_balanced, split_by_patient


def _slides(n_patients: int = 6, nodes: int = 3, per_slide: int = 30) -> list[SlidePatches]:
    rng = np.random.default_rng(0)
    slides = []
    for patient in range(n_patients):
        for node in range(nodes):
            labels = np.full(per_slide, node % 2)  # alternate healthy and tumour slides
            labels[:3] = -1
            slides.append(
                SlidePatches(
                    f"patient_{patient:03d}_node_{node}", f"patient_{patient:03d}", Path("x"),
                    rng.integers(0, 50, (per_slide, 2)) * 512, labels,
                )
            )
    return slides


def test_balanced_and_spread_over_slides() -> None:
    slides = _slides()
    selection = sample_balanced(slides, 40, seed=3)
    assert selection.label_counts(2) == [40, 40]
    for label in (0, 1):
        ids = selection.slide_ids[selection.labels == label]
        _, per_slide = np.unique(ids, return_counts=True)
        assert per_slide.max() - per_slide.min() <= 1  # round-robin spread
    again = sample_balanced(list(reversed(slides)), 40, seed=3)  # order-independent
    np.testing.assert_array_equal(selection.coords, again.coords)
    other = sample_balanced(slides, 40, seed=4)
    assert not np.array_equal(selection.coords, other.coords)


def test_per_slide_cap_limits_the_sample() -> None:
    selection = sample_balanced(_slides(), 1000, max_per_slide=5, seed=0)
    _, per_slide = np.unique(selection.slide_ids, return_counts=True)
    assert per_slide.max() == 5
    assert selection.label_counts(2) == [6 * 2 * 5, 6 * 1 * 5]


def test_patient_split_is_disjoint_and_near_the_target() -> None:
    selection = sample_balanced(_slides(n_patients=10), 100, seed=0)
    is_test = split_by_patient(selection.patients, selection.labels, test_fraction=0.2, seed=1)
    assert set(selection.patients[is_test]).isdisjoint(selection.patients[~is_test])
    assert abs(is_test.mean() - 0.2) < 0.05
    for split in (is_test, ~is_test):
        assert set(selection.labels[split]) == {0, 1}
    np.testing.assert_array_equal(
        is_test,
        split_by_patient(selection.patients, selection.labels, test_fraction=0.2, seed=1),
    )


def test_split_prefers_both_labels_in_both_splits() -> None:
    # patient a: healthy only; b: tumour only; c and d: both
    patients = np.array(["a"] * 10 + ["b"] * 10 + ["c"] * 4 + ["d"] * 4)
    labels = np.array([0] * 10 + [1] * 10 + [0, 0, 1, 1] * 2)
    is_test = split_by_patient(patients, labels, test_fraction=0.2, seed=0)
    assert set(labels[is_test]) == {0, 1} and set(labels[~is_test]) == {0, 1}
    with pytest.raises(ValueError):
        split_by_patient(patients, labels, test_fraction=1.0)
    single = split_by_patient(np.array(["a", "a"]), np.array([0, 1]), test_fraction=0.2)
    assert not single.any()


def test_plan_reports_a_short_centre() -> None:
    with pytest.raises(InsufficientPatchesError) as caught:
        plan_center(3, _slides(n_patients=1), SamplingParams(patches_per_class=100))
    assert caught.value.center == 3 and caught.value.found == {"healthy": 54, "tumor": 27}
    assert "centre 3" in str(caught.value) and "100 of each" in str(caught.value)
