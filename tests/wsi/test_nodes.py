"""The node and stage rules of Camelyon-17 (Bandi et al. 2019, §II-B), case by case."""

from __future__ import annotations

import itertools

import pytest

from wsi.nodes import (
    NODE_LABELS,
    PATIENT_STAGES,
    NodeThresholds,
    label_scale,
    node_label,
    patient_stage,
)

REAL = NodeThresholds()


@pytest.mark.parametrize(
    ("extent_um", "expected"),
    [
        (None, "negative"),
        (0.0, "itc"),  # a lesion of one point is still a lesion
        (199.99, "itc"),  # "smaller than 0.2 mm"
        (200.0, "itc"),  # AJCC's "no larger than 0.2 mm": micro is "larger than 0.2 mm"
        (200.01, "micro"),
        (1999.0, "micro"),
        (2000.0, "micro"),  # "not larger than 2.0 mm"
        (2000.01, "macro"),  # "larger than 2.0 mm"
        (8000.0, "macro"),
    ],
)
def test_a_node_is_classed_by_its_largest_lesion_at_the_challenges_boundaries(
    extent_um: float | None, expected: str
) -> None:
    assert node_label(extent_um, REAL) == expected


def test_thresholds_scale_with_a_small_section_and_never_grow() -> None:
    assert (REAL.itc_max_um, REAL.macro_min_um) == (200.0, 2000.0)
    assert label_scale(1024.0) == pytest.approx(0.128)
    small = NodeThresholds.for_section(1024.0)  # the synthetic defaults: 4096 px x 0.25 µm
    assert (small.itc_max_um, small.macro_min_um) == pytest.approx((25.6, 256.0))
    assert node_label(25.6, small) == "itc" and node_label(25.61, small) == "micro"
    assert node_label(256.0, small) == "micro" and node_label(256.1, small) == "macro"
    assert NodeThresholds.for_section(20_000.0) == REAL  # a larger section: the real ones
    with pytest.raises(ValueError):
        label_scale(0.0)
    with pytest.raises(ValueError, match="itc_max_um < macro_min_um"):
        NodeThresholds(itc_max_um=300.0, macro_min_um=200.0)


@pytest.mark.parametrize(
    ("nodes", "stage"),
    [
        (["negative"] * 5, "pN0"),
        (["itc", "negative", "negative", "negative", "negative"], "pN0(i+)"),
        (["itc"] * 5, "pN0(i+)"),  # isolated tumour cells are not metastases
        (["micro", "itc", "negative", "negative", "negative"], "pN1mi"),
        (["micro"] * 5, "pN1mi"),  # no macro: pN1mi however many nodes
        (["macro", "negative", "negative", "negative", "negative"], "pN1"),
        (["macro", "micro", "micro", "itc", "itc"], "pN1"),  # 3 positive nodes
        (["macro", "micro", "micro", "micro", "itc"], "pN2"),  # 4 positive nodes
        (["macro"] * 5, "pN2"),
        (["macro", "negative", "negative"], "pN1"),  # fewer than five nodes read
        ([], "pN0"),
    ],
)
def test_the_pn_stage_follows_the_challenges_rules(nodes: list[str], stage: str) -> None:
    assert patient_stage(nodes) == stage
    assert patient_stage(reversed(nodes)) == stage  # the order of nodes does not matter


def test_the_stage_depends_on_the_nodes_not_their_order_and_never_falls_as_a_node_grows() -> None:
    # properties the challenge's rules have, over every combination of five nodes (the
    # examples above pin the rules themselves): a patient's stage is a function of the
    # set of node classes, and a node upgraded (negative -> itc -> micro -> macro) never
    # lowers it
    rank = {stage: i for i, stage in enumerate(PATIENT_STAGES)}
    for nodes in itertools.combinations_with_replacement(NODE_LABELS, 5):
        stage = patient_stage(nodes)
        assert {patient_stage(p) for p in itertools.permutations(nodes)} == {stage}
        for i, label in enumerate(nodes):
            for bigger in NODE_LABELS[NODE_LABELS.index(label) + 1 :]:
                grown = (*nodes[:i], bigger, *nodes[i + 1 :])
                assert rank[patient_stage(grown)] >= rank[stage], (nodes, grown)
    assert len(PATIENT_STAGES) == 5


def test_an_unknown_class_is_refused() -> None:
    with pytest.raises(ValueError, match="tumour"):
        patient_stage(["negative", "tumour"])
