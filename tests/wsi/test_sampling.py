from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wsi.center import InsufficientPatchesError, SamplingParams, plan_center
from wsi.patches import UNUSABLE, PatchParams, assign_labels, labels_offered
from wsi.sampling import SlidePatches, sample_balanced, split_patients


def _slides(n_patients: int = 6, nodes: int = 3, per_slide: int = 30) -> list[SlidePatches]:
    rng = np.random.default_rng(0)
    slides = []
    for patient in range(n_patients):
        for node in range(nodes):
            labels = np.full(per_slide, node % 2)  # alternate healthy and tumour slides
            labels[:3] = -1
            slides.append(
                SlidePatches(
                    f"patient_{patient:03d}_node_{node}",
                    f"patient_{patient:03d}",
                    Path("x"),
                    rng.integers(0, 50, (per_slide, 2)) * 512,
                    labels,
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


def _chosen(selection) -> dict[str, set[tuple[int, int, int]]]:
    """Per slide, the (x, y, label) of the patches it gave."""
    chosen: dict[str, set[tuple[int, int, int]]] = {}
    for slide_id, (x, y), label in zip(
        selection.slide_ids, selection.coords, selection.labels, strict=True
    ):
        chosen.setdefault(str(slide_id), set()).add((int(x), int(y), int(label)))
    return chosen


def test_a_slide_dropped_or_added_leaves_the_others_patches_in_place() -> None:
    slides = _slides(n_patients=5)
    before = _chosen(sample_balanced(slides, 40, seed=2))
    victim = slides[4].slide_id  # a tumour slide of patient 1
    after = _chosen(sample_balanced([s for s in slides if s.slide_id != victim], 40, seed=2))
    assert victim in before and victim not in after
    for slide_id, patches in before.items():
        if slide_id != victim:  # every other slide keeps what it gave, and gives more
            assert patches <= after[slide_id], slide_id
    # the lost tumour patches are made up by the other slides
    assert sum(len(p) for p in after.values()) == 80
    # adding the slide back only takes from the end of the others' sequences
    for slide_id, patches in after.items():
        assert before[slide_id] <= patches


def test_the_patient_split_ignores_which_slides_survive_and_keeps_both_labels() -> None:
    patients = [f"patient_{p:03d}" for p in range(10) for _ in range(3)]
    offers = [{0}, {0}, {1}] * 5 + [{0}, {0}, {0}] * 5  # five with tumour slides, five without
    test = split_patients(patients, offers, test_fraction=0.2, seed=1)
    assert len(test) == 2 and test == split_patients(patients, offers, test_fraction=0.2, seed=1)
    tumour_patients = {p for p, o in zip(patients, offers, strict=True) if 1 in o}
    assert len(test & tumour_patients) == 1  # each stratum gives its share to test
    # a slide added to a patient, without changing what it offers, moves nobody
    more = split_patients([*patients, patients[0]], [*offers, {0}], test_fraction=0.2, seed=1)
    assert more == test
    # a new patient moves at most one patient of its stratum
    grown = split_patients([*patients, "patient_099"], [*offers, {0}], test_fraction=0.2, seed=1)
    assert len(test - grown) <= 1
    assert split_patients(patients, offers, test_fraction=0.2, seed=2) != test
    with pytest.raises(ValueError):
        split_patients(patients, offers, test_fraction=1.0)
    assert split_patients(["a", "a"], [{0}, {1}], test_fraction=0.2) == frozenset()


def test_the_plan_splits_by_the_given_patients_and_stays_balanced() -> None:
    slides = _slides(n_patients=10)
    test_patients = frozenset({"patient_003", "patient_007"})
    plan = plan_center(0, slides, SamplingParams(patches_per_class=60), test_patients)
    assert plan.selection.label_counts(2) == [60, 60]
    assert set(plan.split("test").patients) == test_patients
    assert test_patients.isdisjoint(plan.split("train").patients)


def test_take_available_keeps_the_store_balanced() -> None:
    slides = _slides(n_patients=1)  # 54 healthy, 27 tumour candidates
    plan = plan_center(3, slides, SamplingParams(patches_per_class=100, shortfall="take_available"))
    assert plan.selection.label_counts(2) == [27, 27]


def test_plan_reports_a_short_centre() -> None:
    with pytest.raises(InsufficientPatchesError) as caught:
        plan_center(3, _slides(n_patients=1), SamplingParams(patches_per_class=100))
    assert caught.value.center == 3 and caught.value.found == {"healthy": 54, "tumor": 27}
    message = str(caught.value)
    assert "centre 3" in message and "100 of each" in message and "take 27 of each" in message


@pytest.mark.parametrize("healthy_source", ["negative_slides", "outside_annotations"])
def test_labels_offered_follows_the_labelling_rule(healthy_source: str) -> None:
    """The catalogue-only rule that splits patients must agree with the pixel rule."""
    params = PatchParams(healthy_source=healthy_source)  # type: ignore[arg-type]
    inside, outside = np.array([1.0, 0.0]), np.array([1.0, 1.0])  # tumour, tissue
    for node_label in (None, "negative", "itc", "micro", "macro"):
        for annotated in (False, True):
            labels = assign_labels(
                outside, inside, node_label=node_label, annotated=annotated, params=params
            )
            given = set(labels.tolist()) - {UNUSABLE}
            assert labels_offered(node_label, annotated, params.healthy_source) == given


def test_the_patient_split_is_stratified_by_stage_within_what_patients_offer() -> None:
    """Twenty tumour patients of five stages (8, 4, 4, 3, 1) and ten healthy-only ones:
    each stage gives floor or ceil of its share to test, whatever the seed; a lone pN2 is
    in test for about test_fraction of the seeds; the split is a function of its inputs."""
    counts = {"pN0(i+)": 8, "pN0": 0, "pN1mi": 4, "pN1": 4, "pN2": 3}
    stages = {}
    for stage, n in counts.items():
        stages.update({f"{stage}_{i}": stage for i in range(n)})
    stages["pN2_lone"] = "pN2"  # with the three other pN2: four
    healthy = {f"pN0_{i}": "pN0" for i in range(10)}
    patients = [*stages, *healthy]
    offers = [{0, 1}] * len(stages) + [{0}] * len(healthy)
    lone = 0
    for seed in range(200):
        test = split_patients(patients, offers, test_fraction=0.25, seed=seed,
                              stages={**stages, **healthy})  # fmt: skip
        assert test == split_patients(patients, offers, test_fraction=0.25, seed=seed,
                                      stages={**stages, **healthy})  # fmt: skip
        assert len(test & set(stages)) == 5 and len(test & set(healthy)) == 2  # 20/4, 10/4
        for stage in ("pN0(i+)", "pN1mi", "pN1", "pN2"):
            members = {p for p, s in stages.items() if s == stage}
            share = 0.25 * len(members)
            assert int(np.floor(share)) <= len(test & members) <= int(np.ceil(share)), stage
        lone += "pN2_lone" in test
    assert 0.15 < lone / 200 < 0.35  # one of four pN2 patients, a quarter of them tested
    # without stages: the same counts per stratum (what the patients offer decides them)
    plain = split_patients(patients, offers, test_fraction=0.25, seed=0)
    assert len(plain & set(stages)) == 5 and len(plain & set(healthy)) == 2
