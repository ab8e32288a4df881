"""Preprocessing tasks, each named after what it produces."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prefect import task
from prefect.logging import get_run_logger

from wsi.cache import CandidateCache
from wsi.catalogue import SlideRecord, scan_camelyon
from wsi.center import SamplingParams
from wsi.patches import PatchParams
from wsi.preprocess import (
    CenterReport,
    SlideFailure,
    SlideStepError,
    center_store,
    slide_patches,
    write_summary,
)
from wsi.sampling import SlidePatches
from wsi.slide import Backend


@task(name="slide catalogue")
def slide_catalogue(data_root: Path, centers: Sequence[int]) -> list[SlideRecord]:
    """The labelled slides of ``centers`` under ``data_root``; problems go to the log."""
    logger = get_run_logger()
    catalogue = scan_camelyon(data_root)
    for problem in catalogue.problems:
        logger.warning("%s", problem)
    slides = [s for s in catalogue.for_centers(centers) if s.node_label is not None]
    logger.info("%d labelled slides in centres %s under %s", len(slides), list(centers), data_root)
    return slides


@task(name="dropped candidates")
def dropped_candidates(slide_ids: Sequence[str], cache_dir: Path) -> list[Path]:
    """The cache entries of ``slide_ids``, deleted so that their candidates are recomputed."""
    logger = get_run_logger()
    cache = CandidateCache(cache_dir)
    removed: list[Path] = []
    for slide_id in dict.fromkeys(slide_ids):  # each once, in order
        paths = cache.forget(slide_id)
        for path in paths:
            logger.info("redo %s: removed %s", slide_id, path)
        if not paths:
            logger.info("redo %s: no cached candidates in %s", slide_id, cache_dir)
        removed.extend(paths)
    return removed


@task(name="slide candidates", task_run_name="candidates {record.slide_id}", retries=1)
def slide_candidates(
    record: SlideRecord, params: PatchParams, cache_dir: Path, backend: Backend
) -> SlidePatches | SlideFailure:
    """A slide's usable candidates, or the record of why it has none."""
    try:
        return slide_patches(record, params, CandidateCache(cache_dir), backend)
    except SlideStepError as error:
        get_run_logger().error("%s", error)
        return error.failure


@task(name="centre store", task_run_name="center_{center}.h5")
def centre_store(
    center: int,
    slides: Sequence[SlidePatches],
    patch: PatchParams,
    sampling: SamplingParams,
    out: Path,
    backend: Backend,
    slide_failures: Sequence[SlideFailure],
) -> CenterReport:
    """``out/center_{c}.h5``: never cached by Prefect, since DVC owns this output."""
    report = center_store(center, slides, patch, sampling, out, backend, slide_failures)
    get_run_logger().info(
        "center_%d.h5: train %s, test %s", center, report.counts["train"], report.counts["test"]
    )
    return report


@task(name="patch summary")
def patch_summary(out: Path, unplaced: Sequence[SlideFailure]) -> list[dict[str, object]]:
    """``summary.json``, ``summary.csv`` and ``failures.json`` over all centre reports."""
    return write_summary(out, unplaced)
