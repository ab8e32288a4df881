"""One centre's patch store: plan which patches it holds, then read and write them.

The plan (:func:`plan_center`) samples ``patches_per_class`` patches of each label over
the centre's slides and puts the test patients' patches in the test split, the patients
being chosen from the catalogue before any pixel is read (:func:`catalogue_test_patients`);
:func:`write_center_store` reads the planned pixels and writes ``center_{c}.h5``
atomically. A slide whose pixels turn out to be unreadable at this stage is dropped and
the centre re-planned without it: the stable sample replaces its patches with the next
ones of the other slides of the same split, and no patient or patch changes split, so one
bad slide costs its own patches only (its split shrinks only where its other slides run
out).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from plumbing.errors import PipelineError
from wsi.catalogue import SlideRecord
from wsi.params import PatchParams, SamplingParams
from wsi.patches import LABEL_NAMES, labels_offered
from wsi.sampling import (
    PatchSelection,
    SlidePatches,
    available_per_label,
    sample_balanced,
    split_patients,
)
from wsi.slide import SlideReadError
from wsi.store.provenance import source_files
from wsi.store.schema import PatchBatch, StoreAttrs
from wsi.store.writer import PatchStoreWriter

log = logging.getLogger(__name__)

PatchReader = Callable[[Path, int, np.ndarray, int], np.ndarray]
"""(slide path, level, level-0 coords (N, 2), patch size) -> (N, size, size, 3) uint8."""


class InsufficientPatchesError(PipelineError):
    """A centre's slides cannot supply the requested number of patches of every label."""

    def __init__(self, center: int, found: dict[str, int], requested: int) -> None:
        detail = ", ".join(f"{count} {name}" for name, count in found.items())
        scarcest = min(found.values(), default=0)
        hint = f" (shortfall: take_available would take {scarcest} of each)" if scarcest else ""
        super().__init__(
            f"centre {center}",
            f"can supply only {detail} patches; {requested} of each requested{hint}",
        )
        self.center = center
        self.found = found
        self.requested = requested


@dataclass(frozen=True)
class CenterPlan:
    """The patches a centre's store will hold, and which are test."""

    center: int
    selection: PatchSelection
    is_test: np.ndarray

    def split(self, name: str) -> PatchSelection:
        return self.selection.subset(self.is_test if name == "test" else ~self.is_test)


@dataclass
class CenterResult:
    """What building a centre produced: the plan and the slides dropped on the way."""

    plan: CenterPlan
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (slide id, error)


