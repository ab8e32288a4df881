"""Patch candidates of a slide and their labels (the protocol of docs/files.md §3.2).

A candidate is a square of ``patch_size`` pixels at pyramid level ``level``, i.e. of
``extent = patch_size * downsample(level)`` level-0 pixels, on a grid that starts at the
slide's origin with step ``extent``; with the tile size a divisor or multiple of the
extent (512 on Camelyon), every candidate is aligned to the file's tile grid.

For each candidate, measured on the mask grid at ``mask_mpp`` microns per pixel:

- ``tissue_fraction``: fraction of the box inside the tissue mask;
- ``tumor_fraction``: fraction of the box inside tumour polygons minus carve-outs.

Labels (``HEALTHY`` = 0, ``TUMOR`` = 1, ``UNUSABLE`` = -1); every label needs
``tissue_fraction >= tissue_fraction_min``, then:

- annotated slide: ``TUMOR`` when ``tumor_fraction >= tumor_fraction_min``;
- slide labelled ``negative``: ``HEALTHY`` (labels are defined at the slide level);
- with ``healthy_source="outside_annotations"``, also ``HEALTHY`` on annotated slides
  other than ``itc`` ones where ``tumor_fraction == 0`` (ITC lesions are not exhaustively
  annotated, so their "outside" is not known to be healthy);
- everything else ``UNUSABLE``.

Memory is bounded by the mask: the tissue mask is made from the slide read a band at a
time (:meth:`wsi.slide.Slide.thumbnail_blocks`, :func:`wsi.masks.tissue_mask_from_blocks`),
and nothing here decodes level 0 unless the slide has no coarser level.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from plumbing.errors import PipelineError
from wsi.annotations import TUMOR_GROUPS, AnnotationError, SlideAnnotations
from wsi.masks import box_fractions, tissue_mask_from_blocks, tumor_mask
from wsi.params import HealthySource, PatchParams
from wsi.slide import REGION_PIXELS, Slide, SlideReadError

HEALTHY, TUMOR, UNUSABLE = 0, 1, -1
LABEL_NAMES: dict[int, str] = {HEALTHY: "healthy", TUMOR: "tumor"}

log = logging.getLogger(__name__)


class PatchError(PipelineError):
    """A slide cannot supply the patches it should; names the slide and why."""

    def __init__(self, slide: str, reason: str) -> None:
        super().__init__(slide, reason)
        self.slide = slide


class NoTissueError(PatchError):
    """The tissue mask of a slide is empty."""


class NoLesionPatchError(PatchError):
    """An annotated slide's lesions cover no candidate enough to make a tumour patch."""


@dataclass(frozen=True)
class SlideCandidates:
    """The candidate grid of one slide with per-candidate fractions and labels."""

    slide_id: str
    extent: int
    coords: np.ndarray
    tissue_fraction: np.ndarray
    tumor_fraction: np.ndarray
    labels: np.ndarray
    mask_downsample: float

    def __len__(self) -> int:
        return len(self.coords)

    def indices_of(self, label: int) -> np.ndarray:
        return np.flatnonzero(self.labels == label)

    def label_counts(self) -> dict[str, int]:
        return {name: int((self.labels == label).sum()) for label, name in LABEL_NAMES.items()}


def failure_reason(error: Exception) -> str:
    """What went wrong with one slide, in words (the slide itself is named elsewhere)."""
    if isinstance(error, PatchError):  # its text starts with the slide id, known already
        return error.reason
    if isinstance(error, AnnotationError | SlideReadError):
        return str(error)
    if isinstance(error, MemoryError):
        return f"out of memory ({error or 'no detail'})"
    return f"{type(error).__name__}: {error}"


def candidate_grid(dimensions: tuple[int, int], extent: int) -> np.ndarray:
    """Level-0 (x, y) top-left corners of all whole ``extent`` boxes, row by row."""
    width, height = dimensions
    xs = np.arange(0, width - extent + 1, extent, dtype=np.int64)
    ys = np.arange(0, height - extent + 1, extent, dtype=np.int64)
    grid_y, grid_x = np.meshgrid(ys, xs, indexing="ij")
    return np.stack([grid_x.ravel(), grid_y.ravel()], axis=1)


def assign_labels(
    tissue_fraction: np.ndarray,
    tumor_fraction: np.ndarray,
    *,
    node_label: str | None,
    annotated: bool,
    params: PatchParams,
) -> np.ndarray:
    """Labels by the rule in this module's docstring (``int8``, ``UNUSABLE`` = -1)."""
    labels = np.full(tissue_fraction.shape, UNUSABLE, dtype=np.int8)
    tissue = tissue_fraction >= params.tissue_fraction_min
    if node_label == "negative" and not annotated:
        labels[tissue] = HEALTHY
        return labels
    if annotated:
        labels[tissue & (tumor_fraction >= params.tumor_fraction_min)] = TUMOR
        if params.healthy_source == "outside_annotations" and node_label not in (None, "itc"):
            labels[tissue & (tumor_fraction == 0)] = HEALTHY
    return labels


