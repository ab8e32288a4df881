"""The preprocessing steps as plain functions: one slide's candidates and one centre's
store, with its report (:mod:`wsi.summary`). Failures carry the slide, the step and the
reason, so that an orchestrator can record them and carry on with the other slides.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from plumbing.atomic import write_json
from plumbing.errors import PipelineError
from wsi.annotations import AnnotationError, check_regions_on_slide, read_asap
from wsi.cache import CandidateCache
from wsi.catalogue import CatalogueProblem, SlideRecord
from wsi.center import (
    CenterResult,
    InsufficientPatchesError,
    SamplingParams,
    catalogue_test_patients,
    patches_to_take,
    write_center_store,
)
from wsi.freshness import StoreInputs, record_inputs
from wsi.patches import (
    LABEL_NAMES,
    UNUSABLE,
    NoLesionPatchError,
    NoTissueError,
    PatchError,
    PatchParams,
    compute_candidates,
    failure_reason,
)
from wsi.sampling import SlidePatches
from wsi.slide import Backend, SlideReadError, is_synthetic_slide, open_slide
from wsi.store.schema import store_path
from wsi.summary import CenterReport, SlideFailure, report_path

log = logging.getLogger(__name__)


class SlideStepError(PipelineError):
    def __init__(self, failure: SlideFailure) -> None:
        super().__init__(f"{failure.slide} [{failure.stage}]", failure.error)
        self.failure = failure


# The step a slide failed at, by error type; the most specific type comes first.
_STAGE_OF_ERROR: tuple[tuple[type[Exception], str], ...] = (
    (AnnotationError, "annotation"),
    (SlideReadError, "open"),
    (NoTissueError, "tissue"),
    (NoLesionPatchError, "lesions"),
    (PatchError, "candidates"),
)


def catalogue_failures(
    problems: Sequence[CatalogueProblem], centers: Sequence[int]
) -> list[SlideFailure]:
    """The catalogue's problems that concern ``centers`` (or no centre in particular), as
    failures of step ``catalogue`` naming the file (and line) concerned."""
    wanted = set(centers)
    return [
        SlideFailure(
            f"{problem.path}:{problem.line}" if problem.line is not None else str(problem.path),
            "catalogue",
            problem.message,
            problem.center,
        )
        for problem in problems
        if problem.center is None or problem.center in wanted
    ]


def _stage_of(error: Exception) -> str:
    return next((name for kind, name in _STAGE_OF_ERROR if isinstance(error, kind)), "candidates")


def slide_patches(
    record: SlideRecord,
    params: PatchParams,
    cache: CandidateCache | None = None,
    backend: Backend = "auto",
) -> SlidePatches:
    """The usable candidates of one slide, from the cache when its inputs are unchanged.

    Raises :class:`SlideStepError` naming the step that failed.
    """
    if cache is not None:
        cached = cache.load(record, params)
        if cached is not None:
            return cached
    try:
        annotations = read_asap(record.annotation) if record.annotation else None
        with open_slide(record.path, backend) as slide:
            if annotations is not None:  # no mislabelled patch from an implausible polygon
                check_regions_on_slide(annotations, slide.dimensions)
            candidates = compute_candidates(
                slide, annotations, record.node_label, params, slide_id=record.slide_id
            )
    except Exception as error:  # any failure of one slide, MemoryError too, is that slide's
        raise SlideStepError(
            SlideFailure(record.slide_id, _stage_of(error), failure_reason(error), record.center)
        ) from error
    usable = candidates.labels != UNUSABLE
    patches = SlidePatches(
        slide_id=record.slide_id,
        patient=record.patient_id,
        path=record.path,
        coords=candidates.coords[usable],
        labels=candidates.labels[usable].astype(np.int64),
    )
    if cache is not None:
        cache.save(record, params, patches)
    return patches


@dataclass
class SlideOutcomes:
    """Every slide's outcome, by centre: the slides that gave candidates, and the failures
    each centre's report will tell (its catalogue problems and failed slides); a
    catalogue problem that names no centre is no centre's (``unplaced``)."""

    patches: dict[int, list[SlidePatches]] = field(default_factory=lambda: defaultdict(list))
    failures: dict[int, list[SlideFailure]] = field(default_factory=lambda: defaultdict(list))
    unplaced: list[SlideFailure] = field(default_factory=list)


