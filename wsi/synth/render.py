"""Rendering a slide's plan into RGB pixels, band by band."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from skimage.draw import polygon as fill_polygon

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
        rr, cc = fill_polygon(
            lesion.polygon[:, 1] - (y0 + 0.5), lesion.polygon[:, 0] - (x0 + 0.5), mask.shape
        )
        mask[rr, cc] = True
        for carve in lesion.carve_outs:
            rr, cc = fill_polygon(carve[:, 1] - (y0 + 0.5), carve[:, 0] - (x0 + 0.5), mask.shape)
            mask[rr, cc] = False
    return mask


def _stamp_nuclei(
    plan: SlidePlan, candidates: np.ndarray, y0: int, y1: int, x0: int, x1: int
) -> np.ndarray:
    """Hematoxylin load of the nuclei over the block (max where nuclei overlap).

    A nucleus is full strength inside, with a linear rim ``1 + blur`` px wide across its
    edge, ``blur`` being the centre's focus blur in level-0 px (an anti-aliased edge when 0).
    """
    load = np.zeros((y1 - y0, x1 - x0), dtype=np.float32)
    nuclei = plan.nuclei
    rim = 1.0 + _blur_px(plan)
    for i in candidates:
        cx, cy, a, b = nuclei.x[i], nuclei.y[i], nuclei.radius_a[i], nuclei.radius_b[i]
        r = int(a + rim / 2) + 2
        top, bottom = max(int(cy) - r, y0), min(int(cy) + r + 1, y1)
        left, right = max(int(cx) - r, x0), min(int(cx) + r + 1, x1)
        if top >= bottom or left >= right:
            continue
        dy = np.arange(top, bottom, dtype=np.float32)[:, None] + 0.5 - cy
        dx = np.arange(left, right, dtype=np.float32)[None, :] + 0.5 - cx
        cos, sin = math.cos(nuclei.angle[i]), math.sin(nuclei.angle[i])
        u = (dx * cos + dy * sin) / a
        v = (dy * cos - dx * sin) / b
        edge = np.clip((1 - np.sqrt(u * u + v * v)) * b / rim + 0.5, 0, 1)
        window = load[top - y0 : bottom - y0, left - x0 : right - x0]
        np.maximum(window, edge * nuclei.load[i], out=window)
    return load


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
        rgb[:, x0:x1] = _render_block(plan, rng, in_rows[near], y0, y1, x0, x1)
    return rgb


def _render_block(
    plan: SlidePlan,
    rng: np.random.Generator,
    nuclei_near: np.ndarray,
    y0: int,
    y1: int,
    x0: int,
    x1: int,
) -> np.ndarray:
    shape = (y1 - y0, x1 - x0)
    # Unit-variance uniform noise: as good as Gaussian for grain, three times cheaper.
    grain = rng.random(shape, dtype=np.float32)
    grain -= np.float32(0.5)
    grain *= np.float32(math.sqrt(12))
    tissue = _upsample(plan.tissue_field, _TISSUE_FIELD_DOWNSAMPLE, y0, y1, x0, x1) > 0
    fibre = _upsample(plan.fibre_field, _TEXTURE_FIELD_DOWNSAMPLE, y0, y1, x0, x1)
    tumour = _tumour_mask(plan, y0, y1, x0, x1)
    nuclei = _stamp_nuclei(plan, nuclei_near, y0, y1, x0, x1)

    # Concentrations of the two stains. Healthy: eosin stroma in streaks, a trace of
    # hematoxylin. Tumour: cytoplasm moved towards purple (more hematoxylin, less eosin)
    # by the centre's tumour contrast, less streaky.
    look = plan.look
    eosin = fibre * np.float32(0.14)
    eosin += np.float32(0.42)
    hema = fibre * np.float32(0.01)
    hema += np.float32(0.05)
    if tumour is not None:
        shift = np.float32(look.tumour_contrast)
        eosin = np.where(tumour, 0.42 - 0.12 * shift + (0.14 - 0.11 * shift) * fibre, eosin)
        hema = np.where(tumour, 0.05 + 0.25 * shift + (0.01 + 0.03 * shift) * fibre, hema)
    grain *= np.float32(look.noise)
    eosin *= 1 + np.float32(0.12) * grain
    hema *= 1 + np.float32(0.25) * grain
    np.maximum(hema, nuclei * (1 + np.float32(0.12) * grain), out=hema)
    eosin *= 1 - np.float32(0.5) * np.minimum(nuclei, 1)
    np.maximum(eosin, 0.12, out=eosin)
    np.maximum(hema, 0, out=hema)
    on_tissue = tissue.astype(np.float32)
    eosin *= on_tissue
    hema *= on_tissue

    stain = plan.stain
    h_od = _unit(stain.hematoxylin_od) * np.float32(stain.hematoxylin_strength)
    e_od = _unit(stain.eosin_od) * np.float32(stain.eosin_strength)
    glass_noise = grain * np.float32(1.2)
    rgb = np.empty((*shape, 3), dtype=np.uint8)
    for channel in range(3):
        optical_density = hema * -h_od[channel]
        optical_density -= eosin * e_od[channel]
        value = np.exp(optical_density, out=optical_density)
        value *= glass_noise + np.float32(stain.background_rgb[channel] + 0.5)
        np.clip(value, 0, 255, out=value)
        rgb[..., channel] = value
    return rgb


def render_slide_bands(plan: SlidePlan, band_height: int) -> Iterator[np.ndarray]:
    """Level 0 of a planned slide as row bands ``band_height`` tall (the last may be less)."""
    for y0 in range(0, plan.height, band_height):
        yield render_rows(plan, y0, min(y0 + band_height, plan.height))


def render_slide(plan: SlidePlan, band_height: int = 512) -> np.ndarray:
    """The whole level 0 of a planned slide, (height, width, 3) uint8 (small slides only)."""
    return np.concatenate(list(render_slide_bands(plan, band_height)), axis=0)
