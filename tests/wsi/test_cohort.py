"""The synthetic cohort's stages (wsi.synth.rules): drawn from the stated weights, every
stage reachable, each patient's nodes giving its stage back under wsi.nodes' rules, and
each centre's tumour slots giving it tumour and healthy slides whatever the others draw."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from wsi.catalogue import PATIENTS_PER_CENTER
from wsi.nodes import PATIENT_STAGES, patient_stage
from wsi.synth.config import STAGE_WEIGHTS, SynthConfig
from wsi.synth.rules import (
    MACRO_STAGES,
    PatientDraw,
    assign_cohort,
    assign_node_labels,
    draw_patients,
    other_weights,
)

COHORT = SynthConfig(patients_per_center=PATIENTS_PER_CENTER)  # 100 patients, as the paper's


def test_every_patient_s_nodes_give_back_its_drawn_stage() -> None:
    for seed in range(5):
        config = SynthConfig(patients_per_center=PATIENTS_PER_CENTER, seed=seed)
        draws = draw_patients(config)
        for patient, nodes in assign_cohort(config).items():
            assert len(nodes) == config.nodes_per_patient
            assert patient_stage(nodes) == draws[patient].stage, (seed, patient, nodes)
            if draws[patient].tumour_slot:
                assert "negative" in nodes and "macro" in nodes


def test_every_stage_and_node_label_is_reachable_in_any_cohort_of_the_paper_s_size() -> None:
    for seed in range(5):
        config = SynthConfig(patients_per_center=PATIENTS_PER_CENTER, seed=seed)
        cohort = assign_cohort(config)
        stages = Counter(patient_stage(nodes) for nodes in cohort.values())
        assert set(stages) == set(PATIENT_STAGES), (seed, stages)
        assert {label for nodes in cohort.values() for label in nodes} == {
            "negative", "itc", "micro", "macro"}  # fmt: skip


def test_each_stage_s_node_rule_is_exercised_at_its_edges() -> None:
    config = SynthConfig()
    seen: dict[str, set[int]] = {stage: set() for stage in PATIENT_STAGES}
    for patient in range(400):
        for stage in PATIENT_STAGES:
            nodes = assign_node_labels(config, patient, PatientDraw(stage))
            assert patient_stage(nodes) == stage
            seen[stage].add(sum(n in ("micro", "macro") for n in nodes))
    assert seen == {"pN0": {0}, "pN0(i+)": {0}, "pN1mi": {1, 2, 3}, "pN1": {1, 2, 3},
                    "pN2": {4, 5}}  # fmt: skip
    kept = [assign_node_labels(config, p, PatientDraw("pN2", tumour_slot=True)) for p in range(50)]
    assert all(n.count("negative") >= 1 and sum(x != "negative" for x in n) == 4 for n in kept)


def test_the_cohort_s_stage_shares_are_the_stated_weights() -> None:
    """Over many centres, slots included, each stage's share is its weight (within four
    standard errors): the slots' pN1 and pN2 are taken out of the other patients' draws."""
    config = SynthConfig(centers=tuple(range(200)), patients_per_center=PATIENTS_PER_CENTER)
    draws = draw_patients(config)
    counts = Counter(draw.stage for draw in draws.values())
    n = len(draws)
    for stage, weight in zip(PATIENT_STAGES, STAGE_WEIGHTS, strict=True):
        share = counts[stage] / n
        assert share == pytest.approx(weight, abs=4 * np.sqrt(weight * (1 - weight) / n)), stage
    slots = [d for d in draws.values() if d.tumour_slot]
    assert len(slots) == 200 * config.tumour_patients_per_center
    assert {d.stage for d in slots} == set(MACRO_STAGES)


def test_other_weights_make_up_for_the_slots_and_never_go_negative() -> None:
    weights = np.array(STAGE_WEIGHTS) / sum(STAGE_WEIGHTS)
    slot = np.where(np.isin(PATIENT_STAGES, MACRO_STAGES), weights, 0)
    slot = slot / slot.sum()
    rest = other_weights(weights, slot, 2, 20)
    assert 2 * slot + 18 * rest == pytest.approx(20 * weights)
    few = other_weights(weights, slot, 2, 3)  # two slots of three: more than pN1 + pN2's share
    assert (few >= 0).all() and few.sum() == pytest.approx(1)
    assert few[PATIENT_STAGES.index("pN1")] == few[PATIENT_STAGES.index("pN2")] == 0


def test_every_centre_has_its_tumour_slots_even_with_one_patient() -> None:
    config = SynthConfig(patients_per_center=1, seed=3)
    for patient, nodes in assign_cohort(config).items():
        assert "macro" in nodes and "negative" in nodes, patient
    none = SynthConfig(patients_per_center=3, tumour_patients_per_center=0,
                       stage_weights=(1, 0, 0, 0, 0))  # fmt: skip
    assert all(set(nodes) == {"negative"} for nodes in assign_cohort(none).values())


def test_the_stages_do_not_depend_on_other_centres() -> None:
    alone = draw_patients(SynthConfig(centers=(2,), patients_per_center=5))
    together = draw_patients(SynthConfig(centers=(0, 1, 2), patients_per_center=5))
    assert alone == {p: together[p] for p in alone}
