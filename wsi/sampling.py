"""Choosing a centre's patches: balanced per label, spread over slides, split by patient.

Both steps are deterministic for a seed and independent of the order in which slides
were processed, and both are stable: which patches a slide gives, and which split a
patient lands in, do not depend on the centre's other slides (see each function).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wsi.nodes import PATIENT_STAGES


@dataclass(frozen=True)
class SlidePatches:
    """A slide's usable candidates: level-0 coordinates and their labels."""

    slide_id: str
    patient: str
    path: Path
    coords: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        if len(self.coords) != len(self.labels):
            raise ValueError(
                f"{self.slide_id}: {len(self.coords)} coords but {len(self.labels)} labels"
            )


@dataclass(frozen=True)
class PatchSelection:
    """Chosen patches, one entry per patch, aligned arrays."""

    slide_ids: np.ndarray
    patients: np.ndarray
    coords: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, mask: np.ndarray) -> PatchSelection:
        return PatchSelection(
            self.slide_ids[mask], self.patients[mask], self.coords[mask], self.labels[mask]
        )

    def sorting_order(self) -> np.ndarray:
        """The indices that order the patches by slide, then row, then column."""
        return np.lexsort((self.coords[:, 0], self.coords[:, 1], self.slide_ids))

    def sorted(self) -> PatchSelection:
        """Ordered by slide, then row, then column: reading order, and a stable store order."""
        return self.subset(self.sorting_order())

    @staticmethod
    def concatenate(parts: Sequence[PatchSelection]) -> PatchSelection:
        """The patches of ``parts``, one after another."""
        return PatchSelection(
            np.concatenate([p.slide_ids for p in parts]).astype(str),
            np.concatenate([p.patients for p in parts]).astype(str),
            np.concatenate([p.coords.reshape(-1, 2) for p in parts]).astype(np.int64),
            np.concatenate([p.labels for p in parts]).astype(np.int64),
        )

    def label_counts(self, n_classes: int) -> list[int]:
        return np.bincount(self.labels, minlength=n_classes).tolist()


