"""The per-patch predictions of the reported models: per-centre accuracy, sensitivity,
specificity and AUC with patient-bootstrap intervals, and the merged test set's majority
class.

A finished run written since predictions were recorded holds
``RUN_DIR/predictions/client_{c}.csv`` (:mod:`proxyfl.results`): every model client c
evaluated at the final round, on the merged test splits. The report reads, per run and
client, the model its primary metric row names (``evaluated_model``: ProxyFL's and FML's
private model, FedAvg's and PrivateKT's central one, the local model otherwise), so every
number here is of the model the accuracy table reports. A run made before has no
predictions directory: its method's rows stay empty and say so; it never fails the report.
A file that is there but malformed does (:class:`~analysis.report.load.ReportError`, naming
it), as a malformed metrics line does.

The maths is :mod:`analysis.report.clinical`'s.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.report.clinical import (
    BOOTSTRAP_SEED,
    LEVEL,
    MEASURES,
    N_RESAMPLES,
    MajorityClass,
    ModelScores,
    accuracy,
    majority_class,
    method_measures,
)
from analysis.report.load import ReportError, RunResult, by_algorithm
from proxyfl.kept import verify_kept
from proxyfl.results import PREDICTIONS_DIR, Predictions, predictions_path, read_predictions

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelPredictions:
    """The final-round test predictions of one reported (primary) model: a client of a
    seed of a method."""

    algorithm: str
    seed: int
    client: int
    evaluated_model: str
    predictions: Predictions

    def scores(self) -> ModelScores:
        """Labels, probability of tumour and patients (keyed ``centre/patient``, so that
        two centres' patients of one name stay two) for :mod:`~analysis.report.clinical`."""
        p = self.predictions
        keys = np.char.add(np.char.add(p.center.astype(str), "/"), p.patient.astype(str))
        return ModelScores(labels=p.label, scores=p.p_tumor, patients=keys)


@dataclass(frozen=True)
class MethodPredictions:
    """A method's reported models with predictions (clients × seeds; seeds for a server's
    model, which every client holds), the names of the
    evaluated models, and the ``seed_S/client_C`` models without any."""

    algorithm: str
    evaluated_models: tuple[str, ...]
    models: tuple[ModelPredictions, ...]
    missing: tuple[str, ...]


def load_predictions(runs: Sequence[RunResult]) -> dict[str, MethodPredictions]:
    """Per method (paper order): the predictions of the primary model of every client at
    the final round of every seed. A run without a predictions directory counts as missing
    (logged); a file that does not read, or holds labels other than 0/1 or probabilities
    outside [0, 1], is a :class:`ReportError` naming it."""
    result = {}
    for algorithm, group in by_algorithm(runs).items():
        models: list[ModelPredictions] = []
        missing: list[str] = []
        names: list[str] = []
        for run in group:
            recorded = (run.path / PREDICTIONS_DIR).is_dir()
            if not recorded:
                logger.info("%s: no predictions recorded (a run made before they were)",
                            run.path)  # fmt: skip
            distinct = run.model_rows(run.final_round)  # a server's model once
            read = {id(r) for r in distinct}
            for copy in (r for r in run.primary_rows(run.final_round) if id(r) not in read):
                path = predictions_path(run.path, copy.client)
                if recorded and path.is_file():  # unread, but a kept file: still verified
                    verify_kept(path, run.path)
            for row in distinct:
                names.append(row.evaluated_model)
                name = f"seed_{run.seed}/client_{row.client}"
                path = predictions_path(run.path, row.client)
                if not recorded:
                    missing.append(name)
                    continue
                if not path.is_file():
                    logger.warning("%s: missing: %s's predictions are left out", path, name)
                    missing.append(name)
                    continue
                verify_kept(path, run.path)
                own = _read(path).of_model(row.evaluated_model)
                if len(own) == 0:
                    logger.warning("%s: no rows of model %r: left out", path, row.evaluated_model)
                    missing.append(name)
                    continue
                models.append(
                    ModelPredictions(algorithm, run.seed, row.client, row.evaluated_model, own)
                )
        result[algorithm] = MethodPredictions(
            algorithm, tuple(dict.fromkeys(names)), tuple(models), tuple(missing)
        )
    return result


def _read(path: Path) -> Predictions:
    try:
        predictions = read_predictions(path)
    except (OSError, ValueError) as error:  # read_predictions' ValueError names the file
        raise ReportError(str(error) if str(path) in str(error) else f"{path}: {error}") from None
    if not np.isin(predictions.label, (0, 1)).all():
        raise ReportError(f"{path}: labels other than 0 (healthy) and 1 (tumour)")
    p = predictions.p_tumor
    if not (np.isfinite(p).all() and (p >= 0).all() and (p <= 1).all()):
        raise ReportError(f"{path}: p_tumor outside [0, 1]")
    return predictions


def merged_majority(methods: Mapping[str, MethodPredictions]) -> MajorityClass | None:
    """The majority class of the merged test set: the distinct test patches (centre, row)
    of every model's predictions and their labels; None without predictions."""
    predictions = [model.predictions for m in methods.values() for model in m.models]
    if not predictions:
        return None
    keys = np.stack([np.concatenate([p.center for p in predictions]),
                     np.concatenate([p.row for p in predictions])], axis=1)  # fmt: skip
    _, first = np.unique(keys, axis=0, return_index=True)
    labels = np.concatenate([p.label for p in predictions])[first]
    return majority_class(np.bincount(labels, minlength=2))


@dataclass(frozen=True)
class PerCentreRow:
    """A method's accuracy on one centre's test patches: mean and population std over its
    reported models (clients × seeds, or seeds for a server's model); NaN without
    predictions."""

    algorithm: str
    evaluated_model: str
    center: int | None
    accuracy_mean: float
    accuracy_std: float
    n_models: int
    n_patches: int


def per_centre_table(methods: Mapping[str, MethodPredictions]) -> list[PerCentreRow]:
    """Per method and test centre c: for each reported model k, a_k(c) = the share of
    centre c's test patches it classifies right ([p_tumor > ½] = label); the row holds
    the mean (1/M) Σ_k a_k(c) and population std (ddof 0) over the M models. Centres are
    those of any method's predictions, ascending; a method without predictions has one
    row with ``center`` None and NaN values."""
    centers = sorted({int(c) for m in methods.values() for model in m.models
                      for c in np.unique(model.predictions.center)})  # fmt: skip
    table = []
    for method in methods.values():
        model_name = "/".join(method.evaluated_models)
        if not method.models:
            table.append(PerCentreRow(method.algorithm, model_name, None, math.nan, math.nan,
                                      0, 0))  # fmt: skip
            continue
        for center in centers:
            values, sizes = [], []
            for model in method.models:
                p = model.predictions
                here = p.center == center
                sizes.append(int(here.sum()))
                if here.any():
                    values.append(float(accuracy(p.label[here], p.p_tumor[here])))
            mean, std = ((float(np.mean(values)), float(np.std(values, ddof=0))) if values
                         else (math.nan, math.nan))  # fmt: skip
            table.append(PerCentreRow(method.algorithm, model_name, center, mean, std,
                                      len(values), max(sizes)))  # fmt: skip
    return table


@dataclass(frozen=True)
class ClinicalRow:
    """A method's sensitivity, specificity and AUC (tumour positive) with 95 % patient
    bootstrap intervals, over its reported models; NaN without predictions
    (``n_models`` 0)."""

    algorithm: str
    evaluated_model: str
    n_models: int
    sensitivity: float
    sensitivity_low: float
    sensitivity_high: float
    specificity: float
    specificity_low: float
    specificity_high: float
    auc: float
    auc_low: float
    auc_high: float
    n_patients: int
    n_patches: int
    n_resamples: int
    undefined_resamples: int


def clinical_table(
    methods: Mapping[str, MethodPredictions],
    n_resamples: int = N_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = LEVEL,
) -> list[ClinicalRow]:
    """One row per method (paper order): :func:`~analysis.report.clinical.method_measures`
    of its reported models, every method resampled from ``default_rng(seed)`` afresh (so a
    method's interval does not depend on which other methods are reported)."""
    table = []
    for method in methods.values():
        model_name = "/".join(method.evaluated_models)
        if not method.models:
            table.append(ClinicalRow(method.algorithm, model_name, 0, *[math.nan] * 9,
                                     0, 0, 0, 0))  # fmt: skip
            continue
        measures = method_measures([m.scores() for m in method.models], n_resamples, seed, level)
        cells = [value for name in MEASURES
                 for value in (measures.estimates[name].value, measures.estimates[name].low,
                               measures.estimates[name].high)]  # fmt: skip
        table.append(ClinicalRow(method.algorithm, model_name, len(method.models), *cells,
                                 measures.n_patients, measures.n_patches, measures.n_resamples,
                                 measures.undefined_resamples))  # fmt: skip
    return table


def without_predictions(methods: Mapping[str, MethodPredictions]) -> list[str]:
    """The methods with no predictions at all, then, of a method that has some, each seed
    without any (``FedAvg seed_1``) and each model missing from a seed that has some
    (``FedAvg seed_2 client 3``)."""
    none = [m.algorithm for m in methods.values() if not m.models]
    partial = []
    for method in methods.values():
        if not method.models:
            continue
        have = {model.seed for model in method.models}
        for name in method.missing:
            seed, client = name.split("/")
            if int(seed.removeprefix("seed_")) not in have:
                entry = f"{method.algorithm} {seed}"
            else:
                entry = f"{method.algorithm} {seed} client {client.removeprefix('client_')}"
            if entry not in partial:
                partial.append(entry)
    return none + partial