def group_outcomes(
    records: Sequence[SlideRecord],
    outcomes: Sequence[SlidePatches | SlideFailure],
    catalogue_problems: Sequence[SlideFailure],
) -> SlideOutcomes:
    """``outcomes[i]`` (:func:`slide_patches` of ``records[i]``) and the catalogue's
    problems, grouped by centre."""
    grouped = SlideOutcomes()
    for problem in catalogue_problems:
        if problem.center is None:
            grouped.unplaced.append(problem)
        else:
            grouped.failures[problem.center].append(problem)
    for record, outcome in zip(records, outcomes, strict=True):
        if isinstance(outcome, SlidePatches):
            grouped.patches[record.center].append(outcome)
        else:
            grouped.failures[record.center].append(outcome)
    return grouped


def shortfalls(
    centers: Sequence[int],
    patches: Mapping[int, Sequence[SlidePatches]],
    sampling: Callable[[int], SamplingParams],
) -> dict[int, str]:
    """The centres whose slides cannot give the patches ``sampling(center)`` asks for, and
    why: checked for every centre before any store is written, so that a short centre is
    not built and the others are."""
    short = {}
    for center in centers:
        try:
            patches_to_take(center, list(patches.get(center, ())), sampling(center))
        except InsufficientPatchesError as error:
            short[center] = str(error)
    return short


def record_failed_center(
    center: int,
    error: str,
    out_dir: str | os.PathLike[str],
    slide_failures: Sequence[SlideFailure] = (),
) -> CenterReport:
    """Write a ``"failed"`` report for ``center``: why, and the store of an earlier build
    it kept, if any. A failed (re)build never removes a finished store (on real slides,
    hours of work): the store and the record of the inputs it was built from stay as they
    were, and since its report is now this failure, the next run finds the store stale
    (:func:`wsi.freshness.stale_reason`) and builds it again; no summary counts it as this
    run's result."""
    path = store_path(out_dir, center)
    kept = path.is_file()
    if kept:
        log.warning("centre %d failed: its earlier store %s is kept as it was", center, path)
    report = CenterReport(
        center=center,
        counts={},
        patients={},
        store=path.name if kept else "",
        failures=[*slide_failures, SlideFailure(f"center_{center}", "centre", error, center)],
        status="failed",
        error=error,
    )
    write_json(report_path(out_dir, center), report.to_json(), sort_keys=True)
    return report


RESOLUTION_TOLERANCE = 0.1
"""How far, as a fraction, a slide's µm/px at the patch level may lie from its centre's
and still give patches of the centre's scale. One scanner model's slides differ by a few
percent; a slide scanned at another magnification (0.5 µm/px among 0.25) is off by 100 %
and would put patches of twice the tissue in a store that says one scale."""


def level_resolutions(
    slides: Sequence[SlidePatches], level: int, backend: Backend = "auto"
) -> tuple[dict[str, float], dict[str, SlideReadError]]:
    """Each slide's µm/px at ``level`` (slide id -> value), and the slides that no longer
    open or say no resolution, with the error (their candidates were computed earlier: a
    file replaced or removed since)."""
    resolutions: dict[str, float] = {}
    unreadable: dict[str, SlideReadError] = {}
    for record in slides:
        try:
            with open_slide(record.path, backend) as slide:
                mpp = slide.level_mpp(level)
            if mpp is None:
                raise SlideReadError(record.path, {backend: "no resolution (mpp) in the file"})
        except SlideReadError as error:
            unreadable[record.slide_id] = error
            continue
        resolutions[record.slide_id] = mpp
    return resolutions, unreadable