def stable_key(*parts: object) -> int:
    """A 64-bit integer digest of ``parts``: the same on every machine, run and Python
    (unlike ``hash``), so it can seed per-slide and per-patient draws."""
    text = "\x1f".join(map(str, parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def sample_balanced(
    slides: Sequence[SlidePatches],
    patches_per_class: int,
    *,
    labels: Sequence[int] = (0, 1),
    max_per_slide: int | None = None,
    seed: int = 0,
) -> PatchSelection:
    """Up to ``patches_per_class`` patches of each label, spread evenly over slides.

    For each label, slides take turns giving one candidate at a time, so a slide gives
    its k-th patch only once every slide with candidates left has given k - 1; no slide
    gives more than ``max_per_slide`` of one label. A label short of candidates yields
    fewer patches; the caller decides whether that is fatal.

    Stability: a slide's order of candidates, and its place in the turns, are drawn from
    (``seed``, slide id, label) alone. So what one slide gives is always a prefix of the
    same sequence: when another slide of the centre fails or is added, every other slide
    keeps the patches it gave and only gives more (or fewer) from the end of its sequence.
    """
    slides = sorted(slides, key=lambda slide: slide.slide_id)
    cap = max_per_slide if max_per_slide is not None else patches_per_class
    chosen: list[tuple[int, int]] = []  # (slide index, candidate index)
    for label in labels:
        pools = []
        for slide in slides:
            rng = np.random.default_rng(stable_key(seed, slide.slide_id, label))
            pools.append(rng.permutation(np.flatnonzero(slide.labels == label))[:cap])
        turn_order = sorted(
            range(len(slides)), key=lambda i: stable_key(seed, "turn", slides[i].slide_id, label)
        )
        taken = 0
        for depth in range(max((len(pool) for pool in pools), default=0)):
            for slide_index in turn_order:
                if taken == patches_per_class:
                    break
                if depth < len(pools[slide_index]):
                    chosen.append((slide_index, int(pools[slide_index][depth])))
                    taken += 1
    if not chosen:
        return PatchSelection(
            np.array([], dtype=str),
            np.array([], dtype=str),
            np.zeros((0, 2), dtype=np.int64),
            np.array([], dtype=np.int64),
        )
    return PatchSelection(
        slide_ids=np.array([slides[s].slide_id for s, _ in chosen]),
        patients=np.array([slides[s].patient for s, _ in chosen]),
        coords=np.array([slides[s].coords[c] for s, c in chosen], dtype=np.int64),
        labels=np.array([slides[s].labels[c] for s, c in chosen], dtype=np.int64),
    ).sorted()


def available_per_label(
    slides: Sequence[SlidePatches],
    *,
    labels: Sequence[int] = (0, 1),
    max_per_slide: int | None = None,
) -> dict[int, int]:
    """How many patches of each label ``sample_balanced`` could take at most."""
    cap = max_per_slide if max_per_slide is not None else np.iinfo(np.int64).max
    return {
        label: int(sum(min(int((slide.labels == label).sum()), cap) for slide in slides))
        for label in labels
    }


def split_patients(
    patients: Sequence[str],
    offers: Sequence[Collection[int]],
    *,
    test_fraction: float,
    seed: int = 0,
    stages: Mapping[str, str] | None = None,
) -> frozenset[str]:
    """The test patients of a centre, decided per patient from what the catalogue says.

    ``offers[i]`` holds the labels slide i of ``patients[i]`` can give; ``stages`` maps a
    patient to its pN stage where the labels file gives it. Patients are stratified by the
    union of their slides' labels (tumour and healthy, tumour only, healthy only), so each
    kind of patient is in both splits when it has two or more members: a stratum of n
    gives ``round(test_fraction * n)`` patients to test, at least one and never all. Within
    a stratum the test patients are a *systematic sample of the stage-sorted list*: its
    patients ordered by stage (:data:`wsi.nodes.PATIENT_STAGES`' order, unknown last), then
    by a key drawn from (``seed``, patient id), those at positions
    ``floor((k + u) * n / n_test)`` for k = 0 .. n_test - 1, the start ``u`` in [0, 1) drawn
    from (``seed``, the stratum's first patient id). Every run of patients of one stage thus
    gives ``floor`` or ``ceil`` of ``test_fraction`` times its size to test: stages are
    represented in proportion where the counts allow, and a lone patient of a stage (one
    pN2, say) is in test for a ``test_fraction`` of the seeds rather than never. When every
    stratum is a single patient, they are split as one stratum.

    Stability: no pixel is read, so a slide that fails later moves no patient, and a slide
    added to a patient moves nobody unless it changes what that patient offers. A new
    patient moves patients of its own stratum only (the positions after its own shift).
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if len(patients) != len(offers):
        raise ValueError(f"{len(patients)} slides' patients but {len(offers)} offers")
    offered: dict[str, frozenset[int]] = {}
    for patient, labels in zip(patients, offers, strict=True):
        offered[patient] = offered.get(patient, frozenset()) | frozenset(labels)
    strata = [[p for p in offered if offered[p] == labels]
              for labels in sorted(set(offered.values()), key=sorted)]  # fmt: skip
    if all(len(members) < 2 for members in strata):
        strata = [list(offered)]
    test: set[str] = set()
    for members in strata:
        test.update(_systematic_sample(members, test_fraction, seed, stages or {}))
    return frozenset(test)


def _systematic_sample(
    members: Sequence[str], fraction: float, seed: int, stages: Mapping[str, str]
) -> list[str]:
    """One stratum's test patients (:func:`split_patients`); none of a single patient."""
    n = len(members)
    if n < 2:
        return []
    order = {stage: i for i, stage in enumerate(PATIENT_STAGES)}
    ordered = sorted(members, key=lambda p: (order.get(stages.get(p, ""), len(order)),
                                             stable_key(seed, "split", p), p))  # fmt: skip
    n_test = min(max(round(fraction * n), 1), n - 1)
    start = stable_key(seed, "split-start", min(members)) / 2.0**64
    return [ordered[int((k + start) * n / n_test)] for k in range(n_test)]
