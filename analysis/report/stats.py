"""The numbers of the report: accuracy and privacy tables, per-round curves, sample sizes.

Statistics are over the pooled sample of ``primary`` metric rows (the model the paper
reports: ProxyFL's and FML's private models, FedAvg's central model, the local model
otherwise), one value per model: per (client, seed), except that a server's model (FedAvg's
and PrivateKT's central one, which every client holds and tests on the same merged test
set) is one value per seed (:meth:`~analysis.report.load.RunResult.model_rows`). For values
x_1..x_n::

    mean = (1/n) Σ x_i        std = sqrt((1/n) Σ (x_i − mean)²)

i.e. the population standard deviation (``numpy.std`` with ``ddof=0``); a single value
has std 0, no values give NaN, and a null metric (no test examples) counts as NaN.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.report.clinical import MajorityClass
from analysis.report.load import (
    JOINT,
    SERVER_MODELS,
    RunResult,
    accounted_epsilon,
    by_algorithm,
)
from proxyfl.results import LABEL_LDP, SAMPLE_DP, MetricRow

logger = logging.getLogger(__name__)

# Where a client's ε comes from: ProxyFL, else the DP federated baselines in paper order,
# else Regular (local DP-SGD only; same σ, sample rate and steps, hence the same ε).
PRIVATE_KT = "PrivateKT"
EPSILON_SOURCES: tuple[str, ...] = ("ProxyFL", "AvgPush", "CWT", "FedAvg", "FML", "Regular")


@dataclass(frozen=True)
class AccuracyRow:
    """Final-round accuracy of one method: mean and population std over its n reported
    models (``evaluated_model``: private, central, local, ...), clients × seeds, or seeds
    for a server's model. A
    ``baseline`` row is no method but a constant answer (:func:`majority_row`)."""

    algorithm: str
    accuracy_mean: float
    accuracy_std: float
    macro_accuracy_mean: float
    macro_accuracy_std: float
    n: int
    n_seeds: int
    final_round: int
    evaluated_model: str = ""
    baseline: bool = False


@dataclass(frozen=True)
class PrivacyRow:
    """One client's privacy guarantee: (ε, δ)-DP of its data under noise multiplier σ.

    ``epsilon`` is the mean over seeds of the client's final-round ε (normally identical
    across seeds) in the runs of ``source``; Joint's row has client "Joint", centre
    "pooled" and the pooled n_train.
    """

    client: str
    center: str
    n_train: int | None
    sigma: float | None
    delta: float | None
    epsilon: float
    source: str
    n_seeds: int
    notion: str = SAMPLE_DP  # which guarantee ε is (proxyfl.results.PRIVACY_NOTIONS)
    epsilon_per_round: float | None = None  # label-level LDP: ε of one round's release


@dataclass(frozen=True)
class CurvePoint:
    """Mean and population std over the models of one method at a round (clients × seeds,
    seeds for a server's model)."""

    round: int
    accuracy_mean: float
    accuracy_std: float
    macro_accuracy_mean: float
    macro_accuracy_std: float
    n: int


@dataclass(frozen=True)
class SampleSize:
    """How many values a method's mean ± std pools: distinct clients (primary rows of the
    final round, over all seeds; 1 for a server's model, ``server_model``) and seeds."""

    clients: int
    seeds: int
    server_model: str | None = None  # "central": one model a seed, whatever the clients


def accuracy_table(runs: Sequence[RunResult]) -> list[AccuracyRow]:
    """Per method (paper order, unknown names after): final-round accuracy statistics of
    the reported model (its name(s) in ``evaluated_model``, in order of first appearance).

    For method A with seeds S and clients C, the sample is {x_{c,s}}: the primary row of
    client c at the final round of seed s, n = |C|·|S| values; for a server's model, which
    every client of a seed holds, {x_s}, n = |S|. Mean and *population* std
    (``numpy.std``, ``ddof=0``) of accuracy and of macro-accuracy (mean per-class recall).
    """
    table = []
    for algorithm, group in by_algorithm(runs).items():
        rows = [row for run in group for row in run.model_rows(run.final_round)]
        finals = sorted({run.final_round for run in group})
        if len(finals) > 1:
            logger.warning("%s: seeds end at different rounds %s", algorithm, finals)
        accuracy = _mean_std(row.accuracy for row in rows)
        macro = _mean_std(row.macro_accuracy for row in rows)
        table.append(
            AccuracyRow(
                algorithm=algorithm,
                accuracy_mean=accuracy[0],
                accuracy_std=accuracy[1],
                macro_accuracy_mean=macro[0],
                macro_accuracy_std=macro[1],
                n=len(rows),
                n_seeds=len(group),
                final_round=finals[-1],
                evaluated_model="/".join(dict.fromkeys(row.evaluated_model for row in rows)),
            )
        )
    return table


def majority_row(majority: MajorityClass) -> AccuracyRow:
    """The accuracy table's baseline: always answering the merged test set's most frequent
    label scores its share n_max / N as accuracy and 1 / (classes present) as
    macro-accuracy (recall 1 on that class, 0 on the others); no model, no spread."""
    return AccuracyRow(
        algorithm=f"majority class (always {majority.name})",
        accuracy_mean=majority.rate,
        accuracy_std=0.0,
        macro_accuracy_mean=majority.macro_accuracy,
        macro_accuracy_std=0.0,
        n=0,
        n_seeds=0,
        final_round=0,
        evaluated_model="—",
        baseline=True,
    )


def privacy_table(runs: Sequence[RunResult]) -> list[PrivacyRow]:
    """Per client (ascending): centre, n_train, σ, δ and ε, then Joint's row if Joint ran,
    then PrivateKT's clients if it ran. Every row says which notion its ε is: the DP-SGD
    methods' sample-level (ε, δ)-DP, PrivateKT's label-level ε-LDP (r·ε over the r rounds
    a client reported in, by basic composition, with the per-round ε beside it); the two
    are not comparable.

    A client's ε is its final-round ε in the runs of the first method of
    :data:`EPSILON_SOURCES` present (ProxyFL, else a DP federated baseline), averaged over
    seeds: ε = (1/|S|) Σ_s ε_{c,s}. σ and δ come from run.json's config. Joint's ε is that
    of the pooled training data (one DP-SGD model on n_train = Σ_k n_k examples).
    """
    groups = by_algorithm(runs)
    table: list[PrivacyRow] = []
    source = next((name for name in EPSILON_SOURCES if name in groups), None)
    if source is not None:
        if source != "ProxyFL":
            logger.info("privacy table: no ProxyFL runs, client ε taken from %s", source)
        table += _client_privacy_rows(source, groups[source])
    if JOINT in groups:
        table.append(_joint_privacy_row(groups[JOINT]))
    if PRIVATE_KT in groups:
        table += _client_privacy_rows(PRIVATE_KT, groups[PRIVATE_KT])
    return table


def _client_privacy_rows(source: str, runs: Sequence[RunResult]) -> list[PrivacyRow]:
    epsilons: dict[int, list[float]] = defaultdict(list)
    info: dict[int, tuple[str, int | None]] = {}
    for run in runs:
        for client, epsilon in _final_epsilons(run).items():
            epsilons[client].append(epsilon)
            info.setdefault(client, _client_info(run, client))
    sigma, delta = _sigma_delta(source, runs)
    final = [row for run in runs for row in run.rows if row.round == run.final_round]
    notion = final[0].privacy_notion if final else SAMPLE_DP
    if notion == LABEL_LDP:  # no noise multiplier; δ = 0
        sigma, delta = None, final[0].delta
    per_round = {row.epsilon_per_round for row in final} - {None}
    return [
        PrivacyRow(
            client=str(client),
            center=info[client][0],
            n_train=info[client][1],
            sigma=sigma,
            delta=delta,
            epsilon=_mean_epsilon(epsilons[client]),
            source=source,
            n_seeds=len(epsilons[client]),
            notion=notion,
            epsilon_per_round=max(per_round) if per_round else None,
        )
        for client in sorted(epsilons)
    ]


def _joint_privacy_row(runs: Sequence[RunResult]) -> PrivacyRow:
    values = [eps for run in runs for eps in _final_epsilons(run).values()]
    sigma, delta = _sigma_delta(JOINT, runs)
    clients = runs[0].run.get("clients") or [{}]
    return PrivacyRow(
        client=JOINT,
        center="pooled",
        n_train=_optional_int(clients[0].get("n_train")),
        sigma=sigma,
        delta=delta,
        epsilon=_mean_epsilon(values),
        source=JOINT,
        n_seeds=len(runs),
    )


def _final_epsilons(run: RunResult) -> dict[int, float]:
    """client -> ε at the run's final round (the largest, if a client's rows disagree); a
    null sample-level ε is infinite (σ = 0: no DP, :class:`~proxyfl.results.MetricRow`)."""
    values: dict[int, list[float]] = defaultdict(list)
    for row in run.rows:
        if row.round == run.final_round:
            values[row.client].append(_float(accounted_epsilon(row.epsilon, row.privacy_notion)))
    result = {}
    for client, eps in sorted(values.items()):
        if len(set(eps)) > 1:
            logger.warning("%s: client %d has differing ε %s", run.path, client, sorted(eps))
        result[client] = max(eps)
    return result


def _client_info(run: RunResult, client: int) -> tuple[str, int | None]:
    """(centre, n_train) of a client, from run.json's clients, else its metric rows."""
    for record in run.run.get("clients") or []:
        if isinstance(record, dict) and record.get("client") == client:
            return str(record.get("center", "?")), _optional_int(record.get("n_train"))
    row: MetricRow = next(row for row in run.rows if row.client == client)
    return str(row.center), row.n_train


def _sigma_delta(algorithm: str, runs: Sequence[RunResult]) -> tuple[float | None, float | None]:
    """(σ, δ) of the first run's config (a warning if the seeds disagree)."""
    pairs = [
        (_optional_float(run.config.get("sigma")), _optional_float(run.config.get("delta")))
        for run in runs
    ]
    if len(set(pairs)) > 1:
        logger.warning("%s: seeds differ in (σ, δ) %s; reporting the first", algorithm, pairs)
    return pairs[0]


def curves(runs: Sequence[RunResult]) -> dict[str, list[CurvePoint]]:
    """Per method (paper order), per round t: mean and population std (``ddof=0``) of
    accuracy and macro-accuracy over the models of round t (clients × seeds, or seeds for
    a server's model: :meth:`~analysis.report.load.RunResult.model_rows`)."""
    result: dict[str, list[CurvePoint]] = {}
    for algorithm, group in by_algorithm(runs).items():
        by_round: dict[int, list[MetricRow]] = defaultdict(list)
        for run in group:
            for row in run.model_rows():
                by_round[row.round].append(row)
        result[algorithm] = [_curve_point(t, rows) for t, rows in sorted(by_round.items())]
    return result


def _curve_point(round_number: int, rows: Sequence[MetricRow]) -> CurvePoint:
    accuracy = _mean_std(row.accuracy for row in rows)
    macro = _mean_std(row.macro_accuracy for row in rows)
    return CurvePoint(round_number, accuracy[0], accuracy[1], macro[0], macro[1], len(rows))


def sample_sizes(runs: Sequence[RunResult]) -> dict[str, SampleSize]:
    """Per method (paper order): distinct clients with a model in the final round of any of
    its seeds (1 for a server's model), its number of seeds, and the server's model's name
    where the method reports one."""
    sizes = {}
    for algorithm, group in by_algorithm(runs).items():
        rows = [row for run in group for row in run.model_rows(run.final_round)]
        server = sorted({row.evaluated_model for row in rows} & SERVER_MODELS)
        sizes[algorithm] = SampleSize(
            clients=len({row.client for row in rows}),
            seeds=len({run.seed for run in group}),
            server_model=server[0] if server else None,
        )
    return sizes


def _mean_std(values: Iterable[float | None]) -> tuple[float, float]:
    """(mean, population std with ddof=0); NaN for no values; a null value counts as NaN."""
    array = np.array([_float(v) for v in values], dtype=float)
    if array.size == 0:
        return math.nan, math.nan
    return float(np.mean(array)), float(np.std(array, ddof=0))


def _mean_epsilon(values: Sequence[float]) -> float:
    """The mean of ε over seeds: infinite if any seed's is (no DP there), NaN for none."""
    if any(math.isinf(value) for value in values):
        return math.inf
    return _mean_std(values)[0]


def _float(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _optional_float(value: Any) -> float | None:
    """``value`` as a float if it is a JSON number (not a boolean), else None."""
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if is_number else None


def _optional_int(value: Any) -> int | None:
    """``value`` if it is a JSON integer (not a boolean), else None."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None
