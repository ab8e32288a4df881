"""Preprocessing tasks, each named after what it produces."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from prefect import task
from prefect.client.schemas.objects import State
from prefect.logging import get_run_logger
from prefect.states import Failed

import wsi.preprocess
from plumbing.refusals import machine_refusal
from tasks.freshness import freshness_state
from wsi.cache import CandidateCache
from wsi.catalogue import SlideRecord, scan_camelyon
from wsi.center import InsufficientPatchesError, SamplingParams
from wsi.freshness import StoreInputs, stale_reason
from wsi.patches import LABEL_NAMES, PatchParams
from wsi.preprocess import (
    SlideStepError,
    catalogue_failures,
    record_failed_center,
    slide_patches,
)
from wsi.sampling import SlidePatches
from wsi.slide import Backend
from wsi.store.schema import StoreError, StoreSpaceError
from wsi.summary import CenterReport, SlideFailure, write_summary


@task(name="slide catalogue")
def slide_catalogue(
    data_root: Path, centers: Sequence[int]
) -> tuple[list[SlideRecord], list[SlideFailure]]:
    """The labelled slides of ``centers`` under ``data_root``, and the catalogue's
    problems that concern them, as failures."""
    logger = get_run_logger()
    catalogue = scan_camelyon(data_root)
    failures = catalogue_failures(catalogue.problems, centers)
    for failure in failures:
        logger.warning("catalogue: %s: %s", failure.slide, failure.error)
    slides = [s for s in catalogue.for_centers(centers) if s.node_label is not None]
    logger.info("%d labelled slides in centres %s under %s", len(slides), list(centers), data_root)
    return slides, failures


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
    """A slide's usable candidates, or the record of why it has none (a WARNING: the slide
    is left out, the run goes on)."""
    logger = get_run_logger()
    cache = CandidateCache(cache_dir)
    cached = cache.path_for(record, params).is_file()
    start, start_cpu = time.perf_counter(), time.process_time()
    try:
        patches = slide_patches(record, params, cache, backend)
    except SlideStepError as error:
        logger.warning("%s", error)
        return error.failure
    counts = np.bincount(patches.labels, minlength=len(LABEL_NAMES)).tolist()
    logger.info(
        "%s: %s usable candidates %s in %.2f s (%.2f s CPU)",
        record.slide_id,
        dict(zip(LABEL_NAMES.values(), counts, strict=True)),
        "from the cache" if cached else "computed",
        time.perf_counter() - start,
        time.process_time() - start_cpu,
    )
    return patches


REFUSED = "Refused"
"""The name of a centre store's Failed state where the machine refused its writing."""


@task(name="center store", task_run_name="center_{center}.h5")
def center_store(
    center: int,
    slides: Sequence[SlidePatches],
    patch: PatchParams,
    sampling: SamplingParams,
    out: Path,
    backend: Backend,
    slide_failures: Sequence[SlideFailure],
    records: Sequence[SlideRecord],
    inputs: StoreInputs,
) -> CenterReport | State:
    """``out/center_{c}.h5``, with the record of ``inputs`` beside it
    (:mod:`wsi.freshness`): never cached by Prefect, since that record (the Prefect path)
    or DVC owns this output.

    A centre that cannot be built ends Failed with a one-line reason and a failed report,
    its earlier store kept as it was (:func:`wsi.preprocess.record_failed_center`); the
    state is named :data:`REFUSED` where the machine refused (no room for the store).
    """
    logger = get_run_logger()
    refused = False  # the machine said no (a full disk, a folder it cannot write)
    try:
        report = wsi.preprocess.center_store(
            center, slides, patch, sampling, out, backend, slide_failures, records, inputs
        )
    except (InsufficientPatchesError, StoreError) as error:
        logger.error("center_%d.h5: %s", center, error)
        reason, refused = str(error), isinstance(error, StoreSpaceError)
    except Exception as error:
        refusal = machine_refusal(error)
        if refusal is None:
            logger.exception("center_%d.h5: unexpected failure", center)
            reason = f"{type(error).__name__}: {error}"
        else:
            logger.error("center_%d.h5: %s", center, refusal)
            reason, refused = refusal, True
    else:
        logger.info(
            "center_%d.h5: train %s, test %s", center, report.counts["train"], report.counts["test"]
        )
        return report
    failed = record_failed_center(center, reason, out, slide_failures)
    return Failed(message=reason, data=failed, name=REFUSED if refused else "Failed")


@task(name="store up to date?", task_run_name="center_{center}.h5 up to date?")
def store_freshness(center: int, out: Path, inputs: StoreInputs) -> State:
    """Whether ``out/center_{c}.h5`` was built from exactly ``inputs`` and is untouched
    since: a Completed state named "Up to date" (data ``False``) or "Stale" (data
    ``True``), its message the reason, so the UI tells which stores a run rebuilds."""
    return freshness_state(f"center_{center}.h5", stale_reason(out, inputs),
                           "its slides, parameters, code and libraries", "to build")  # fmt: skip


@task(name="patch summary")
def patch_summary(out: Path, unplaced: Sequence[SlideFailure]) -> list[dict[str, object]]:
    """``summary.json``, ``summary.csv`` and ``failures.json`` over all centre reports."""
    return write_summary(out, unplaced)