def params_hash(patch: PatchParams, sampling: SamplingParams) -> str:
    """Short, stable digest of every parameter that shapes a store's content."""
    content = {"patch": patch.model_dump(), "sampling": sampling.model_dump()}
    text = json.dumps(content, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def patches_to_take(center: int, slides: Sequence[SlidePatches], sampling: SamplingParams) -> int:
    """Patches of each label the centre's store will hold: ``patches_per_class``, or with
    ``shortfall="take_available"`` as many as its scarcest label offers.

    Raises :class:`InsufficientPatchesError` (saying how many each label has) when the
    centre falls short and ``shortfall`` is ``"fail"``, or when a label has none at all.
    Needs only the candidates, so the flow checks every centre before writing any store.
    """
    available = available_per_label(
        slides, labels=tuple(LABEL_NAMES), max_per_slide=sampling.max_per_slide
    )
    scarcest = min(available.values())
    if scarcest >= sampling.patches_per_class:
        return sampling.patches_per_class
    found = {LABEL_NAMES[label]: count for label, count in available.items()}
    if sampling.shortfall == "fail" or scarcest == 0:
        raise InsufficientPatchesError(center, found, sampling.patches_per_class)
    log.warning(
        "centre %d: %s available, %d of each requested; taking %d of each (take_available)",
        center,
        found,
        sampling.patches_per_class,
        scarcest,
    )
    return scarcest


def plan_center(
    center: int,
    slides: Sequence[SlidePatches],
    sampling: SamplingParams,
    test_patients: Collection[str] | None = None,
) -> CenterPlan:
    """A balanced sample over ``slides``, with ``test_patients``' patches as the test split.

    ``test_patients`` should come from the catalogue (:func:`catalogue_test_patients`), so
    that a slide failing now moves no patient; without it, the patients are split from
    the labels the given slides offer.
    """
    per_class = patches_to_take(center, slides, sampling)
    selection = sample_balanced(
        slides,
        per_class,
        labels=tuple(LABEL_NAMES),
        max_per_slide=sampling.max_per_slide,
        seed=sampling.seed,
    )
    if test_patients is None:
        test_patients = slides_test_patients(slides, sampling)
    is_test = np.isin(selection.patients, sorted(test_patients))
    return _checked(CenterPlan(center=center, selection=selection, is_test=is_test))


def _checked(plan: CenterPlan) -> CenterPlan:
    for name in ("train", "test"):
        counts = plan.split(name).label_counts(len(LABEL_NAMES))
        if min(counts) == 0:
            log.warning("centre %d: the %s split has %s patches", plan.center, name,
                        dict(zip(LABEL_NAMES.values(), counts, strict=True)))  # fmt: skip
    return plan


def slides_test_patients(
    slides: Sequence[SlidePatches], sampling: SamplingParams
) -> frozenset[str]:
    """The test patients split from the labels ``slides`` offer (when no catalogue is
    given: :func:`catalogue_test_patients` is the one to prefer)."""
    return split_patients(
        [slide.patient for slide in slides],
        [set(np.unique(slide.labels).tolist()) & set(LABEL_NAMES) for slide in slides],
        test_fraction=sampling.test_fraction,
        seed=sampling.seed,
    )


def replan_within_splits(
    planned: CenterPlan,
    slides: Sequence[SlidePatches],
    sampling: SamplingParams,
    test_patients: Collection[str],
) -> CenterPlan:
    """``planned`` drawn again over ``slides`` (some of its slides dropped), each split
    from its own patients' slides only: a split refills the patches of each label it had
    from its other slides, in the stable order of :func:`wsi.sampling.sample_balanced` (so
    every remaining slide keeps the patches it gave), and shrinks where they run out. No
    patch moves between train and test, whichever split the dropped slide was in."""
    test = set(test_patients)
    parts, is_test = [], []
    for name in ("train", "test"):
        own = [slide for slide in slides if (slide.patient in test) == (name == "test")]
        for label, count in enumerate(planned.split(name).label_counts(len(LABEL_NAMES))):
            part = sample_balanced(
                own, count, labels=(label,), max_per_slide=sampling.max_per_slide,
                seed=sampling.seed,
            )  # fmt: skip
            if len(part) < count:
                log.warning("centre %d: the %s split has %d of its %d %s patches left",
                            planned.center, name, len(part), count, LABEL_NAMES[label])  # fmt: skip
            parts.append(part)
            is_test.append(np.full(len(part), name == "test"))
    selection = PatchSelection.concatenate(parts)
    order = selection.sorting_order()
    return _checked(CenterPlan(planned.center, selection.subset(order),
                               np.concatenate(is_test)[order]))  # fmt: skip


def catalogue_test_patients(
    records: Sequence[SlideRecord], patch: PatchParams, sampling: SamplingParams
) -> frozenset[str]:
    """The test patients of a centre's catalogue records, stratified by what they offer
    and by their pN stage where the labels file gives it (see
    :func:`wsi.sampling.split_patients`): decided before any slide is read."""
    return split_patients(
        [record.patient_id for record in records],
        [
            labels_offered(record.node_label, record.annotation is not None, patch.healthy_source)
            for record in records
        ],
        test_fraction=sampling.test_fraction,
        seed=sampling.seed,
        stages={r.patient_id: r.patient_stage for r in records if r.patient_stage is not None},
    )


def write_plan(
    plan: CenterPlan,
    slide_paths: dict[str, Path],
    out_path: str | os.PathLike[str],
    attrs: StoreAttrs,
    read_patches: PatchReader,
    level: int,
    chunk_size: int = 64,
) -> None:
    """Read the planned patches slide by slide, ``chunk_size`` at a time, and write the
    store atomically."""
    sizes = {name: len(plan.split(name)) for name in ("train", "test")}
    with PatchStoreWriter(out_path, attrs, sizes) as writer:
        for name in ("train", "test"):
            split = plan.split(name)
            start = 0
            for slide_id in np.unique(split.slide_ids):
                slide_rows = np.flatnonzero(split.slide_ids == slide_id)
                # bounded memory: a slide with thousands of patches is read in chunks
                for first in range(0, len(slide_rows), chunk_size):
                    rows = slide_rows[first : first + chunk_size]
                    images = read_patches(
                        slide_paths[slide_id], level, split.coords[rows], attrs.patch_size
                    )
                    batch = PatchBatch(
                        images=images,
                        labels=split.labels[rows],
                        patients=split.patients[rows].tolist(),
                        slides=split.slide_ids[rows].tolist(),
                        coords=split.coords[rows],
                    )
                    writer.write(name, start, batch)
                    start += len(rows)


def write_center_store(
    center: int,
    slides: Sequence[SlidePatches],
    patch: PatchParams,
    sampling: SamplingParams,
    out_path: str | os.PathLike[str],
    read_patches: PatchReader,
    *,
    mpp: float,
    test_patients: Collection[str] | None = None,
) -> CenterResult:
    """Plan, read and write one centre's store, dropping slides whose pixels fail to read.

    A dropped slide's patches are replaced by the next ones of the other slides of its
    split (the sample is stable, see :func:`replan_within_splits`): no patient changes
    split, since ``test_patients`` is fixed up front, and no patch moves between splits.
    """
    remaining = list(slides)
    dropped: list[tuple[str, str]] = []
    if test_patients is None:
        test_patients = slides_test_patients(slides, sampling)
    first = plan = plan_center(center, remaining, sampling, test_patients)
    # each slide read once for its digest, whatever the refills below (a full read)
    by_name = {source.name: source for source in source_files(s.path for s in remaining)}
    while True:
        if dropped:  # refill each split from its own slides: no patch changes split
            plan = replan_within_splits(first, remaining, sampling, test_patients)
        paths = {slide.slide_id: slide.path for slide in remaining}
        sources = {by_name[Path(paths[s]).name] for s in plan.selection.slide_ids}
        attrs = StoreAttrs(
            center=center,
            patch_size=patch.patch_size,
            level=patch.level,
            mpp=mpp,
            n_classes=len(LABEL_NAMES),
            params_hash=params_hash(patch, sampling),
            sources=tuple(sorted(sources, key=lambda source: source.name)),
        )
        try:
            write_plan(plan, paths, out_path, attrs, read_patches, patch.level)
        except SlideReadError as error:
            bad = next(s.slide_id for s in remaining if Path(s.path) == error.path)
            log.warning("centre %d: dropping %s: %s", center, bad, error)
            dropped.append((bad, str(error)))
            remaining = [s for s in remaining if s.slide_id != bad]
            continue
        return CenterResult(plan=plan, dropped=dropped)
