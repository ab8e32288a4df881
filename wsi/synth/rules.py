"""Which patient gets which pN stage, and which node which label (the module docstring of
:mod:`wsi.synth` states the rules; the node and stage rules themselves live in
:mod:`wsi.nodes`).

**Stages first.** A patient's stage is drawn, then its nodes are drawn so that
:func:`wsi.nodes.patient_stage` gives it back. Per centre, ``tumour_patients_per_center``
of its patients (the first slots drawn; which patients hold them is shuffled) are drawn
among the stages with a macro-metastasis, pN1 and pN2, their weights renormalised, and
keep at least one negative node: each centre's guaranteed source of tumour patches (a
macro lesion) and of healthy ones (a negative slide), whatever its other patients draw.
The other patients' stages are drawn from ``stage_weights`` (:data:`~wsi.synth.config.
STAGE_WEIGHTS`) less what the slots already give (:func:`other_weights`), so that a
centre's expected stage counts are its patients times ``stage_weights``.

**Nodes of a stage**, of ``n`` (the nodes beside the positive ones are negative, or hold
ITCs with probability :data:`ITC_AMONG_OTHERS` where the stage allows it):

- ``pN0``: every node negative;
- ``pN0(i+)``: 1 or 2 ITC nodes;
- ``pN1mi``: 1 to 3 micro-metastases, no macro;
- ``pN1``: one macro-metastasis and 0 to 2 more positive nodes (micro or macro, even odds);
- ``pN2``: one macro-metastasis and 3 or more positive nodes, up to ``n`` (``n - 1`` when a
  negative node is kept).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial.distance import pdist

from wsi.catalogue import PATIENTS_PER_CENTER
from wsi.nodes import PATIENT_STAGES, patient_stage
from wsi.synth.config import _STREAM_LABELS, _STREAM_STAGES, TUMOUR_LABELS, SynthConfig

ITC_AMONG_OTHERS = 0.15
"""The chance that a node beside a patient's positive ones holds ITCs (pN1mi, pN1, pN2)."""
MACRO_STAGES: tuple[str, ...] = ("pN1", "pN2")
"""The stages with a macro-metastasis: where a centre's tumour patches come from."""


@dataclass(frozen=True)
class PatientDraw:
    """A patient's drawn stage, and whether it holds one of its centre's tumour slots."""

    stage: str
    tumour_slot: bool = False


def slide_id(patient: int, node: int) -> str:
    return f"patient_{patient:03d}_node_{node}"


def stage_fits(nodes: int, stage: str, keep_negative: bool = False) -> bool:
    """Whether ``nodes`` nodes can give ``stage`` (with one of them kept negative)."""
    usable = nodes - (1 if keep_negative else 0)
    return usable >= (4 if stage == "pN2" else 1) or (stage == "pN0" and nodes >= 1)


def draw_patients(config: SynthConfig) -> dict[int, PatientDraw]:
    """Every patient's stage (the module docstring), centre by centre from the stream
    (seed, centre)."""
    weights = np.asarray(config.stage_weights, dtype=np.float64)
    weights = weights / weights.sum()
    macro = np.array([s in MACRO_STAGES and stage_fits(config.nodes_per_patient, s, True)
                      for s in PATIENT_STAGES]) & (weights > 0)  # fmt: skip
    draws: dict[int, PatientDraw] = {}
    for center in config.centers:
        rng = np.random.default_rng([config.seed, center, _STREAM_STAGES])
        patients = [p for p in config.patients() if p // PATIENTS_PER_CENTER == center]
        forced = min(config.tumour_patients_per_center, len(patients)) if macro.any() else 0
        slot_weights = np.where(macro, weights, 0.0)
        if forced:
            slot_weights /= slot_weights.sum()
        others = other_weights(weights, slot_weights, forced, len(patients))
        drawn = [PatientDraw(_choose(rng, slot_weights), True) for _ in range(forced)]
        drawn += [PatientDraw(_choose(rng, others)) for _ in range(len(patients) - forced)]
        for slot, patient in zip(rng.permutation(len(patients)), patients, strict=True):
            draws[patient] = drawn[slot]
    return draws


def other_weights(
    weights: np.ndarray, slot_weights: np.ndarray, slots: int, patients: int
) -> np.ndarray:
    """The stage chances of a centre's patients outside its ``slots`` tumour slots, so that
    the centre's expected stage counts are ``patients * weights``: ``(patients * weights -
    slots * slot_weights) / (patients - slots)``, floored at 0 where the slots alone
    exceed a stage's share (then the macro stages are over-represented by the slots)."""
    if slots >= patients:
        return weights
    rest = np.clip(patients * weights - slots * slot_weights, 0.0, None)
    return rest / rest.sum() if rest.sum() > 0 else weights


def _choose(rng: np.random.Generator, weights: np.ndarray) -> str:
    return PATIENT_STAGES[int(rng.choice(len(PATIENT_STAGES), p=weights / weights.sum()))]


def assign_node_labels(config: SynthConfig, patient: int, draw: PatientDraw) -> tuple[str, ...]:
    """Labels of a patient's nodes that give back its drawn stage, from the stream
    (seed, patient)."""
    rng = np.random.default_rng([config.seed, patient, 0, _STREAM_LABELS])
    n = config.nodes_per_patient
    room = n - (1 if draw.tumour_slot else 0)  # nodes that may hold a lesion
    stage = draw.stage
    if stage == "pN0":
        positive: list[str] = []
    elif stage == "pN0(i+)":
        positive = ["itc"] * int(rng.integers(1, min(2, room) + 1))
    elif stage == "pN1mi":
        positive = ["micro"] * int(rng.integers(1, min(3, room) + 1))
    elif stage == "pN1":
        more = int(rng.integers(0, min(2, room - 1) + 1))
        positive = ["macro", *(str(rng.choice(TUMOUR_LABELS)) for _ in range(more))]
    elif stage == "pN2":
        more = int(rng.integers(3, room))  # 3 .. room - 1 more: 4 .. room positive
        positive = ["macro", *(str(rng.choice(TUMOUR_LABELS)) for _ in range(more))]
    else:
        raise ValueError(f"unknown stage {stage!r}")
    others = n - len(positive)
    itc_allowed = stage in ("pN1mi", *MACRO_STAGES)
    labels = positive + [
        "itc" if itc_allowed and rng.random() < ITC_AMONG_OTHERS else "negative"
        for _ in range(others)
    ]
    if draw.tumour_slot and "negative" not in labels:
        labels[len(positive)] = "negative"  # the slot's kept negative node
    ordered = tuple(labels[i] for i in rng.permutation(n))
    if patient_stage(ordered) != stage:  # the rules above and wsi.nodes disagree: a bug
        raise AssertionError(f"patient {patient}: nodes {ordered} do not give {stage}")
    return ordered


def assign_cohort(config: SynthConfig) -> dict[int, tuple[str, ...]]:
    """Every patient's node labels (:func:`draw_patients`, then :func:`assign_node_labels`)."""
    return {patient: assign_node_labels(config, patient, draw)
            for patient, draw in draw_patients(config).items()}  # fmt: skip


def max_feret_diameter(vertices: np.ndarray) -> float:
    """The largest distance between two vertices of a polygon."""
    if len(vertices) < 2:
        return 0.0
    return float(pdist(np.asarray(vertices, dtype=np.float64)).max())
