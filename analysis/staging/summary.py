"""Every centre's calls into each method's staging measures: ``results/staging.json``.

A method's (and seed's) calls are its models' calls on the test patients of every centre
(each centre staged by its own client's model), measured together
(:func:`analysis.report.staging.staging_measures`: node confusion and accuracy, slide AUC,
the patients' quadratic weighted kappa, patient-bootstrap intervals). Only the calls leave
the centres' folders: node classes and slide scores, never a pixel or a map.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from analysis.report.load import order_key
from analysis.report.staging import (
    STAGING_MEASURES,
    SUMMARY_FORMAT,
    NodeCall,
    StagingMeasures,
    staging_measures,
)
from analysis.staging.centre import CentreCalls, read_centre
from plumbing.atomic import write_json


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def _measures_json(measures: StagingMeasures) -> dict[str, Any]:
    return {
        **{
            name: {"value": _number(e.value), "low": _number(e.low), "high": _number(e.high)}
            for name, e in measures.estimates.items()
        },
        "node_confusion": measures.node_confusion,
        "stage_confusion": measures.stage_confusion,
        "stages": {patient: list(pair) for patient, pair in measures.stages.items()},
        "incomplete": measures.incomplete,
        "n_patients": measures.n_patients,
        "n_slides": measures.n_slides,
        "n_resamples": measures.n_resamples,
    }


def summarise(
    centres: Sequence[CentreCalls],
    true_stages: Mapping[str, str],
    *,
    n_resamples: int,
    seed: int,
) -> dict[str, Any]:
    """``staging.json``'s content: per model key (``ALGORITHM/seed_S``, paper order) its
    measures over every centre's test patients, each test patient's threshold per centre
    and the digest of the model that staged each centre; the slides no centre could map."""
    keys = sorted({key for centre in centres for key in centre.models},
                  key=lambda k: (order_key(k.split("/")[0]), k))  # fmt: skip
    methods: dict[str, Any] = {}
    for key in keys:
        calls: list[NodeCall] = []
        for centre in centres:
            calls += centre.calls_of(key) if key in centre.models else []
        if not calls:
            continue
        measures = staging_measures(calls, true_stages, n_resamples=n_resamples, seed=seed)
        methods[key] = {
            **_measures_json(measures),
            # each test patient's threshold, chosen on its centre's other test patients
            "thresholds": {
                str(c.center): c.models[key]["thresholds"] for c in centres if key in c.models
            },
            # the model file each centre was staged with (its recorded SHA-256): the report
            # shows the staging only beside the runs whose kept models these still are
            "models": {str(c.center): c.models[key]["model"] for c in centres if key in c.models},
        }
    return {
        "format": SUMMARY_FORMAT,
        "measures": list(STAGING_MEASURES),
        "methods": methods,
        "failures": [{"center": c.center, **f} for c in centres for f in c.failures],
        # per centre and test slide, how many methods called its node class wrong: the
        # report shows those slides' pictures first
        "wrong_calls": {str(c.center): _wrong_calls(c) for c in centres},
        # each test slide's picture, relative to its centre's folder (STAGING/center_c/)
        "pictures": {str(c.center): c.pictures for c in centres},
    }


def _wrong_calls(centre: CentreCalls) -> dict[str, int]:
    wrong: dict[str, int] = {}
    for key in centre.models:
        for call in centre.calls_of(key):
            wrong[call.slide_id] = wrong.get(call.slide_id, 0) + (call.predicted != call.truth)
    return wrong


def write_summary(
    path: str | Path,
    staging_dir: str | Path,
    centers: Sequence[int],
    true_stages: Mapping[str, str],
    *,
    n_resamples: int,
    seed: int,
) -> dict[str, Any]:
    """:func:`summarise` the centres' verified ``calls.json`` into ``path``."""
    centres = [read_centre(staging_dir, center) for center in centers]
    summary = summarise(centres, true_stages, n_resamples=n_resamples, seed=seed)
    write_json(path, summary)
    return summary
