"""Rendering a slide's plan into RGB pixels, band by band."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from wsi.synth.config import _STREAM_BAND
from wsi.synth.plan import _TEXTURE_FIELD_DOWNSAMPLE, _TISSUE_FIELD_DOWNSAMPLE, SlidePlan, _upsample
from wsi.synth.stain import _unit

# --------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------


def _tumour_mask(plan: SlidePlan, y0: int, y1: int, x0: int, x1: int) -> np.ndarray | None:
    """Tumour (lesions minus carve-outs) over the block, or None when there is none."""
    mask = None
    for lesion in plan.lesions:
        (left, top), (right, bottom) = lesion.polygon.min(axis=0), lesion.polygon.max(axis=0)
        if bottom < y0 or top >= y1 or right < x0 or left >= x1:
            continue
        if mask is None:
            mask = np.zeros((y1 - y0, x1 - x0), dtype=bool)
        # Pixel (r, c) is tumour when its centre (x0 + c + 0.5, y0 + r + 0.5) is.
        filled = _fill_polygon(
            lesion.polygon[:, 1] - (y0 + 0.5), lesion.polygon[:, 0] - (x0 + 0.5), mask.shape
        )
        if filled is not None:
            mask[filled[0]] |= filled[1]
        for carve in lesion.carve_outs:
            filled = _fill_polygon(carve[:, 1] - (y0 + 0.5), carve[:, 0] - (x0 + 0.5), mask.shape)
            if filled is not None:
                mask[filled[0]] &= ~filled[1]
    return mask


_VERTEX_TOLERANCE = 1e-12  # skimage's: a pixel this close to a vertex is on the polygon


def _fill_polygon(
    rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int]
) -> tuple[tuple[slice, slice], np.ndarray] | None:
    """The pixels of ``shape`` in a polygon, exactly those ``skimage.draw.polygon`` gives
    (scikit-image 0.26, which drew the slides before; they no longer depend on its version).

    Returns the slices of the polygon's bounding box (clipped to ``shape``) and a mask
    over it, or None when the box is empty. skimage tests every pixel (x, y) of the box
    with O'Rourke's crossing rule: an edge from vertex j to vertex i straddling the row
    (``y_i - y > 0`` differs from ``y_j - y > 0``, or the same with ``< 0``) crosses the
    ray to the right of the pixel when

        f(x) = ((x_i - x)(y_j - y) - (x_j - x)(y_i - y)) / (y_j - y_i) > 0,

    to the left when f(x) < 0, and the pixel is drawn when either count is odd (inside,
    or on an edge) or it lies on a vertex. Along a row ``y_i - y`` and ``y_j - y`` have
    opposite signs (or one is 0) and rounding is monotone, so f evaluated in float64 is
    non-increasing in x: the columns with f > 0 are a prefix of the row and those with
    f < 0 a suffix. A bisection per (edge, row) finds both ends evaluating f with the same
    float64 operations as skimage, and the crossing counts are prefix sums: tens of
    operations per row instead of one test per pixel and edge.
    """
    rows = np.asarray(rows, dtype=np.float64)
    cols = np.asarray(cols, dtype=np.float64)
    top = int(max(0, rows.min()))
    bottom = min(shape[0] - 1, math.ceil(rows.max()))
    left = int(max(0, cols.min()))
    right = min(shape[1] - 1, math.ceil(cols.max()))
    if top > bottom or left > right:
        return None
    ys = np.arange(top, bottom + 1, dtype=np.float64)
    xs = np.arange(left, right + 1, dtype=np.float64)
    n_rows, n_cols = len(ys), len(xs)

    # Every (edge, row) pair where the edge straddles the row, as flat arrays.
    parts: list[tuple[np.ndarray, ...]] = []
    for i in range(len(rows)):
        dy_i, dy_j = rows[i] - ys, rows[i - 1] - ys
        to_right = (dy_i > 0) != (dy_j > 0)
        to_left = (dy_i < 0) != (dy_j < 0)
        at = np.flatnonzero(to_right | to_left)
        if len(at):
            x_i, x_j = np.full(len(at), cols[i]), np.full(len(at), cols[i - 1])
            parts.append((at, dy_i[at], dy_j[at], x_i, x_j, to_right[at], to_left[at]))
    inside = np.zeros((n_rows, n_cols), dtype=bool)
    if parts:
        row, dy_i, dy_j, x_i, x_j, to_right, to_left = (
            np.concatenate(p) for p in zip(*parts, strict=True)
        )
        denominator = dy_j - dy_i

        def first_column(crossed: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
            """Per pair, the first column where ``crossed(f)`` holds (n_cols if none)."""
            low = np.zeros(len(row), dtype=np.int64)
            high = np.full(len(row), n_cols, dtype=np.int64)
            while (searching := low < high).any():
                middle = (low + high) // 2
                x = xs[np.minimum(middle, n_cols - 1)]
                hit = crossed(((x_i - x) * dy_j - (x_j - x) * dy_i) / denominator)
                high = np.where(searching & hit, middle, high)
                low = np.where(searching & ~hit, middle + 1, low)
            return low

        width = n_cols + 1
        right_end = first_column(lambda f: f <= 0)  # right crossings: columns [0, right_end)
        left_start = first_column(lambda f: f < 0)  # left crossings: [left_start, n_cols)
        starts = row * width
        right_toggles = np.concatenate([starts[to_right], (starts + right_end)[to_right]])
        left_toggles = np.concatenate([(starts + left_start)[to_left], (starts + n_cols)[to_left]])
        crossings = [
            np.cumsum(np.bincount(ends, minlength=n_rows * width).reshape(n_rows, width), axis=1)
            for ends in (right_toggles, left_toggles)
        ]
        inside = ((crossings[0] | crossings[1])[:, :n_cols] & 1).astype(bool)
    for x, y in zip(cols.tolist(), rows.tolist(), strict=True):
        column, row_ = round(x), round(y)
        if (
            top <= row_ <= bottom
            and left <= column <= right
            and -_VERTEX_TOLERANCE < x - column < _VERTEX_TOLERANCE
            and -_VERTEX_TOLERANCE < y - row_ < _VERTEX_TOLERANCE
        ):
            inside[row_ - top, column - left] = True
    return (slice(top, bottom + 1), slice(left, right + 1)), inside


def _stamp_nuclei(
    plan: SlidePlan, candidates: np.ndarray, y0: int, y1: int, x0: int, x1: int
) -> np.ndarray:
    """Hematoxylin load of the nuclei over the block (max where nuclei overlap).

    A nucleus is full strength inside, with a linear rim ``1 + blur`` px wide across its
    edge, ``blur`` being the centre's focus blur in level-0 px (an anti-aliased edge when 0):
    at pixel centre (x, y), with (u, v) its offset from the nucleus' centre rotated by the
    nucleus' angle and scaled by its semi-axes (a, b),
    ``clip((1 - sqrt(u^2 + v^2)) * b / (1 + blur) + 1/2, 0, 1) * load``.

    The windows of nuclei of equal window size are computed together (vectorised), on a
    canvas that holds every window whole; each pixel is the same float32 arithmetic as
    computing the nuclei one by one, and the max does not depend on the order, so the
    load is the same to the bit.
    """
    load = np.zeros((y1 - y0, x1 - x0), dtype=np.float32)
    if len(candidates) == 0:
        return load
    nuclei = plan.nuclei
    rim = 1.0 + _blur_px(plan)
    cx, cy = nuclei.x[candidates], nuclei.y[candidates]
    a, b = nuclei.radius_a[candidates], nuclei.radius_b[candidates]
    # Half the side of each nucleus' window, and its centre pixel (truncated like int()).
    half = (a + rim / 2).astype(np.int64) + 2
    centre_row, centre_col = cy.astype(np.int64), cx.astype(np.int64)
    # math.cos, not np.cos: numpy's vectorised cosine may differ from libm's in the last bit.
    angles = nuclei.angle[candidates].tolist()
    cos = np.array([math.cos(t) for t in angles]).astype(np.float32)
    sin = np.array([math.sin(t) for t in angles]).astype(np.float32)
    strength = nuclei.load[candidates]

    origin_row = min(y0, int((centre_row - half).min()))
    origin_col = min(x0, int((centre_col - half).min()))
    canvas = np.zeros(
        (
            max(y1, int((centre_row + half).max()) + 1) - origin_row,
            max(x1, int((centre_col + half).max()) + 1) - origin_col,
        ),
        dtype=np.float32,
    )
    for side in np.unique(half).tolist():
        width = 2 * side + 1
        same_size = np.flatnonzero(half == side)
        for start in range(0, len(same_size), _STAMP_CHUNK):
            group = same_size[start : start + _STAMP_CHUNK]
            top, left = centre_row[group] - side, centre_col[group] - side
            offsets = np.arange(width)
            dy = (top[:, None] + offsets).astype(np.float32) + np.float32(0.5) - cy[group, None]
            dx = (left[:, None] + offsets).astype(np.float32) + np.float32(0.5) - cx[group, None]
            dy, dx = dy[:, :, None], dx[:, None, :]
            cos_g, sin_g = cos[group, None, None], sin[group, None, None]
            u = (dx * cos_g + dy * sin_g) / a[group, None, None]
            v = (dy * cos_g - dx * sin_g) / b[group, None, None]
            edge = np.clip((1 - np.sqrt(u * u + v * v)) * b[group, None, None] / rim + 0.5, 0, 1)
            edge *= strength[group, None, None]
            # One window at a time: a slice and a max are cheaper than a scatter (maximum.at).
            for stamp, row, col in zip(
                edge, (top - origin_row).tolist(), (left - origin_col).tolist(), strict=True
            ):
                window = canvas[row : row + width, col : col + width]
                np.maximum(window, stamp, out=window)
    load[...] = canvas[y0 - origin_row : y1 - origin_row, x0 - origin_col : x1 - origin_col]
    return load


_STAMP_CHUNK = 128  # nuclei computed at once: their windows stay in the CPU cache


def _blur_px(plan: SlidePlan) -> float:
    return plan.look.focus_blur_um / plan.mpp


_BLOCK_WIDTH = 1024  # columns rendered at a time: small arrays stay in the allocator's pool


def render_rows(plan: SlidePlan, y0: int, y1: int) -> np.ndarray:
    """Level-0 pixels of rows [y0, y1) of a planned slide, (y1 - y0, width, 3) uint8."""
    # The noise of a band is keyed by its first row, so it does not depend on render order.
    rng = np.random.default_rng([plan.seed, plan.patient, plan.node, _STREAM_BAND, y0])
    nuclei = plan.nuclei
    reach = float(np.max(nuclei.radius_a, initial=0.0)) + _blur_px(plan) / 2 + 3
    first, last = np.searchsorted(nuclei.y, [y0 - reach, y1 + reach])
    in_rows = np.arange(first, last)
    rgb = np.empty((y1 - y0, plan.width, 3), dtype=np.uint8)
    for x0 in range(0, plan.width, _BLOCK_WIDTH):
        x1 = min(x0 + _BLOCK_WIDTH, plan.width)
        near = np.abs(nuclei.x[in_rows] - (x0 + x1) / 2) <= (x1 - x0) / 2 + reach
        _render_block(plan, rng, in_rows[near], y0, y1, x0, x1, out=rgb[:, x0:x1])
    return rgb


def _render_block(
    plan: SlidePlan,
    rng: np.random.Generator,
    nuclei_near: np.ndarray,
    y0: int,
    y1: int,
    x0: int,
    x1: int,
    out: np.ndarray,
) -> None:
    """Render level-0 block [y0:y1, x0:x1] into ``out``, (y1 - y0, x1 - x0, 3) uint8."""
    shape = (y1 - y0, x1 - x0)
    grain = rng.random(shape, dtype=np.float32)
    tumour = _tumour_mask(plan, y0, y1, x0, x1)
    nuclei = _stamp_nuclei(plan, nuclei_near, y0, y1, x0, x1)
    inks = _inks(plan)
    # Upsampling and shading are pure functions of each pixel's inputs, so a strip at a time
    # gives the same bytes; a strip's float64 temporaries stay in the CPU cache, a block's
    # do not.
    for top in range(0, shape[0], _STRIP_ROWS):
        bottom = min(top + _STRIP_ROWS, shape[0])
        rows, ys = slice(top, bottom), (y0 + top, y0 + bottom)
        # Unit-variance uniform noise: as good as Gaussian for grain, three times cheaper.
        strip_grain = grain[rows]
        strip_grain -= np.float32(0.5)
        strip_grain *= np.float32(math.sqrt(12))
        strip_grain *= inks.noise
        tissue = _upsample(plan.tissue_field, _TISSUE_FIELD_DOWNSAMPLE, *ys, x0, x1) > 0
        on_tissue = np.flatnonzero(tissue.any(axis=0))
        if len(on_tissue) == 0:
            _shade_glass(inks, strip_grain, out[rows])
            continue
        # Only columns [first, last) of the strip hold tissue: stain them, and the glass
        # on either side.
        first, last = int(on_tissue[0]), int(on_tissue[-1]) + 1
        for glass in (slice(0, first), slice(last, shape[1])):
            if glass.start < glass.stop:
                _shade_glass(inks, strip_grain[:, glass], out[rows, glass])
        aligned = first - first % _TEXTURE_FIELD_DOWNSAMPLE  # _upsample's x0 is on its grid
        fibre = _upsample(plan.fibre_field, _TEXTURE_FIELD_DOWNSAMPLE, *ys, x0 + aligned, x0 + last)
        columns = slice(first, last)
        _shade(
            inks,
            strip_grain[:, columns],
            tissue[:, columns],
            fibre[:, first - aligned :],
            None if tumour is None else tumour[rows, columns],
            nuclei[rows, columns],
            out[rows, columns],
        )


_STRIP_ROWS = 32  # rows shaded at a time: 32 x 1024 float64 is 256 KiB, a cache's worth


@dataclass(frozen=True)
class _Inks:
    """A slide's shading constants, in the dtypes the pixel arithmetic uses."""

    noise: np.float32  # grain amplitude
    tumour_shift: np.float32  # the centre's tumour contrast
    hematoxylin: np.ndarray  # (3,) float32 optical density at unit concentration
    eosin: np.ndarray  # (3,) float32
    glass: tuple[np.float32, np.float32, np.float32]  # background + 0.5 (rounding), per channel


