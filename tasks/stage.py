"""Staging tasks: a centre's models and slides, a slide's maps, a centre's calls, and the
summary of every centre's calls (policy: :mod:`analysis.staging`)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.client.schemas.objects import State

from analysis.staging.centre import (
    SlideMapper,
    SlideMaps,
    StagingSlide,
    centre_calls,
    centre_slides,
    write_centre,
)
from analysis.staging.freshness import CentreInputs, forget_inputs, record_inputs, stale_reason
from analysis.staging.models import StagingModel, choose_device, model_predictor, staging_model
from analysis.staging.summary import write_summary
from camelyon_proxyfl.params.staging import StagingParams
from tasks.freshness import freshness_state
from wsi.catalogue import check_dataset_root, scan_camelyon
from wsi.heatmap import Predictor
from wsi.store.schema import StoreError, store_path


@task(name="staging models")
def staging_models(params: StagingParams, center: int) -> list[StagingModel]:
    """The kept model of every listed run (``train.algorithms`` x ``train.seeds``) that
    stages ``center``; a ``StagingModelError`` names a run that keeps none."""
    train = params.train
    return [staging_model(train.run_dir(algorithm, seed), algorithm, seed, train.centers, center)
            for algorithm in train.algorithms for seed in train.seeds]  # fmt: skip


@task(name="centre slides")
def staging_slides(params: StagingParams, center: int) -> list[StagingSlide]:
    """The labelled slides of the centre's test patients (its store's test split)."""
    check_dataset_root(params.data.root)  # a root that is not there: an error, not no slide
    records = scan_camelyon(params.data.root).for_centers([center])
    try:
        return centre_slides(records, store_path(params.preprocess.out, center))
    except StoreError as error:  # the store decides the splits: say how to build it
        raise error.with_rebuild_hint(center) from None


@functools.lru_cache(maxsize=1)
def _predictors(
    models: tuple[StagingModel, ...], device: str, batch_size: int
) -> dict[str, Predictor]:
    """One centre's predictors, loaded (and verified) once for all its slides."""
    return {m.key: model_predictor(m, choose_device(device), batch_size) for m in models}


@task(name="slide maps", task_run_name="maps of {slide.slide_id}")
def slide_maps(
    slide: StagingSlide, models: Sequence[StagingModel], params: StagingParams
) -> SlideMaps | str:
    """Every model's map of ``slide``, or why it could not be mapped (the others go on)."""
    stage, preprocess = params.stage, params.preprocess
    predictors = _predictors(tuple(models), stage.device, stage.batch_size)
    mapper = SlideMapper(preprocess, predictors, stage.batch_size, stage.node_thresholds(),
                         stage.reference_section_um, preprocess.backend)  # fmt: skip
    outcome = mapper.map_or_failure(slide)
    if isinstance(outcome, str):
        get_run_logger().warning("%s (patient %s): %s", slide.slide_id, slide.patient, outcome)
    return outcome


def centre_inputs(
    params: StagingParams, center: int, models: Sequence[StagingModel]
) -> CentreInputs:
    """What decides ``center``'s staging now (:mod:`analysis.staging.freshness`)."""
    digests = {m.key: m.digest for m in models}
    return CentreInputs.now(center, params.centre_settings(), digests, params.data.root,
                            store_path(params.preprocess.out, center))  # fmt: skip


@task(name="centre staging up to date?", task_run_name="centre {inputs.center} up to date?")
def centre_freshness(staging_dir: Path, inputs: CentreInputs) -> State:
    """Whether the centre's staging was computed from exactly ``inputs``: a Completed
    state named "Up to date" (data ``False``) or "Stale" (data ``True``), its message the
    reason, so the UI tells whether the run stages the centre again."""
    recorded = "its models, slides, store, settings, code and libraries"
    return freshness_state(f"{staging_dir}/center_{inputs.center}",
                           stale_reason(staging_dir, inputs), recorded, "to stage")  # fmt: skip


@task(name="centre calls")
def centre_calls_file(
    params: StagingParams,
    models: Sequence[StagingModel],
    slides: Sequence[StagingSlide],
    outcomes: Sequence[SlideMaps | str],
    inputs: CentreInputs,
) -> Path:
    """``STAGING/center_{c}/``: each model's cross-fitted thresholds and calls, the maps;
    its ``inputs`` recorded beside it."""
    mapped = [o for o in outcomes if isinstance(o, SlideMaps)]
    failures = [(s, o) for s, o in zip(slides, outcomes, strict=True) if isinstance(o, str)]
    calls = centre_calls(inputs.center, mapped, failures, {m.key: m.digest for m in models},
                         params.stage.thresholds)  # fmt: skip
    forget_inputs(params.stage.out, inputs.center)  # no record describes calls being rewritten
    path = write_centre(params.stage.out, calls, mapped, params.preprocess.backend)
    record_inputs(params.stage.out, inputs)
    return path


@task(name="staging summary")
def staging_summary(params: StagingParams, centers: Sequence[int]) -> dict[str, Any]:
    """``stage.summary``: every method's measures over the centres' calls."""
    catalogue = scan_camelyon(params.data.root)
    true_stages = {r.patient_id: r.patient_stage for r in catalogue.slides if r.patient_stage}
    return write_summary(params.stage.summary, params.stage.out, centers, true_stages,
                         n_resamples=params.stage.bootstrap, seed=params.stage.seed)  # fmt: skip
