"""Low-resolution masks of a slide: tissue (from pixels) and tumour (from annotations).

Both masks live on the same grid, the slide seen at ``downsample`` relative to level 0,
so that mask pixel (row, col) covers level-0 pixels
``[col * downsample, (col + 1) * downsample) x [row * downsample, (row + 1) * downsample)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from skimage.color import rgb2hsv
from skimage.draw import polygon as fill_polygon
from skimage.filters import threshold_otsu
from skimage.morphology import (
    closing,
    disk,
    opening,
    remove_small_holes,
    remove_small_objects,
)


def tissue_mask(
    rgb: np.ndarray,
    *,
    min_saturation: float = 0.07,
    max_brightness: float = 0.98,
    closing_radius: int = 2,
    opening_radius: int = 1,
    min_object_pixels: int = 64,
    max_hole_pixels: int = 64,
) -> np.ndarray:
    """Boolean tissue mask of a low-resolution RGB image.

    Tissue is where the HSV saturation exceeds its Otsu threshold, which is never below
    ``min_saturation`` (so a blank slide, whose Otsu threshold falls inside the noise of
    the glass, gives an empty mask) and where the value is below ``max_brightness``
    (white glass). The mask is then cleaned: closing, opening, small objects removed,
    small holes filled (sizes in mask pixels).
    """
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) RGB image, got shape {rgb.shape}")
    hsv = rgb2hsv(rgb)
    saturation, value = hsv[..., 1], hsv[..., 2]
    threshold = min_saturation
    if np.ptp(saturation) > 0:
        threshold = max(float(threshold_otsu(saturation)), min_saturation)
    mask = (saturation > threshold) & (value < max_brightness)
    if closing_radius > 0:
        mask = closing(mask, disk(closing_radius))
    if opening_radius > 0:
        mask = opening(mask, disk(opening_radius))
    mask = remove_small_objects(mask, max_size=min_object_pixels)
    return remove_small_holes(mask, max_size=max_hole_pixels)


def rasterize_polygons(
    polygons: Sequence[np.ndarray], shape: tuple[int, int], downsample: float
) -> np.ndarray:
    """Boolean union of level-0 polygons drawn on a ``shape`` grid at ``downsample``.

    A mask pixel is inside when its centre is inside a polygon.
    """
    mask = np.zeros(shape, dtype=bool)
    for vertices in polygons:
        # Pixel (r, c) has its centre at level-0 ((c + 0.5) d, (r + 0.5) d).
        cols = vertices[:, 0] / downsample - 0.5
        rows = vertices[:, 1] / downsample - 0.5
        rr, cc = fill_polygon(rows, cols, shape=shape)
        mask[rr, cc] = True
    return mask


def tumor_mask(
    tumor: Sequence[np.ndarray],
    carve_outs: Sequence[np.ndarray],
    shape: tuple[int, int],
    downsample: float,
) -> np.ndarray:
    """Tumour polygons minus carve-out polygons, rasterised on the mask grid."""
    inside = rasterize_polygons(tumor, shape, downsample)
    if carve_outs:
        inside &= ~rasterize_polygons(carve_outs, shape, downsample)
    return inside


def box_fractions(
    mask: np.ndarray, coords: np.ndarray, extent: int, downsample: float
) -> np.ndarray:
    """Fraction of ``mask`` inside each level-0 box ``(x, y) .. (x + extent, y + extent)``.

    Boxes are snapped to the mask grid (the nearest mask-pixel edges) and measured with a
    summed-area table, so the cost is one pass over the mask plus O(1) per box.
    """
    coords = np.asarray(coords, dtype=np.float64).reshape(-1, 2)
    if len(coords) == 0:
        return np.zeros(0, dtype=np.float64)
    rows, cols = mask.shape
    table = np.zeros((rows + 1, cols + 1), dtype=np.int64)
    table[1:, 1:] = np.cumsum(np.cumsum(mask, axis=0, dtype=np.int64), axis=1)
    x0 = np.clip(np.rint(coords[:, 0] / downsample), 0, cols).astype(np.int64)
    y0 = np.clip(np.rint(coords[:, 1] / downsample), 0, rows).astype(np.int64)
    x1 = np.clip(np.rint((coords[:, 0] + extent) / downsample), 0, cols).astype(np.int64)
    y1 = np.clip(np.rint((coords[:, 1] + extent) / downsample), 0, rows).astype(np.int64)
    x1 = np.maximum(x1, np.minimum(x0 + 1, cols))
    y1 = np.maximum(y1, np.minimum(y0 + 1, rows))
    counts = table[y1, x1] - table[y0, x1] - table[y1, x0] + table[y0, x0]
    area = (x1 - x0) * (y1 - y0)
    return np.where(area > 0, counts / np.maximum(area, 1), 0.0)