def _inks(plan: SlidePlan) -> _Inks:
    look, stain = plan.look, plan.stain
    return _Inks(
        noise=np.float32(look.noise),
        tumour_shift=np.float32(look.tumour_contrast),
        hematoxylin=_unit(stain.hematoxylin_od) * np.float32(stain.hematoxylin_strength),
        eosin=_unit(stain.eosin_od) * np.float32(stain.eosin_strength),
        glass=(
            np.float32(stain.background_rgb[0] + 0.5),
            np.float32(stain.background_rgb[1] + 0.5),
            np.float32(stain.background_rgb[2] + 0.5),
        ),
    )


def _shade_glass(inks: _Inks, grain: np.ndarray, rgb: np.ndarray) -> None:
    """Bare glass into ``rgb``: ``I = I0 + 1.2 grain`` (and what :func:`_shade` gives
    off tissue, where both stains are 0: ``exp(-0) = 1`` exactly; clipping and truncating a
    value in float32 or in float64 gives the same integer)."""
    glass_noise = grain * np.float32(1.2)
    for channel in range(3):
        value = glass_noise + inks.glass[channel]
        np.clip(value, 0, 255, out=value)
        rgb[..., channel] = value


def _shade(
    inks: _Inks,
    grain: np.ndarray,
    tissue: np.ndarray,
    fibre: np.ndarray,
    tumour: np.ndarray | None,
    nuclei: np.ndarray,
    rgb: np.ndarray,
) -> None:
    """Stain pixels into ``rgb`` (Beer-Lambert: ``I = I0 exp(-OD)``).

    ``grain`` is the scanner's noise (zero mean, variance ``noise^2``, float32); ``tissue``
    and ``tumour`` are masks, ``fibre`` the stroma texture, ``nuclei`` their hematoxylin
    load. Every pixel's arithmetic (operations, order, dtypes) is fixed: the slides' bytes
    depend on it.
    """
    # Concentrations of the two stains. Healthy: eosin stroma in streaks, a trace of
    # hematoxylin. Tumour: cytoplasm moved towards purple (more hematoxylin, less eosin)
    # by the centre's tumour contrast, less streaky.
    eosin = fibre * np.float32(0.14)
    eosin += np.float32(0.42)
    hema = fibre * np.float32(0.01)
    hema += np.float32(0.05)
    if tumour is not None:
        shift = inks.tumour_shift
        eosin = np.where(tumour, 0.42 - 0.12 * shift + (0.14 - 0.11 * shift) * fibre, eosin)
        hema = np.where(tumour, 0.05 + 0.25 * shift + (0.01 + 0.03 * shift) * fibre, hema)
    grain_12 = np.float32(0.12) * grain
    grain_12 += np.float32(1)  # 1 + 0.12 grain, used twice
    eosin *= grain_12
    hema *= 1 + np.float32(0.25) * grain
    np.maximum(hema, nuclei * grain_12, out=hema)
    eosin *= 1 - np.float32(0.5) * np.minimum(nuclei, 1)
    np.maximum(eosin, 0.12, out=eosin)
    np.maximum(hema, 0, out=hema)
    on_tissue = tissue.astype(np.float32)
    eosin *= on_tissue
    hema *= on_tissue

    glass_noise = grain * np.float32(1.2)
    for channel in range(3):
        optical_density = hema * -inks.hematoxylin[channel]
        optical_density -= eosin * inks.eosin[channel]
        value = np.exp(optical_density, out=optical_density)
        value *= glass_noise + inks.glass[channel]
        np.clip(value, 0, 255, out=value)
        rgb[..., channel] = value


def render_slide_bands(plan: SlidePlan, band_height: int) -> Iterator[np.ndarray]:
    """Level 0 of a planned slide as row bands ``band_height`` tall (the last may be less)."""
    for y0 in range(0, plan.height, band_height):
        yield render_rows(plan, y0, min(y0 + band_height, plan.height))


def render_slide(plan: SlidePlan, band_height: int = 512) -> np.ndarray:
    """The whole level 0 of a planned slide, (height, width, 3) uint8 (small slides only)."""
    return np.concatenate(list(render_slide_bands(plan, band_height)), axis=0)
