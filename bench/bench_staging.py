"""Staging throughput: slides an hour of tumour maps on this machine, the peak memory of a
worker mapping a real-size slide, and the projected hours for the paper's test patients.

Measured, each in a fresh (spawned) worker process so that its peak resident memory
(``VmHWM``, imports included) is its own, every figure the median of ``--repeats``:

1. **Demo slides** (``wsi.synth``'s, the demo's size: 6144 x 4096 px, 32 px patches at
   level 2) mapped by 1 and by 8 of the demo's models (``cnn2``, as the demo keeps them):
   seconds per slide, slides an hour.
2. **A real-size slide** (``bench.slidegen``: 100,000 x 200,000 px at 0.243 µm/px, cached
   under ``bench/.cache/``; ``--small``: 20,000 x 40,000) at the paper's geometry (512 px
   patches at level 0): its tissue cells found and every tissue patch read through
   :func:`wsi.heatmap.predict_cells` with a predictor that costs nothing (the read and the
   bookkeeping alone), the worker's peak (target: <= 1 GB, as preprocessing's); and the
   GroupNorm ResNet-18 the paper trains, on 64 such patches, patches a second on this CPU.
3. **Projected**: the paper's split has about 20 test patients (5 slides each), whose
   slides are mapped (the thresholds are cross-fitted on them: no training slide is);
   hours on this CPU (one worker) and on one H100 at the evaluation throughput measured
   there (``../shared/gpu/README.md``: 3,256 patches/s, GN-ResNet-18 fp32, batch 64,
   2026-11), reads at this CPU's rate per core over ``--gpu-host-cores`` cores.

``python -m bench staging``; ``python -m bench staging --small`` (a minute).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.process_memory import peak_rss_bytes

REPEATS = 3
DEMO_SLIDES = 2
SMALL = {"width": 20_000, "height": 40_000}
TARGET_PEAK_BYTES = 1e9
H100_EVAL_PATCHES_PER_S = 3256.0  # ../shared/gpu/README.md, GN-ResNet-18 fp32, batch 64
PAPER_TEST_SLIDES = 100  # ~20 test patients x 5 nodes (patient-disjoint 80/20 split)
METHODS = 8
MODEL_BATCH = 16  # patches a forward pass of the 512 px model on a CPU


def _map_slides(paths: Sequence[str], patch_size: int, level: int, models: int,
                model_name: str, input_size: int, batch_size: int) -> dict[str, Any]:  # fmt: skip
    """In a fresh worker: map ``paths`` with ``models`` untrained ``model_name``s (speed
    does not depend on the weights); seconds per slide, cells, peak memory."""
    import torch

    from proxyfl.engine.models import build_model
    from proxyfl.engine.trained import CLASSES, NORMALISATION, ModelCard, predict_tumor
    from wsi.heatmap import predict_cells, slide_cells
    from wsi.params import PatchParams

    torch.set_num_threads(1)
    params = PatchParams(patch_size=patch_size, level=level)
    predictors = {}
    for index in range(models):
        torch.manual_seed(index)
        network = build_model(model_name, n_classes=2, input_size=input_size).eval()
        card = ModelCard(model_name, 2, input_size, patch_size, NORMALISATION, CLASSES,
                         "local", "bench", 0, index, 0, 1, "-")  # fmt: skip
        predictors[f"m{index}"] = lambda p, n=network, c=card: predict_tumor(
            n, c, p, batch_size=batch_size
        )
    started = time.perf_counter()
    cells = 0
    for path in paths:
        grid = slide_cells(path, params)
        inside = grid.tissue_cells(params.tissue_fraction_min)
        cells += len(inside)
        predict_cells(path, grid, params, predictors, batch_size=batch_size)
    return {"seconds_per_slide": (time.perf_counter() - started) / len(paths),
            "tissue_cells": cells / len(paths), "peak": peak_rss_bytes()}  # fmt: skip


def _read_only(path: str, patch_size: int, batch_size: int) -> dict[str, Any]:
    """In a fresh worker: a real-size slide's cells and every tissue patch read, through a
    predictor that costs nothing."""
    from wsi.heatmap import predict_cells, slide_cells
    from wsi.params import PatchParams

    params = PatchParams(patch_size=patch_size, level=0)
    started = time.perf_counter()
    grid = slide_cells(path, params)
    cells_seconds = time.perf_counter() - started
    inside = grid.tissue_cells(params.tissue_fraction_min)
    predict_cells(path, grid, params, {"none": lambda p: np.zeros(len(p))},
                  batch_size=batch_size)  # fmt: skip
    seconds = time.perf_counter() - started
    return {"cells_seconds": cells_seconds, "seconds": seconds, "tissue_cells": len(inside),
            "grid": grid.shape, "peak": peak_rss_bytes()}  # fmt: skip


def _resnet_rate(patch_size: int, batch: int) -> dict[str, Any]:
    """In a fresh worker: GN-ResNet-18 forward passes on ``batch`` patches, patches/s."""
    import torch

    from proxyfl.engine.models import build_model

    network = build_model("resnet18_gn", n_classes=2, input_size=patch_size).eval()
    x = torch.randn(batch, 3, patch_size, patch_size)
    with torch.inference_mode():
        network(x[:2])
        started = time.perf_counter()
        network(x)
    return {"patches_per_s": batch / (time.perf_counter() - started),
            "threads": torch.get_num_threads(), "peak": peak_rss_bytes()}  # fmt: skip


def _in_workers(function: Any, args: tuple[Any, ...], repeats: int) -> list[dict[str, Any]]:
    context = multiprocessing.get_context("spawn")
    results = []
    for _ in range(repeats):
        with context.Pool(1) as pool:
            results.append(pool.apply(function, args))
    return results


def _median(results: Sequence[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in results))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench staging", description=__doc__)
    parser.add_argument("--small", action="store_true", help="a 0.8-gigapixel slide")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--gpu-host-cores", type=int, default=16)
    args = parser.parse_args(argv)

    from bench.slidegen import SlideSpec, cached_slide
    from wsi.synth import SynthConfig, generate_dataset

    status = 0
    with tempfile.TemporaryDirectory() as folder:
        demo = generate_dataset(Path(folder), SynthConfig(centers=(0,), patients_per_center=1),
                                workers=2)  # fmt: skip
        paths = [str(s.slide_path) for s in demo.slides[:DEMO_SLIDES]]
        print("1. demo slides (6144 x 4096 px, 32 px patches at level 2, cnn2 models)")
        for models in (1, METHODS):
            results = _in_workers(_map_slides, (paths, 32, 2, models, "cnn2", 32, 256),
                                  args.repeats)  # fmt: skip
            seconds = _median(results, "seconds_per_slide")
            print(f"   {models} model(s): {seconds:.2f} s a slide ({3600 / seconds:,.0f} "
                  f"slides an hour, one worker), {_median(results, 'tissue_cells'):.0f} tissue "
                  f"cells, peak {max(r['peak'] for r in results) / 1e6:.0f} MB")  # fmt: skip

    spec = SlideSpec(**SMALL) if args.small else SlideSpec()
    written = cached_slide(spec)
    print(f"2. a {spec.gigapixels:.1f}-gigapixel slide ({spec.width:,} x {spec.height:,} px, "
          f"{spec.mpp} µm/px), 512 px patches at level 0")  # fmt: skip
    reads = _in_workers(_read_only, (str(written.path), 512, args.batch_size), args.repeats)
    cells, seconds = _median(reads, "tissue_cells"), _median(reads, "seconds")
    peak = max(r["peak"] for r in reads)
    print(f"   cells found in {_median(reads, 'cells_seconds'):.1f} s; {cells:,.0f} tissue "
          f"patches of a {reads[0]['grid'][0]} x {reads[0]['grid'][1]} grid read in "
          f"{seconds:.1f} s ({cells / seconds:,.0f} patches/s, one worker)")  # fmt: skip
    verdict = "meets" if peak <= TARGET_PEAK_BYTES else "MISSES"
    print(f"   peak memory of the worker: {peak / 1e6:.0f} MB ({verdict} the 1 GB target)")
    status |= int(peak > TARGET_PEAK_BYTES)
    model_runs = _in_workers(_resnet_rate, (512, MODEL_BATCH), args.repeats)
    rate = _median(model_runs, "patches_per_s")
    print(f"   GN-ResNet-18 at 512 px on this CPU: {rate:.1f} patches/s (batch {MODEL_BATCH}, "
          f"{model_runs[0]['threads']} threads), peak of that worker "
          f"{max(r['peak'] for r in model_runs) / 1e6:.0f} MB (torch and the model's "
          f"activations, beside the slide's bounded reads)")  # fmt: skip

    per_slide = cells if not args.small else cells * SlideSpec().gigapixels / spec.gigapixels
    slides = PAPER_TEST_SLIDES
    patches = slides * per_slide
    read_s = patches / (cells / seconds)
    cpu_hours = (read_s + METHODS * patches / rate) / 3600
    gpu_hours = (read_s / args.gpu_host_cores + METHODS * patches / H100_EVAL_PATCHES_PER_S) / 3600
    print(f"3. projected, the paper's {slides} slides of test patients, "
          f"~{per_slide:,.0f} tissue patches each, {METHODS} methods:")  # fmt: skip
    print(f"   this CPU, one worker: {cpu_hours:,.0f} h; one H100 at {H100_EVAL_PATCHES_PER_S:,.0f}"
          f" patches/s with reads over {args.gpu_host_cores} cores: {gpu_hours:.1f} h")  # fmt: skip
    return status


if __name__ == "__main__":
    raise SystemExit(main())
