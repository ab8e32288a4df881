"""Lesions of a slide from a map of it, and the node's class they give.

A *map* is a 2-D array over a regular grid of square cells of ``cell_um`` µm on a side:
a model's tumour probability per patch (:mod:`wsi.heatmap`), or a ground-truth lesion
mask drawn from the annotations (:func:`wsi.masks.tumor_mask`). The lesions are the
connected regions of the cells whose value is at least ``threshold`` (8-connected: cells
that touch at a corner belong to one lesion, as tumour spreading diagonally does).

A lesion's *extent* is the largest distance between two points of the region the map
draws, the union of its cells: the maximum Feret diameter of that union, which is the
largest distance between two corners of its cells, found among the corners on the
region's convex hull. It overestimates a lesion's true extent by at most one cell's
diagonal (``cell_um * sqrt(2)``) and never underestimates what the map shows; a single
cell spans its diagonal. The node's class is then :func:`wsi.nodes.node_label` of the
largest extent.

What a map can tell is bounded by its cells: a map of 128 µm patches (the paper's 512 px
at 0.25 µm/px) cannot see a lesion smaller than a patch as anything but one cell, so
isolated tumour cells (under 200 µm) are at best one or two cells.
"""

from __future__ import annotations

import contextlib

import numpy as np
from scipy import ndimage
from scipy.spatial import ConvexHull, QhullError
from scipy.spatial.distance import pdist

from wsi.nodes import NodeThresholds, node_label

_EIGHT_CONNECTED = np.ones((3, 3), dtype=bool)


def lesion_labels(probability: np.ndarray, threshold: float) -> tuple[np.ndarray, int]:
    """``(labels, count)``: each 8-connected region of ``probability >= threshold``
    numbered 1..count, 0 elsewhere (NaN cells, where nothing was predicted, are never in)."""
    if probability.ndim != 2:
        raise ValueError(f"a map is 2-D; got shape {probability.shape}")
    with np.errstate(invalid="ignore"):  # NaN >= t is False, as it should be
        above = np.asarray(probability) >= threshold
    labels, count = ndimage.label(above, structure=_EIGHT_CONNECTED)
    return labels, int(count)


def region_extent(cells: np.ndarray, cell_um: float) -> float:
    """The maximum Feret diameter, in µm, of the union of the square cells at ``cells``
    (``(N, 2)`` row, column indices; N >= 1)."""
    rows, cols = cells[:, 0].astype(np.float64), cells[:, 1].astype(np.float64)
    corners = np.unique(
        np.concatenate(
            [np.stack([rows + dr, cols + dc], axis=1) for dr in (0.0, 1.0) for dc in (0.0, 1.0)]
        ),
        axis=0,
    )
    if len(corners) > 4:
        # the farthest pair of a point set lies on its convex hull; all on one line (no
        # hull), every point is kept: few of them
        with contextlib.suppress(QhullError):
            corners = corners[ConvexHull(corners).vertices]
    return float(pdist(corners).max()) * cell_um


def lesion_extents(probability: np.ndarray, threshold: float, cell_um: float) -> np.ndarray:
    """The extent in µm of every lesion of ``probability`` at ``threshold``, largest first
    (empty: no lesion)."""
    if not cell_um > 0:
        raise ValueError(f"cell_um must be positive; got {cell_um}")
    labels, _ = lesion_labels(probability, threshold)
    extents = []
    for index, box in enumerate(ndimage.find_objects(labels), start=1):
        if box is None:
            continue
        inside = labels[box] == index
        # the hull's corners are those of the region's boundary cells: the rest are skipped
        boundary = inside & ~ndimage.binary_erosion(inside, border_value=0)
        cells = np.argwhere(boundary) + np.array([box[0].start, box[1].start])
        extents.append(region_extent(cells, cell_um))
    return np.sort(np.asarray(extents, dtype=np.float64))[::-1]


def largest_lesion_um(probability: np.ndarray, threshold: float, cell_um: float) -> float | None:
    """The extent in µm of the largest lesion of ``probability`` (``None``: no lesion)."""
    extents = lesion_extents(probability, threshold, cell_um)
    return float(extents[0]) if len(extents) else None


def node_label_of_map(
    probability: np.ndarray, threshold: float, cell_um: float, thresholds: NodeThresholds
) -> str:
    """The node's class (:func:`wsi.nodes.node_label`) from its map's largest lesion."""
    return node_label(largest_lesion_um(probability, threshold, cell_um), thresholds)
