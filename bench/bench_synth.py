"""Rendering a synthetic slide (``wsi.synth``): the code as it is against the code it
replaced, side by side, and their pixels compared bit for bit.

The slides' bytes are an input of the whole pipeline (stores, models, tables, dvc.lock), so
the faster rendering must give the very same pixels. The reference below is the previous
code, kept here as it was: a block rendered whole (float64 temporaries of 4 MiB), nuclei
stamped one by one in a Python loop, lesions filled by skimage's test of every pixel
against every edge, and the pyramid's 2x2 means summed over four strided views.

Each slide is planned once; then, ``--repeats`` times and interleaved (the machine's load
hits both alike), every band of level 0 is rendered by both and halved by both.
Median CPU seconds per slide (process time: steadier than wall time on a shared machine).

    python -m bench.bench_synth [--repeats N] [--slides P,N ...]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from wsi.synth.plan import SlidePlan

# The demo's slides (params.yaml data.synth); 0,3 has three lesions, 7,2 none.
DEFAULT_SLIDES = ("0,3", "7,2")


# --------------------------------------------------------------------------------------
# The reference: the rendering code before it was made faster
# --------------------------------------------------------------------------------------


def _reference_tumour_mask(
    plan: SlidePlan, y0: int, y1: int, x0: int, x1: int
) -> np.ndarray | None:
    from skimage.draw import polygon as fill_polygon

    mask = None
    for lesion in plan.lesions:
        (left, top), (right, bottom) = lesion.polygon.min(axis=0), lesion.polygon.max(axis=0)
        if bottom < y0 or top >= y1 or right < x0 or left >= x1:
            continue
        if mask is None:
            mask = np.zeros((y1 - y0, x1 - x0), dtype=bool)
        rr, cc = fill_polygon(
            lesion.polygon[:, 1] - (y0 + 0.5), lesion.polygon[:, 0] - (x0 + 0.5), mask.shape
        )
        mask[rr, cc] = True
        for carve in lesion.carve_outs:
            rr, cc = fill_polygon(carve[:, 1] - (y0 + 0.5), carve[:, 0] - (x0 + 0.5), mask.shape)
            mask[rr, cc] = False
    return mask


def reference_stamp_nuclei(
    plan: SlidePlan, candidates: np.ndarray, y0: int, y1: int, x0: int, x1: int
) -> np.ndarray:
    from wsi.synth.render import _blur_px

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


def _reference_render_block(
    plan: SlidePlan,
    rng: np.random.Generator,
    nuclei_near: np.ndarray,
    y0: int,
    y1: int,
    x0: int,
    x1: int,
) -> np.ndarray:
    from wsi.synth.plan import _TEXTURE_FIELD_DOWNSAMPLE, _TISSUE_FIELD_DOWNSAMPLE, _upsample
    from wsi.synth.stain import _unit

    shape = (y1 - y0, x1 - x0)
    grain = rng.random(shape, dtype=np.float32)
    grain -= np.float32(0.5)
    grain *= np.float32(math.sqrt(12))
    tissue = _upsample(plan.tissue_field, _TISSUE_FIELD_DOWNSAMPLE, y0, y1, x0, x1) > 0
    fibre = _upsample(plan.fibre_field, _TEXTURE_FIELD_DOWNSAMPLE, y0, y1, x0, x1)
    tumour = _reference_tumour_mask(plan, y0, y1, x0, x1)
    nuclei = reference_stamp_nuclei(plan, nuclei_near, y0, y1, x0, x1)
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


def reference_render_rows(plan: SlidePlan, y0: int, y1: int) -> np.ndarray:
    from wsi.synth.config import _STREAM_BAND
    from wsi.synth.render import _BLOCK_WIDTH, _blur_px

    rng = np.random.default_rng([plan.seed, plan.patient, plan.node, _STREAM_BAND, y0])
    nuclei = plan.nuclei
    reach = float(np.max(nuclei.radius_a, initial=0.0)) + _blur_px(plan) / 2 + 3
    first, last = np.searchsorted(nuclei.y, [y0 - reach, y1 + reach])
    in_rows = np.arange(first, last)
    rgb = np.empty((y1 - y0, plan.width, 3), dtype=np.uint8)
    for x0 in range(0, plan.width, _BLOCK_WIDTH):
        x1 = min(x0 + _BLOCK_WIDTH, plan.width)
        near = np.abs(nuclei.x[in_rows] - (x0 + x1) / 2) <= (x1 - x0) / 2 + reach
        rgb[:, x0:x1] = _reference_render_block(plan, rng, in_rows[near], y0, y1, x0, x1)
    return rgb


def reference_halve(image: np.ndarray) -> np.ndarray:
    h, w = image.shape[0] // 2, image.shape[1] // 2
    total = image[0 : 2 * h : 2, 0 : 2 * w : 2].astype(np.uint16)
    total += image[1 : 2 * h : 2, 0 : 2 * w : 2]
    total += image[0 : 2 * h : 2, 1 : 2 * w : 2]
    total += image[1 : 2 * h : 2, 1 : 2 * w : 2]
    total += 2
    total >>= 2
    return total.astype(np.uint8)


# --------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------


def _timed(
    work: Callable[..., np.ndarray], calls: list[tuple[Any, ...]]
) -> tuple[float, list[np.ndarray]]:
    """CPU seconds of ``work(*args)`` for every args of ``calls``, and the results."""
    started = time.process_time()
    results = [work(*args) for args in calls]
    return time.process_time() - started, results


def bench_slide(patient: int, node: int, repeats: int, band: int) -> dict[str, float | bool]:
    """Median CPU seconds to render (and to halve) every band of one demo slide, both ways."""
    from wsi.synth.config import SynthConfig
    from wsi.synth.plan import plan_slide
    from wsi.synth.render import render_rows
    from wsi.synth.rules import assign_cohort
    from wsi.synth.tiff import halve

    config = SynthConfig(patients_per_center=4)  # the demo's slides
    plan = plan_slide(config, patient, node, assign_cohort(config)[patient][node])
    bands = [(y, min(y + band, plan.height)) for y in range(0, plan.height, band)]
    times: dict[str, list[float]] = {"render before": [], "render after": [],
                                     "halve before": [], "halve after": []}  # fmt: skip
    same = True
    for _ in range(repeats):
        before, old = _timed(reference_render_rows, [(plan, *b) for b in bands])
        after, new = _timed(render_rows, [(plan, *b) for b in bands])
        times["render before"].append(before)
        times["render after"].append(after)
        same &= all(np.array_equal(a, b) for a, b in zip(old, new, strict=True))
        before, old_half = _timed(reference_halve, [(b,) for b in new])
        after, new_half = _timed(halve, [(b,) for b in new])
        times["halve before"].append(before)
        times["halve after"].append(after)
        same &= all(np.array_equal(a, b) for a, b in zip(old_half, new_half, strict=True))
    result: dict[str, float | bool] = {k: statistics.median(v) for k, v in times.items()}
    result["lesions"] = len(plan.lesions)
    result["bit_identical"] = same
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_synth", description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--band", type=int, default=512, help="rows rendered at a time")
    parser.add_argument("--slides", nargs="+", default=list(DEFAULT_SLIDES),
                        help="PATIENT,NODE of demo slides (6144 x 4096)")  # fmt: skip
    args = parser.parse_args([] if argv is None else argv)
    status = 0
    print(f"level 0 of demo slides, median CPU s of {args.repeats} (before = the old code)")
    for slide in args.slides:
        patient, node = (int(part) for part in slide.split(","))
        r = bench_slide(patient, node, args.repeats, args.band)
        print(f"  slide {patient},{node} ({r['lesions']} lesions): "
              f"render {r['render before']:6.3f} -> {r['render after']:6.3f} s "
              f"(x{r['render before'] / r['render after']:.2f}); "
              f"halve {r['halve before']:6.3f} -> {r['halve after']:6.3f} s "
              f"(x{r['halve before'] / r['halve after']:.2f}); "
              f"bit-identical: {r['bit_identical']}")  # fmt: skip
        if not r["bit_identical"]:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