def centre_scale(
    resolutions: Mapping[str, float], level: int, tolerance: float = RESOLUTION_TOLERANCE
) -> tuple[float, dict[str, str]]:
    """A centre's µm/px at ``level`` from its slides' (``resolutions``, slide id -> value,
    at least one), and the slides off that scale, slide id -> why.

    The centre's is the lower median (a value one slide has, the same whatever the
    order); a slide further than ``tolerance`` (a fraction) from it is off."""
    values = sorted(resolutions.values())
    centre = values[(len(values) - 1) // 2]
    off = {
        slide_id: (f"{mpp:.4g} µm/px at level {level}, the centre's other slides "
                   f"{centre:.4g}: its patches would be of another scale")
        for slide_id, mpp in resolutions.items()
        if abs(mpp - centre) > tolerance * centre
    }  # fmt: skip
    return centre, off


def center_store(
    center: int,
    slides: Sequence[SlidePatches],
    patch: PatchParams,
    sampling: SamplingParams,
    out_dir: str | os.PathLike[str],
    backend: Backend = "auto",
    slide_failures: Sequence[SlideFailure] = (),
    records: Sequence[SlideRecord] | None = None,
    inputs: StoreInputs | None = None,
) -> CenterReport:
    """Build ``out_dir/center_{c}.h5`` and its report (also written beside it as JSON).

    ``slide_failures`` are the centre's slides that failed earlier steps; the report
    keeps them with those dropped here, so each centre's JSON tells its whole story.
    ``records`` are the centre's catalogue entries, from which the patients are split
    (so that slides failing cannot move a patient); without them the patients are
    split from what ``slides`` offer. ``inputs``, read before any slide of this build,
    are recorded beside the store once it and its report are written
    (:func:`wsi.freshness.record_inputs`), so that a later run can tell it is up to date.

    Raises :class:`~wsi.center.InsufficientPatchesError` when the slides cannot supply
    ``patches_per_class`` of each label.
    """
    from wsi.tiles import read_patches

    if not slides:
        raise InsufficientPatchesError(
            center, dict.fromkeys(LABEL_NAMES.values(), 0), sampling.patches_per_class
        )

    def reader(path: Path, level: int, coords: np.ndarray, size: int) -> np.ndarray:
        return read_patches(path, level, coords, size, backend=backend)

    path = store_path(out_dir, center)
    test_patients = (
        catalogue_test_patients(records, patch, sampling) if records is not None else None
    )
    resolutions, unreadable = level_resolutions(slides, patch.level, backend)
    if not resolutions:
        raise unreadable[slides[0].slide_id]
    mpp, off_scale = centre_scale(resolutions, patch.level)
    for slide_id, why in {**unreadable, **off_scale}.items():
        log.warning("centre %d: dropping %s: %s", center, slide_id, why)
    slides = [s for s in slides if s.slide_id not in unreadable and s.slide_id not in off_scale]
    result: CenterResult = write_center_store(
        center, slides, patch, sampling, path, reader, mpp=mpp, test_patients=test_patients,
    )  # fmt: skip
    counts: dict[str, dict[str, int]] = {}
    patients: dict[str, list[str]] = {}
    for split in ("train", "test"):
        chosen = result.plan.split(split)
        counts[split] = dict(
            zip(LABEL_NAMES.values(), chosen.label_counts(len(LABEL_NAMES)), strict=True)
        )
        patients[split] = sorted(set(chosen.patients.tolist()))
    report = CenterReport(
        center=center,
        counts=counts,
        patients=patients,
        store=path.name,
        failures=[
            *slide_failures,
            *(SlideFailure(s, "open", str(e), center) for s, e in unreadable.items()),
            *(SlideFailure(s, "resolution", e, center) for s, e in off_scale.items()),
            *(SlideFailure(s, "pixels", e, center) for s, e in result.dropped),
        ],
        data_root=data_root_of(slides[0].path, center),
        synthetic=all(is_synthetic_slide(slide.path) for slide in slides),
        patch_size=patch.patch_size,
        level=patch.level,
        mpp=mpp,
    )
    write_json(report_path(out_dir, center), report.to_json(), sort_keys=True)
    if inputs is not None:
        record_inputs(out_dir, inputs)
    return report


def data_root_of(slide: str | os.PathLike[str], center: int) -> str | None:
    """The data root a slide of ``center`` lies under (the folder holding ``center_{c}``,
    as the path names it: relative stays relative); ``None`` outside that layout."""
    path = Path(slide)
    for parent in path.parents:
        if parent.name == f"center_{center}":
            return parent.parent.as_posix()
    return None
