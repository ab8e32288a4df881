"""Choosing a centre's patches: balanced per label, spread over slides, split by patient.

Both steps are deterministic for a seed and independent of the order in which slides
were processed (inputs are sorted by slide id first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


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

    def sorted(self) -> PatchSelection:
        """Ordered by slide, then row, then column: reading order, and a stable store order."""
        order = np.lexsort((self.coords[:, 0], self.coords[:, 1], self.slide_ids))
        return self.subset(order)

    def label_counts(self, n_classes: int) -> list[int]:
        return np.bincount(self.labels, minlength=n_classes).tolist()


def sample_balanced(
    slides: Sequence[SlidePatches],
    patches_per_class: int,
    *,
    labels: Sequence[int] = (0, 1),
    max_per_slide: int | None = None,
    seed: int = 0,
) -> PatchSelection:
    """Up to ``patches_per_class`` patches of each label, spread evenly over slides.

    For each label, slides take turns (in a seeded order) giving one random candidate at
    a time, so a slide gives its k-th patch only once every slide with candidates left
    has given k - 1; no slide gives more than ``max_per_slide`` of one label. A label
    short of candidates yields fewer patches; the caller decides whether that is fatal.
    """
    rng = np.random.default_rng(seed)
    slides = sorted(slides, key=lambda slide: slide.slide_id)
    cap = max_per_slide if max_per_slide is not None else patches_per_class
    chosen: list[tuple[int, int]] = []  # (slide index, candidate index)
    for label in labels:
        pools = [rng.permutation(np.flatnonzero(slide.labels == label))[:cap] for slide in slides]
        turn_order = rng.permutation(len(slides))
        taken = 0
        for depth in range(max((len(pool) for pool in pools), default=0)):
            for slide_index in turn_order:
                if taken == patches_per_class:
                    break
                if depth < len(pools[slide_index]):
                    chosen.append((int(slide_index), int(pools[slide_index][depth])))
                    taken += 1
    if not chosen:
        return PatchSelection(
            np.array([], dtype=str), np.array([], dtype=str),
            np.zeros((0, 2), dtype=np.int64), np.array([], dtype=np.int64),
        )
    return PatchSelection(
        slide_ids=np.array([slides[s].slide_id for s, _ in chosen]),
        patients=np.array([slides[s].patient for s, _ in chosen]),
        coords=np.array([slides[s].coords[c] for s, c in chosen], dtype=np.int64),
        labels=np.array([slides[s].labels[c] for s, c in chosen], dtype=np.int64),
    ).sorted()


def split_by_patient(
    patients: np.ndarray,
    labels: np.ndarray,
    *,
    test_fraction: float,
    seed: int = 0,
    trials: int = 4096,
) -> np.ndarray:
    """Boolean ``is_test`` per patch, with every patient wholly in one split.

    Searches seeded random orderings of the patients; each ordering proposes its prefix
    whose patch count is closest to ``test_fraction`` of all patches. The proposal kept
    is the one that first has every label present in both splits (when any proposal
    does), then the smallest distance to the target count. At least one patient goes to
    each split when there are two or more.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    unique_patients = np.unique(patients)
    n_patients = len(unique_patients)
    if n_patients < 2:
        return np.zeros(len(patients), dtype=bool)
    present = np.unique(labels)
    # counts[p, l]: patches of label l from patient p
    patient_index = np.searchsorted(unique_patients, patients)
    label_index = np.searchsorted(present, labels)
    counts = np.zeros((n_patients, len(present)), dtype=np.int64)
    np.add.at(counts, (patient_index, label_index), 1)
    totals = counts.sum(axis=0)
    target = test_fraction * len(patients)

    rng = np.random.default_rng(seed)
    best_key: tuple[int, float] | None = None
    best_test: np.ndarray | None = None
    for _ in range(trials):
        order = rng.permutation(n_patients)
        prefix_counts = np.cumsum(counts[order], axis=0)[:-1]  # 1 .. n-1 test patients
        sizes = prefix_counts.sum(axis=1)
        both = ((prefix_counts > 0) & (prefix_counts < totals)).all(axis=1)
        keys = np.abs(sizes - target) + np.where(both, 0, len(patients) + 1)
        cut = int(np.argmin(keys))
        key = (int(not both[cut]), float(abs(sizes[cut] - target)))
        if best_key is None or key < best_key:
            best_key = key
            best_test = np.sort(order[: cut + 1])
    assert best_test is not None
    return np.isin(patient_index, best_test)