def labels_offered(
    node_label: str | None, annotated: bool, healthy_source: HealthySource
) -> frozenset[int]:
    """The labels a slide can give, from the catalogue alone: the rule of
    :func:`assign_labels` without the pixels (so patients can be split before any slide
    is read)."""
    offered: set[int] = set()
    if node_label == "negative" and not annotated:
        offered.add(HEALTHY)
    if annotated:
        offered.add(TUMOR)
        if healthy_source == "outside_annotations" and node_label not in (None, "itc"):
            offered.add(HEALTHY)
    return frozenset(offered)


def compute_candidates(
    slide: Slide,
    annotations: SlideAnnotations | None,
    node_label: str | None,
    params: PatchParams,
    *,
    slide_id: str | None = None,
    region_pixels: int = REGION_PIXELS,
) -> SlideCandidates:
    """Masks, candidate grid, fractions and labels of one slide.

    The mask grid has ``floor(width / d)`` columns for ``d = mask_mpp / mpp`` (at least
    1), and its downsample is snapped to ``width / columns`` so that columns tile the
    slide's width exactly; the slide is read ``region_pixels`` pixels at a time. The time
    it took is logged (INFO).

    Raises :class:`NoTissueError` when the slide shows no tissue,
    :class:`~wsi.annotations.AnnotationError` when the annotation of a slide not labelled
    negative has no area in a tumour group, and :class:`NoLesionPatchError` when an
    annotated slide whose tumour patches are wanted (any but ``itc``) yields none.
    """
    name = slide_id or slide.path.stem
    if slide.mpp is None:
        raise PatchError(name, "the slide has no resolution (mpp); pass one to open_slide")
    if params.level >= slide.level_count:
        raise PatchError(name, f"level {params.level} requested, slide has {slide.level_count}")
    start, start_cpu = time.perf_counter(), time.process_time()
    columns = slide.thumbnail_shape(max(params.mask_mpp / slide.mpp, 1.0))[1]
    downsample = slide.dimensions[0] / columns
    tissue = tissue_mask_from_blocks(
        slide.thumbnail_blocks(downsample, region_pixels=region_pixels),
        slide.thumbnail_shape(downsample),
        min_saturation=params.min_saturation,
    )
    if not tissue.any():
        raise NoTissueError(name, f"no tissue found at {params.mask_mpp} µm/px")

    extent = round(params.patch_size * slide.level_downsamples[params.level])
    tile = slide.tile_size
    if tile and extent % tile[0] and tile[0] % extent:
        log.info("%s: %d px patches are not aligned to %s tiles", name, extent, tile)
    coords = candidate_grid(slide.dimensions, extent)
    tissue_fraction = box_fractions(tissue, coords, extent, downsample)

    tumor_regions = annotations.tumor if annotations is not None else ()
    if annotations is not None and not tumor_regions and node_label != "negative":
        # the catalogue planned it as a source of tumour patches: none, silently, otherwise
        raise AnnotationError(
            annotations.path,
            f"no area in a tumour group ({', '.join(sorted(TUMOR_GROUPS))}, in any case) for "
            f"a slide labelled {node_label or 'nothing'}; its groups: "
            f"{', '.join(repr(group) for group in annotations.groups) or 'none'}",
        )
    annotated = bool(tumor_regions)
    if annotated:
        assert annotations is not None
        tumor = tumor_mask(
            [r.vertices for r in tumor_regions],
            [r.vertices for r in annotations.carve_outs],
            tissue.shape,
            downsample,
        )
        tumor_fraction = box_fractions(tumor, coords, extent, downsample)
    else:
        tumor_fraction = np.zeros(len(coords), dtype=np.float64)

    labels = assign_labels(
        tissue_fraction, tumor_fraction, node_label=node_label, annotated=annotated, params=params
    )
    log.info(
        "%s: masks and candidates on a %dx%d grid (%.3g µm/px) in %.2f s (%.2f s CPU)",
        name,
        tissue.shape[1],
        tissue.shape[0],
        downsample * slide.mpp,
        time.perf_counter() - start,
        time.process_time() - start_cpu,
    )
    if annotated and node_label != "itc" and not (labels == TUMOR).any():
        raise NoLesionPatchError(
            name,
            f"{len(tumor_regions)} lesion(s) annotated but no candidate has tumour fraction "
            f">= {params.tumor_fraction_min} and tissue fraction >= {params.tissue_fraction_min}",
        )
    return SlideCandidates(
        slide_id=name,
        extent=extent,
        coords=coords,
        tissue_fraction=tissue_fraction,
        tumor_fraction=tumor_fraction,
        labels=labels,
        mask_downsample=downsample,
    )
