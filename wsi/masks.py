"""Low-resolution masks of a slide: tissue (from pixels) and tumour (from annotations).

Both masks live on the same grid, the slide seen at ``downsample`` relative to level 0,
so that mask pixel (row, col) covers level-0 pixels
``[col * downsample, (col + 1) * downsample) x [row * downsample, (row + 1) * downsample)``.

The tissue mask is made in one pass over blocks of that grid (as
:meth:`wsi.slide.Slide.thumbnail_blocks` yields them, so the slide's pixels are never
whole in memory): each block leaves one byte per mask pixel (its saturation code, zeroed
where the pixel is too bright) and adds to a 256-bin saturation histogram; Otsu's
threshold is taken from the histogram after the pass. An in-memory image is the same
computation with one block, so both give the same mask.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from skimage.draw import polygon as fill_polygon
from skimage.filters import threshold_otsu
from skimage.morphology import disk, remove_small_objects

SATURATION_LEVELS = 256  # saturation is coded on 8 bits: code = round(255 * S)
BAND_PIXELS = 8 * 2**20  # mask pixels labelled at once when removing small objects


def _saturation_table() -> np.ndarray:
    """``table[max * 256 + min]`` = ``round(255 * (max - min) / max)`` (0 where max = 0)."""
    high = np.arange(256, dtype=np.float64)[:, None]
    low = np.arange(256, dtype=np.float64)[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        saturation = np.where(high > 0, (high - low) / high, 0.0)
    codes = np.rint(np.clip(saturation, 0, 1) * (SATURATION_LEVELS - 1))
    return codes.astype(np.uint8).ravel()


_SATURATION = _saturation_table()


def saturation_codes(
    rgb: np.ndarray, *, max_brightness: float = 0.98
) -> tuple[np.ndarray, np.ndarray]:
    """HSV saturation of ``uint8`` RGB pixels as 8-bit codes, and their histogram.

    With skimage's ``rgb2hsv`` definitions, ``V = max / 255`` and ``S = (max - min) / max``
    (0 where max = 0); the code is ``round(255 S)`` (a table lookup on (max, min), no
    float image). Returns ``(codes, histogram)``: the codes with pixels of
    ``V >= max_brightness`` (white glass) set to 0, and the ``SATURATION_LEVELS``-bin
    histogram of all the codes before that.
    """
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) RGB image, got shape {rgb.shape}")
    if rgb.dtype != np.uint8:
        raise ValueError(f"expected uint8 RGB, got {rgb.dtype}")
    red, green, blue = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    # Element-wise over the channel planes: a reduction over a length-3 axis is far slower.
    high = np.maximum(np.maximum(red, green), blue)
    key = high.astype(np.uint16) << 8
    key |= np.minimum(np.minimum(red, green), blue)
    codes = _SATURATION[key]
    histogram = np.bincount(codes.ravel(), minlength=SATURATION_LEVELS)
    codes[high >= max_brightness * 255] = 0  # V = high / 255 >= max_brightness
    return codes, histogram


def saturation_threshold(histogram: np.ndarray, min_saturation: float) -> float:
    """Tissue threshold on the saturation codes: Otsu's, never below ``min_saturation``.

    Otsu's threshold of the code histogram (skimage's ``threshold_otsu`` with bin centres
    0..255), in code units; with a single occupied bin it is ``255 * min_saturation``
    alone. Tissue is ``code > threshold``.
    """
    floor = min_saturation * (SATURATION_LEVELS - 1)
    counts = np.asarray(histogram, dtype=np.int64)
    if np.count_nonzero(counts) < 2:
        return floor
    centres = np.arange(len(counts), dtype=np.float64)
    return max(float(threshold_otsu(hist=(counts, centres))), floor)


def _shift_reduce(mask: np.ndarray, radius: int, dilate: bool) -> np.ndarray:
    """Dilation (OR) or erosion (AND) of a boolean mask by ``disk(radius)``.

    One in-place OR/AND of a shifted view per footprint offset: pixels beyond the image
    are ignored (skimage's ``mode="ignore"``: dilation sees False there, erosion True), so
    this equals skimage's ``dilation``/``erosion`` with the same (symmetric) footprint,
    about ten times faster on a slide's 20-80 megapixel masks than its generic filter.
    """
    out = mask.copy()
    height, width = mask.shape
    combine = np.logical_or if dilate else np.logical_and
    for dy, dx in np.argwhere(disk(radius)) - radius:
        if dy == 0 and dx == 0:
            continue
        target = out[max(0, -dy) : height - max(0, dy), max(0, -dx) : width - max(0, dx)]
        source = mask[max(0, dy) : height - max(0, -dy), max(0, dx) : width - max(0, -dx)]
        combine(target, source, out=target)
    return out


def clean_mask(
    mask: np.ndarray,
    *,
    closing_radius: int = 2,
    opening_radius: int = 1,
    min_object_pixels: int = 64,
    max_hole_pixels: int = 64,
) -> np.ndarray:
    """Closing and opening by disks, then small objects removed and small holes filled.

    Sizes in mask pixels; the same operations as skimage's ``closing``, ``opening``,
    ``remove_small_objects`` and ``remove_small_holes`` on a boolean mask.
    """
    mask = np.asarray(mask, dtype=bool)
    if closing_radius > 0:
        mask = _shift_reduce(_shift_reduce(mask, closing_radius, True), closing_radius, False)
    if opening_radius > 0:
        mask = _shift_reduce(_shift_reduce(mask, opening_radius, False), opening_radius, True)
    mask = remove_small_objects_banded(mask, min_object_pixels)
    return ~remove_small_objects_banded(~mask, max_hole_pixels)  # = remove_small_holes


def remove_small_objects_banded(
    mask: np.ndarray, max_size: int, *, band_pixels: int = BAND_PIXELS
) -> np.ndarray:
    """skimage's ``remove_small_objects(mask, max_size=max_size)`` (4-connected), by bands.

    Labelling a whole mask takes a 4-byte label per pixel (300 MB for a real slide at
    4 µm/px); here each band of rows is labelled with ``max_size + 1`` rows of context on
    either side. That gives the same result: an object with pixels in the band that
    reaches beyond the context spans more than ``max_size + 1`` rows, hence has more than
    ``max_size`` pixels inside the window, so it is kept there as it is in the whole mask;
    an object that does not reach beyond is whole in the window. (Holes are the small
    objects of the inverted mask, as skimage's ``remove_small_holes`` has them.)
    """
    mask = np.asarray(mask, dtype=bool)
    rows, cols = mask.shape
    margin = max_size + 1
    band = max(1, band_pixels // max(cols, 1) - 2 * margin)
    if band >= rows:
        return remove_small_objects(mask, max_size=max_size)
    out = np.empty_like(mask)
    for top in range(0, rows, band):
        bottom = min(rows, top + band)
        low, high = max(0, top - margin), min(rows, bottom + margin)
        cleaned = remove_small_objects(mask[low:high], max_size=max_size)
        out[top:bottom] = cleaned[top - low : bottom - low]
    return out


def tissue_mask_from_blocks(
    blocks: Iterable[tuple[int, int, np.ndarray]],
    shape: tuple[int, int],
    *,
    min_saturation: float = 0.07,
    max_brightness: float = 0.98,
    closing_radius: int = 2,
    opening_radius: int = 1,
    min_object_pixels: int = 64,
    max_hole_pixels: int = 64,
) -> np.ndarray:
    """Boolean tissue mask of a ``shape`` image that arrives as ``(row, col, rgb)`` blocks.

    Tissue is where the HSV saturation exceeds its Otsu threshold, which is never below
    ``min_saturation`` (so a blank slide, whose Otsu threshold falls inside the noise of
    the glass, gives an empty mask) and where the value is below ``max_brightness``
    (white glass); saturation is coded on 8 bits (:func:`saturation_codes`,
    :func:`saturation_threshold`). The mask is then cleaned (:func:`clean_mask`). Memory:
    one byte per mask pixel during the pass, plus the blocks themselves.
    """
    codes = np.zeros(shape, dtype=np.uint8)
    covered = 0
    histogram = np.zeros(SATURATION_LEVELS, dtype=np.int64)
    for row, col, rgb in blocks:
        block, counts = saturation_codes(rgb, max_brightness=max_brightness)
        codes[row : row + block.shape[0], col : col + block.shape[1]] = block
        histogram += counts
        covered += block.size
    if covered != codes.size:
        raise ValueError(f"blocks cover {covered} pixels of a {shape} mask")
    mask = codes > saturation_threshold(histogram, min_saturation)
    del codes
    return clean_mask(
        mask,
        closing_radius=closing_radius,
        opening_radius=opening_radius,
        min_object_pixels=min_object_pixels,
        max_hole_pixels=max_hole_pixels,
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
    """Boolean tissue mask of a low-resolution ``uint8`` RGB image held in memory.

    :func:`tissue_mask_from_blocks` with the whole image as one block.
    """
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) RGB image, got shape {rgb.shape}")
    return tissue_mask_from_blocks(
        [(0, 0, np.asarray(rgb, dtype=np.uint8))],
        rgb.shape[:2],
        min_saturation=min_saturation,
        max_brightness=max_brightness,
        closing_radius=closing_radius,
        opening_radius=opening_radius,
        min_object_pixels=min_object_pixels,
        max_hole_pixels=max_hole_pixels,
    )


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


def _prefix_sums_at(mask: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``out[i, j] = mask[:rows[i], :cols[j]].sum()`` for sorted unique ``rows``, ``cols``.

    The summed-area table sampled at those lines only: the mask is summed in bands between
    consecutive lines, then the band sums are accumulated, so memory is (len(rows) x mask
    width) integers, not a table the size of the mask (nor an integer copy of it).
    """

    def prefix(values: np.ndarray, lines: np.ndarray, axis: int) -> np.ndarray:
        shape = list(values.shape)
        shape[axis] = len(lines)
        out = np.zeros(shape, dtype=np.int64)
        moved, target = np.moveaxis(values, axis, 0), np.moveaxis(out, axis, 0)
        total = np.zeros(moved.shape[1:], dtype=np.int64)
        previous = 0
        for k, line in enumerate(lines):
            # A band's sum reduces a view, casting as it goes: no widened copy of the mask.
            total += moved[previous:line].sum(axis=0, dtype=np.int64)
            target[k] = total
            previous = line
        return out

    return prefix(prefix(mask, rows, 0), cols, 1)


def box_fractions(
    mask: np.ndarray, coords: np.ndarray, extent: int, downsample: float
) -> np.ndarray:
    """Fraction of ``mask`` inside each level-0 box ``(x, y) .. (x + extent, y + extent)``.

    Boxes are snapped to the mask grid (the nearest mask-pixel edges) and measured with a
    summed-area table taken only at the boxes' edges (:func:`_prefix_sums_at`), so the
    cost is one pass over the mask plus O(1) per box, and the memory that of the edges.
    """
    coords = np.asarray(coords, dtype=np.float64).reshape(-1, 2)
    if len(coords) == 0:
        return np.zeros(0, dtype=np.float64)
    rows, cols = mask.shape
    x0 = np.clip(np.rint(coords[:, 0] / downsample), 0, cols).astype(np.int64)
    y0 = np.clip(np.rint(coords[:, 1] / downsample), 0, rows).astype(np.int64)
    x1 = np.clip(np.rint((coords[:, 0] + extent) / downsample), 0, cols).astype(np.int64)
    y1 = np.clip(np.rint((coords[:, 1] + extent) / downsample), 0, rows).astype(np.int64)
    x1 = np.maximum(x1, np.minimum(x0 + 1, cols))
    y1 = np.maximum(y1, np.minimum(y0 + 1, rows))
    ys, y_index = np.unique(np.concatenate([y0, y1]), return_inverse=True)
    xs, x_index = np.unique(np.concatenate([x0, x1]), return_inverse=True)
    table = _prefix_sums_at(mask, ys, xs)
    n = len(coords)
    iy0, iy1, ix0, ix1 = y_index[:n], y_index[n:], x_index[:n], x_index[n:]
    counts = table[iy1, ix1] - table[iy0, ix1] - table[iy1, ix0] + table[iy0, ix0]
    area = (x1 - x0) * (y1 - y0)
    return np.where(area > 0, counts / np.maximum(area, 1), 0.0)
