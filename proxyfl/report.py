"""Tables, DVC metrics, learning curves and figures from finished training runs.

Input: ``RUNS/{algorithm}/seed_{s}/{metrics.jsonl,run.json}`` as written by
:mod:`proxyfl.run` (DESIGN.md §3.4). Output of :func:`write_report` under ``OUT``::

    tables/accuracy.{md,csv}   per method: accuracy and macro-accuracy at the final round,
                               mean ± std over clients × seeds (primary models only)
    tables/privacy.{md,csv}    per client: centre, n_train, σ, δ, ε (and Joint's row)
    metrics.json               {method: {accuracy_mean, ...}, "epsilon": {client_k: ε}}
    curves/{method}.csv        round, accuracy, accuracy_std, macro_accuracy, ...
    plots/curves.png           Figure 8: accuracy (left) and macro-accuracy (right) per
                               round, mean line and mean ± std band per method
    plots/{accuracy,macro_accuracy}.png   the same panels as single figures

Statistics are over the pooled sample of ``primary`` metric rows (the model the paper
reports: ProxyFL's and FML's private models, FedAvg's central model, the local model
otherwise), one value per (client, seed). For values x_1..x_n::

    mean = (1/n) Σ x_i        std = sqrt((1/n) Σ (x_i − mean)²)

i.e. the population standard deviation (``numpy.std`` with ``ddof=0``); a single value
has std 0. Every file is written atomically and the output is a deterministic function
of the input (PNG files carry no software/date metadata).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from proxyfl.results import (
    METRICS_FILE,
    RUN_FILE,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
)

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn: tables need none of it
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

logger = logging.getLogger("proxyfl.report")

PAPER_ORDER: tuple[str, ...] = ("Regular", "AvgPush", "CWT", "FedAvg", "FML", "ProxyFL", "Joint")
JOINT = "Joint"
# Where a client's ε comes from: ProxyFL, else the DP federated baselines in paper order,
# else Regular (local DP-SGD only; same σ, sample rate and steps, hence the same ε).
EPSILON_SOURCES: tuple[str, ...] = ("ProxyFL", "AvgPush", "CWT", "FedAvg", "FML", "Regular")
REQUIRED_ROW_FIELDS: tuple[str, ...] = (
    "algorithm",
    "seed",
    "client",
    "round",
    "accuracy",
    "macro_accuracy",
    "epsilon",
    "primary",
)
_SEED_DIR = re.compile(r"^seed_(\d+)$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class ReportError(ValueError):
    """The runs directory cannot be reported on; the message names the file and why."""


# --------------------------------------------------------------------------- data classes


@dataclass(frozen=True)
class RunResult:
    """One finished run: ``RUNS/{algorithm}/seed_{seed}``, its run.json and metric rows."""

    algorithm: str
    seed: int
    path: Path
    run: Mapping[str, Any] = field(repr=False)
    rows: tuple[Mapping[str, Any], ...] = field(repr=False)

    @property
    def final_round(self) -> int:
        """The last round with metrics (equals ``config.rounds`` for a complete run)."""
        return max(int(row["round"]) for row in self.rows)

    @property
    def config(self) -> Mapping[str, Any]:
        return self.run.get("config") or {}

    def primary_rows(self, round_number: int | None = None) -> list[Mapping[str, Any]]:
        """The rows of the reported model, of one round if given, ordered by client."""
        rows = [
            row
            for row in self.rows
            if row["primary"] and (round_number is None or row["round"] == round_number)
        ]
        return sorted(rows, key=lambda row: (row["round"], row["client"]))


@dataclass(frozen=True)
class AccuracyRow:
    """Final-round accuracy of one method: mean and population std over n = clients × seeds."""

    algorithm: str
    accuracy_mean: float
    accuracy_std: float
    macro_accuracy_mean: float
    macro_accuracy_std: float
    n: int
    n_seeds: int
    final_round: int

    MARKDOWN_HEADER: ClassVar[tuple[str, ...]] = ("Method", "Accuracy", "Macro-accuracy", "n")
    MARKDOWN_ALIGN: ClassVar[tuple[str, ...]] = (":--", "--:", "--:", "--:")
    CSV_FIELDS: ClassVar[tuple[str, ...]] = (
        "method",
        "accuracy_mean",
        "accuracy_std",
        "macro_accuracy_mean",
        "macro_accuracy_std",
        "n",
        "n_seeds",
        "final_round",
    )

    def markdown_cells(self) -> tuple[str, ...]:
        return (
            self.algorithm,
            _pm(self.accuracy_mean, self.accuracy_std),
            _pm(self.macro_accuracy_mean, self.macro_accuracy_std),
            str(self.n),
        )

    def csv_record(self) -> dict[str, Any]:
        record = asdict(self)
        record["method"] = record.pop("algorithm")
        return record


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

    MARKDOWN_HEADER: ClassVar[tuple[str, ...]] = (
        "Client",
        "Centre",
        "n_train",
        "σ",
        "δ",
        "ε",
        "ε from",
    )
    MARKDOWN_ALIGN: ClassVar[tuple[str, ...]] = (":--", ":--", "--:", "--:", "--:", "--:", ":--")
    CSV_FIELDS: ClassVar[tuple[str, ...]] = (
        "client",
        "center",
        "n_train",
        "sigma",
        "delta",
        "epsilon",
        "source",
        "n_seeds",
    )

    def markdown_cells(self) -> tuple[str, ...]:
        return (
            self.client,
            self.center,
            "—" if self.n_train is None else str(self.n_train),
            _general(self.sigma),
            _general(self.delta),
            f"{self.epsilon:.2f}",
            self.source,
        )

    def csv_record(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CurvePoint:
    """Mean and population std over clients × seeds of one method's primary rows at a round."""

    round: int
    accuracy_mean: float
    accuracy_std: float
    macro_accuracy_mean: float
    macro_accuracy_std: float
    n: int


@dataclass(frozen=True)
class SampleSize:
    """How many values a method's mean ± std pools: distinct clients (primary rows of the
    final round, over all seeds) and seeds."""

    clients: int
    seeds: int


@dataclass(frozen=True)
class MethodStyle:
    """How one method is drawn in every figure: Okabe–Ito colour, dash pattern, marker."""

    color: str
    linestyle: str | tuple[float, tuple[float, ...]]
    marker: str
    linewidth: float
    alpha: float
    zorder: float


@dataclass(frozen=True)
class ReportPaths:
    """The files :func:`write_report` wrote."""

    accuracy_md: Path
    accuracy_csv: Path
    privacy_md: Path
    privacy_csv: Path
    metrics_json: Path
    curves: Mapping[str, Path]
    accuracy_png: Path
    macro_accuracy_png: Path
    curves_png: Path

    def all(self) -> list[Path]:
        fixed = [self.accuracy_md, self.accuracy_csv, self.privacy_md, self.privacy_csv]
        return [*fixed, self.metrics_json, *self.curves.values(), *self.plots()]

    def plots(self) -> list[Path]:
        return [self.accuracy_png, self.macro_accuracy_png, self.curves_png]


TableRow = AccuracyRow | PrivacyRow

# --------------------------------------------------------------------------- loading


def load_runs(
    runs_dir: Path,
    algorithms: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
) -> list[RunResult]:
    """Load every ``runs_dir/{algorithm}/seed_{s}`` run, in paper order then by seed.

    With ``algorithms`` and/or ``seeds``, only those runs are loaded, and each requested
    pair must exist: every requested algorithm (default: all found) with every requested
    seed (default: at least one seed). Raises :class:`ReportError` when nothing is found,
    a requested run is missing, or a run is unfinished or malformed.
    """
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise ReportError(f"{runs_dir}: runs directory does not exist")
    found = _discover(runs_dir)
    if not found:
        raise ReportError(
            f"{runs_dir}: no runs found (expected {runs_dir}/ALGORITHM/seed_S/{RUN_FILE})"
        )
    selected = _select(runs_dir, found, algorithms, seeds)
    runs = [_load_run(path, algorithm, seed) for (algorithm, seed), path in selected]
    logger.info("loaded %d run(s) from %s", len(runs), runs_dir)
    return runs


def _discover(runs_dir: Path) -> dict[tuple[str, int], Path]:
    """(algorithm, seed) -> directory, for every ``ALGORITHM/seed_S`` directory."""
    found: dict[tuple[str, int], Path] = {}
    for algorithm_dir in sorted(runs_dir.iterdir()):
        if not algorithm_dir.is_dir() or algorithm_dir.name.startswith("."):
            continue
        for seed_dir in sorted(algorithm_dir.iterdir()):
            match = _SEED_DIR.match(seed_dir.name)
            if match and seed_dir.is_dir():
                found[(algorithm_dir.name, int(match.group(1)))] = seed_dir
    return found


def _select(
    runs_dir: Path,
    found: Mapping[tuple[str, int], Path],
    algorithms: Sequence[str] | None,
    seeds: Sequence[int] | None,
) -> list[tuple[tuple[str, int], Path]]:
    wanted_algorithms = (
        list(dict.fromkeys(algorithms)) if algorithms is not None else sorted({a for a, _ in found})
    )
    wanted_seeds = None if seeds is None else {int(s) for s in seeds}
    missing: list[str] = []
    for algorithm in wanted_algorithms:
        have = {s for a, s in found if a == algorithm}
        if wanted_seeds is not None:
            missing += [f"{algorithm}/seed_{s}" for s in sorted(wanted_seeds - have)]
        elif not have:
            missing.append(f"{algorithm} (any seed)")
    if missing and (algorithms is not None or seeds is not None):
        raise ReportError(f"{runs_dir}: requested runs not found: {', '.join(missing)}")
    chosen = [
        (key, path)
        for key, path in found.items()
        if key[0] in wanted_algorithms and (wanted_seeds is None or key[1] in wanted_seeds)
    ]
    return sorted(chosen, key=lambda item: (_order_key(item[0][0]), item[0][1]))


def _load_run(path: Path, algorithm: str, seed: int) -> RunResult:
    run = _read_run_json(path / RUN_FILE)
    _check_run_json(path / RUN_FILE, run, algorithm, seed)
    rows = _read_metric_rows(path / METRICS_FILE, algorithm, seed)
    result = RunResult(algorithm, seed, path, run, tuple(rows))
    _check_rows(path / METRICS_FILE, result)
    return result


def _read_run_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ReportError(f"{path}: missing {RUN_FILE} (the run never started or was moved)")
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ReportError(f"{path}: malformed JSON ({error})") from error
    if not isinstance(run, dict):
        raise ReportError(f"{path}: malformed {RUN_FILE} (expected a JSON object)")
    return run


def _check_run_json(path: Path, run: Mapping[str, Any], algorithm: str, seed: int) -> None:
    status = run.get("status")
    if status != "finished":
        raise ReportError(
            f"{path}: run {algorithm}/seed_{seed} is unfinished (status {status!r}); resume "
            f"it with the same `python -m proxyfl.run` arguments plus --resume "
            f"--out {path.parent}, rerun it, or leave it out of the report"
        )
    config = run.get("config")
    if not isinstance(config, dict):
        raise ReportError(f"{path}: malformed {RUN_FILE} (no 'config' object)")
    if run.get("algorithm") != algorithm or config.get("seed") != seed:
        raise ReportError(
            f"{path}: run.json says algorithm {run.get('algorithm')!r}, seed "
            f"{config.get('seed')!r}, but the directory is {algorithm}/seed_{seed}"
        )


def _read_metric_rows(path: Path, algorithm: str, seed: int) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ReportError(f"{path}: missing {METRICS_FILE}")
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ReportError(f"{path}: line {number}: malformed JSON ({error})") from error
        rows.append(_checked_row(path, number, row, algorithm, seed))
    if not rows:
        raise ReportError(f"{path}: no metrics rows")
    return rows


def _checked_row(path: Path, number: int, row: Any, algorithm: str, seed: int) -> dict[str, Any]:
    where = f"{path}: line {number}"
    if not isinstance(row, dict):
        raise ReportError(f"{where}: expected a JSON object")
    missing = [name for name in REQUIRED_ROW_FIELDS if name not in row]
    if missing:
        raise ReportError(f"{where}: missing field(s) {', '.join(missing)}")
    if row["algorithm"] != algorithm or row["seed"] != seed:
        raise ReportError(
            f"{where}: row of {row['algorithm']!r} seed {row['seed']!r} in the run "
            f"directory of {algorithm}/seed_{seed}"
        )
    if not _is_int(row["round"]) or row["round"] < 1 or not _is_int(row["client"]):
        raise ReportError(f"{where}: 'round' and 'client' must be integers, rounds from 1")
    if not isinstance(row["primary"], bool):
        raise ReportError(f"{where}: 'primary' must be true or false")
    for name in ("accuracy", "macro_accuracy", "epsilon"):
        if row[name] is not None and not _is_number(row[name]):
            raise ReportError(f"{where}: {name!r} must be a number or null")
    return row


def _check_rows(path: Path, run: RunResult) -> None:
    """One primary row per (client, round), and primary rows at the final round."""
    seen: set[tuple[int, int]] = set()
    for row in run.primary_rows():
        key = (row["round"], row["client"])
        if key in seen:
            raise ReportError(f"{path}: two primary rows for client {key[1]} in round {key[0]}")
        seen.add(key)
    if not run.primary_rows(run.final_round):
        raise ReportError(f"{path}: no primary rows in the final round {run.final_round}")
    rounds = run.config.get("rounds")
    if isinstance(rounds, int) and rounds != run.final_round:
        logger.warning(
            "%s: metrics end at round %d but the run was configured for %d rounds",
            path,
            run.final_round,
            rounds,
        )


# --------------------------------------------------------------------------- tables


def accuracy_table(runs: Sequence[RunResult]) -> list[AccuracyRow]:
    """Per method (paper order, unknown names after): final-round accuracy statistics.

    For method A with seeds S and clients C, the sample is {x_{c,s}}: the primary row of
    client c at the final round of seed s, n = |C|·|S| values. Mean and *population* std
    (``numpy.std``, ``ddof=0``) of accuracy and of macro-accuracy (mean per-class recall).
    """
    table = []
    for algorithm, group in _by_algorithm(runs).items():
        rows = [row for run in group for row in run.primary_rows(run.final_round)]
        finals = sorted({run.final_round for run in group})
        if len(finals) > 1:
            logger.warning("%s: seeds end at different rounds %s", algorithm, finals)
        accuracy = _mean_std(row["accuracy"] for row in rows)
        macro = _mean_std(row["macro_accuracy"] for row in rows)
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
            )
        )
    return table


def privacy_table(runs: Sequence[RunResult]) -> list[PrivacyRow]:
    """Per client (ascending): centre, n_train, σ, δ and ε, then Joint's row if Joint ran.

    A client's ε is its final-round ε in the runs of the first method of
    :data:`EPSILON_SOURCES` present (ProxyFL, else a DP federated baseline), averaged over
    seeds: ε = (1/|S|) Σ_s ε_{c,s}. σ and δ come from run.json's config. Joint's ε is that
    of the pooled training data (one DP-SGD model on n_train = Σ_k n_k examples).
    """
    groups = _by_algorithm(runs)
    table: list[PrivacyRow] = []
    source = next((name for name in EPSILON_SOURCES if name in groups), None)
    if source is not None:
        if source != "ProxyFL":
            logger.info("privacy table: no ProxyFL runs, client ε taken from %s", source)
        table += _client_privacy_rows(source, groups[source])
    if JOINT in groups:
        table.append(_joint_privacy_row(groups[JOINT]))
    return table


def _client_privacy_rows(source: str, runs: Sequence[RunResult]) -> list[PrivacyRow]:
    epsilons: dict[int, list[float]] = defaultdict(list)
    info: dict[int, tuple[str, int | None]] = {}
    for run in runs:
        for client, epsilon in _final_epsilons(run).items():
            epsilons[client].append(epsilon)
            info.setdefault(client, _client_info(run, client))
    sigma, delta = _sigma_delta(source, runs)
    return [
        PrivacyRow(
            client=str(client),
            center=info[client][0],
            n_train=info[client][1],
            sigma=sigma,
            delta=delta,
            epsilon=_mean_std(epsilons[client])[0],
            source=source,
            n_seeds=len(epsilons[client]),
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
        epsilon=_mean_std(values)[0],
        source=JOINT,
        n_seeds=len(runs),
    )


def _final_epsilons(run: RunResult) -> dict[int, float]:
    """client -> ε at the run's final round (the largest, if a client's rows disagree)."""
    values: dict[int, list[float]] = defaultdict(list)
    for row in run.rows:
        if row["round"] == run.final_round:
            values[row["client"]].append(_float(row["epsilon"]))
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
    row = next(row for row in run.rows if row["client"] == client)
    return str(row.get("center", "?")), _optional_int(row.get("n_train"))


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
    accuracy and macro-accuracy over the primary rows of round t of all clients × seeds."""
    result: dict[str, list[CurvePoint]] = {}
    for algorithm, group in _by_algorithm(runs).items():
        by_round: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
        for run in group:
            for row in run.primary_rows():
                by_round[row["round"]].append(row)
        result[algorithm] = [_curve_point(t, rows) for t, rows in sorted(by_round.items())]
    return result


def _curve_point(round_number: int, rows: Sequence[Mapping[str, Any]]) -> CurvePoint:
    accuracy = _mean_std(row["accuracy"] for row in rows)
    macro = _mean_std(row["macro_accuracy"] for row in rows)
    return CurvePoint(round_number, accuracy[0], accuracy[1], macro[0], macro[1], len(rows))


# --------------------------------------------------------------------------- formatting


def format_table(rows: Sequence[TableRow]) -> str:
    """The markdown table of accuracy or privacy rows ("" for no rows), newline-terminated.

    Accuracy cells read "0.812 ± 0.034" (3 decimals), ε has 2 decimals.
    """
    if not rows:
        return ""
    kind = type(rows[0])
    if any(type(row) is not kind for row in rows):
        raise TypeError("format_table: rows of one kind only (AccuracyRow or PrivacyRow)")
    lines = [_markdown_line(kind.MARKDOWN_HEADER), _markdown_line(kind.MARKDOWN_ALIGN)]
    lines += [_markdown_line(row.markdown_cells()) for row in rows]
    return "\n".join(lines) + "\n"


def format_csv(rows: Sequence[TableRow]) -> str:
    """CSV of accuracy or privacy rows, mean and std in separate columns ("" for no rows)."""
    if not rows:
        return ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=type(rows[0]).CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: _csv_value(value) for key, value in row.csv_record().items()})
    return buffer.getvalue()


def _markdown_line(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _pm(mean: float, std: float) -> str:
    return f"{mean:.3f} ± {std:.3f}"


def _general(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def _csv_value(value: Any) -> Any:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value


# --------------------------------------------------------------------------- writing


def write_report(runs: Sequence[RunResult], out_dir: Path) -> ReportPaths:
    """Write tables, metrics.json, per-method curves and the figures under ``out_dir``.

    Every file is replaced atomically; curve CSVs of methods no longer present are removed.
    """
    if not runs:
        raise ReportError("no runs to report")
    out_dir = Path(out_dir)
    accuracy = accuracy_table(runs)
    privacy = privacy_table(runs)
    per_round = curves(runs)
    tables = out_dir / "tables"
    paths = ReportPaths(
        accuracy_md=tables / "accuracy.md",
        accuracy_csv=tables / "accuracy.csv",
        privacy_md=tables / "privacy.md",
        privacy_csv=tables / "privacy.csv",
        metrics_json=out_dir / "metrics.json",
        curves={name: out_dir / "curves" / f"{safe_name(name)}.csv" for name in per_round},
        accuracy_png=out_dir / "plots" / "accuracy.png",
        macro_accuracy_png=out_dir / "plots" / "macro_accuracy.png",
        curves_png=out_dir / "plots" / "curves.png",
    )
    atomic_write_text(paths.accuracy_md, format_table(accuracy) + _accuracy_note(accuracy))
    atomic_write_text(paths.accuracy_csv, format_csv(accuracy))
    atomic_write_text(paths.privacy_md, format_table(privacy))
    atomic_write_text(paths.privacy_csv, format_csv(privacy))
    atomic_write_json(paths.metrics_json, dvc_metrics(accuracy, privacy))
    _write_curves(per_round, paths.curves)
    title = sample_title(sample_sizes(runs))
    plot_curves(per_round, "accuracy", "Accuracy", paths.accuracy_png, title=title)
    plot_curves(
        per_round, "macro_accuracy", "Macro-accuracy", paths.macro_accuracy_png, title=title
    )
    plot_figure(per_round, paths.curves_png, title=title)
    logger.info("report of %d run(s) written to %s", len(runs), out_dir)
    return paths


def _accuracy_note(rows: Sequence[AccuracyRow]) -> str:
    finals = sorted({row.final_round for row in rows})
    return (
        f"\nFinal round {', '.join(map(str, finals))}; mean ± population std (ddof=0) "
        "over clients × seeds of the reported model.\n"
    )


def dvc_metrics(accuracy: Sequence[AccuracyRow], privacy: Sequence[PrivacyRow]) -> dict[str, Any]:
    """``{method: {accuracy_mean, accuracy_std, macro_accuracy_mean, macro_accuracy_std},
    "epsilon": {client_k | Joint: ε}}`` with keys free of dots and spaces."""
    metrics: dict[str, Any] = {
        safe_name(row.algorithm): {
            "accuracy_mean": row.accuracy_mean,
            "accuracy_std": row.accuracy_std,
            "macro_accuracy_mean": row.macro_accuracy_mean,
            "macro_accuracy_std": row.macro_accuracy_std,
        }
        for row in accuracy
    }
    metrics["epsilon"] = {
        (JOINT if row.client == JOINT else f"client_{safe_name(row.client)}"): row.epsilon
        for row in privacy
    }
    return metrics


def _write_curves(per_round: Mapping[str, list[CurvePoint]], paths: Mapping[str, Path]) -> None:
    fields = ("round", "accuracy", "accuracy_std", "macro_accuracy", "macro_accuracy_std")
    for algorithm, points in per_round.items():
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(fields)
        for p in points:
            cells = (p.accuracy_mean, p.accuracy_std, p.macro_accuracy_mean, p.macro_accuracy_std)
            writer.writerow([p.round, *(_csv_value(c) for c in cells)])
        atomic_write_text(paths[algorithm], buffer.getvalue())
    for directory in {path.parent for path in paths.values()}:
        for stale in sorted(set(directory.glob("*.csv")) - set(paths.values())):
            logger.info("removing stale curve %s", stale)
            stale.unlink()


# --------------------------------------------------------------------------- figures

# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour
# vision deficiency. Grey is the ninth colour of R's ``palette.colors("Okabe-Ito")``; yellow
# is kept for unknown methods only, as it fades on white paper.
OKABE_ITO: dict[str, str] = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky blue": "#56B4E9",
    "bluish green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish purple": "#CC79A7",
    "grey": "#999999",
}
EMPHASISED = "ProxyFL"
# Colour, dash pattern (offset, on-off lengths in line widths) and marker per method: each
# pair of dash pattern and marker is unique too, so the lines stay apart in greyscale.
_STYLES: dict[str, tuple[str, str | tuple[float, tuple[float, ...]], str]] = {
    "Regular": (OKABE_ITO["grey"], (0, (1, 1.5)), "v"),
    "AvgPush": (OKABE_ITO["sky blue"], (0, (5, 1.5, 1, 1.5)), "^"),
    "CWT": (OKABE_ITO["reddish purple"], (0, (5, 1.5, 1, 1.5, 1, 1.5)), "s"),
    "FedAvg": (OKABE_ITO["bluish green"], (0, (3, 1.5)), "D"),
    "FML": (OKABE_ITO["blue"], (0, (8, 2)), "P"),
    "ProxyFL": (OKABE_ITO["vermillion"], "solid", "o"),
    "Joint": (OKABE_ITO["black"], (0, (8, 2, 1, 2)), "X"),
}
_OTHER_COLORS = (OKABE_ITO["orange"], OKABE_ITO["yellow"])
_OTHER_LINESTYLES: tuple[tuple[float, tuple[float, ...]], ...] = (
    (0, (2, 1)),
    (0, (8, 2, 1, 2, 1, 2)),
    (0, (12, 3)),
)
_OTHER_MARKERS = ("<", ">", "h", "p", "*")
_PANELS: tuple[tuple[str, str], ...] = (
    ("accuracy", "Accuracy"),
    ("macro_accuracy", "Macro-accuracy"),
)
_MAX_MARKERS = 12  # per line; more rounds than this get a marker every few rounds
_BAND_ALPHA = 0.12


def method_style(algorithm: str) -> MethodStyle:
    """The fixed style of a method, the same in every figure: ProxyFL thick, opaque and on
    top; the others thinner and slightly transparent so that overlapping lines show."""
    if algorithm in _STYLES:
        color, linestyle, marker = _STYLES[algorithm]
    else:  # a deterministic function of the name (``hash`` of a str differs per process)
        code = sum(map(ord, algorithm))
        color = _OTHER_COLORS[code % len(_OTHER_COLORS)]
        linestyle = _OTHER_LINESTYLES[code % len(_OTHER_LINESTYLES)]
        marker = _OTHER_MARKERS[code % len(_OTHER_MARKERS)]
    if algorithm == EMPHASISED:
        return MethodStyle(color, linestyle, marker, linewidth=2.6, alpha=1.0, zorder=4.0)
    return MethodStyle(color, linestyle, marker, linewidth=1.4, alpha=0.85, zorder=3.0)


def sample_sizes(runs: Sequence[RunResult]) -> dict[str, SampleSize]:
    """Per method (paper order): distinct clients with a primary row in the final round of
    any of its seeds, and its number of seeds."""
    return {
        algorithm: SampleSize(
            clients=len(
                {row["client"] for run in group for row in run.primary_rows(run.final_round)}
            ),
            seeds=len({run.seed for run in group}),
        )
        for algorithm, group in _by_algorithm(runs).items()
    }


def sample_title(sizes: Mapping[str, SampleSize]) -> str:
    """What the mean ± std of a figure pools, e.g. "Mean ± std over 4 clients × 3 seeds
    (Joint: 1 pooled model × 3 seeds)"; counts that differ between methods read as a range
    ("2–4 clients"). Joint is stated apart: it is one model on pooled data, not a client."""
    federated = [size for name, size in sizes.items() if name != JOINT]
    parts = []
    if federated:
        clients = _count([size.clients for size in federated], "client")
        parts.append(f"{clients} × {_count([size.seeds for size in federated], 'seed')}")
    if JOINT in sizes:
        joint = sizes[JOINT]
        pooled = f"{_count([joint.clients], 'pooled model')} × {_count([joint.seeds], 'seed')}"
        parts.append(f"(Joint: {pooled})" if federated else pooled)
    return "Mean ± std over " + " ".join(parts) if parts else "Mean ± std"


def _count(values: Sequence[int], noun: str) -> str:
    low, high = min(values), max(values)
    number = str(low) if low == high else f"{low}–{high}"
    return f"{number} {noun}{'' if high == 1 else 's'}"


def plot_curves(
    per_round: Mapping[str, Sequence[CurvePoint]],
    metric: str,
    label: str,
    path: Path,
    *,
    title: str | None = None,
) -> Figure:
    """Write one panel of Figure 8 as a PNG and return its figure: one line per method
    (legend in paper order) with a mean ± std band; x = round. ``metric``: accuracy |
    macro_accuracy."""
    figure = _figure(figsize=(7.6, 4.4))
    axes = figure.add_subplot()
    lines = _draw_panel(axes, per_round, metric, label)
    _legend(figure, lines, loc="outside right upper", ncols=1)
    if title:  # over the panel, not the figure: the legend takes the top right corner
        axes.set_title(title, fontsize="medium")
    _save_png(figure, path)
    return figure


def plot_figure(per_round: Mapping[str, Sequence[CurvePoint]], path: Path, *, title: str) -> Figure:
    """Write Figure 8 of the ProxyFL paper as a PNG and return it: accuracy (left) and
    macro-accuracy (right) per round, one mean line and mean ± std band per method, one
    legend in paper order below both panels and ``title`` (see :func:`sample_title`) above."""
    figure = _figure(figsize=(11.0, 4.6))
    panels = figure.subplots(1, len(_PANELS))
    lines: list[Line2D] = []
    for axes, (metric, label) in zip(panels, _PANELS, strict=True):
        lines = _draw_panel(axes, per_round, metric, label)
        axes.set_title(label)
    _legend(figure, lines, loc="outside lower center", ncols=min(len(lines), 7))
    figure.suptitle(title)
    _save_png(figure, path)
    return figure


def _figure(figsize: tuple[float, float]) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # Constrained layout leaves room for a legend placed "outside" the panels.
    figure = Figure(figsize=figsize, dpi=120, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _legend(figure: Figure, lines: Sequence[Line2D], *, loc: str, ncols: int) -> None:
    """One legend for the figure, outside the panels so that it hides no data; long handles
    so that the dash patterns can be told apart."""
    if lines:
        figure.legend(handles=lines, loc=loc, ncols=max(ncols, 1), handlelength=3.5)


def _draw_panel(
    axes: Axes, per_round: Mapping[str, Sequence[CurvePoint]], metric: str, label: str
) -> list[Line2D]:
    """Draw every method's mean line and mean ± std band of ``metric`` on ``axes``; return
    the lines in paper order (the legend's handles)."""
    from matplotlib.ticker import MaxNLocator

    methods = sorted(per_round, key=_order_key)
    longest = max((len(per_round[name]) for name in methods), default=0)
    step = max(1, math.ceil(longest / _MAX_MARKERS))
    lines: list[Line2D] = []
    band_edges: list[np.ndarray] = []
    for index, algorithm in enumerate(methods):
        points = per_round[algorithm]
        x = np.array([p.round for p in points], dtype=float)
        mean = np.array([getattr(p, f"{metric}_mean") for p in points], dtype=float)
        std = np.array([getattr(p, f"{metric}_std") for p in points], dtype=float)
        style = method_style(algorithm)
        # Bands under every line; each method's markers start at a different round so that
        # markers of methods with equal values do not hide one another.
        band = {"color": style.color, "alpha": _BAND_ALPHA, "linewidth": 0, "zorder": 1.0}
        axes.fill_between(x, mean - std, mean + std, **band)
        (line,) = axes.plot(
            x,
            mean,
            label=algorithm,
            color=style.color,
            linestyle=style.linestyle,
            linewidth=style.linewidth,
            alpha=style.alpha,
            zorder=style.zorder,
            marker=style.marker,
            markersize=4.5 + 0.75 * style.linewidth,
            markeredgecolor="white",
            markeredgewidth=0.6,
            markevery=(index % step, step),
        )
        lines.append(line)
        band_edges += [mean - std, mean + std]
    axes.set_xlabel("Round")
    axes.set_ylabel(label)
    axes.set_ylim(*_y_limits(band_edges))
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    return lines


def _y_limits(values: Sequence[np.ndarray]) -> tuple[float, float]:
    """The y range: the smallest holding every mean and band edge (at least 0.1 wide), plus
    a margin so that a line at the edge stays visible; [0, 1] when there is no data."""
    finite = np.concatenate([*values, np.array([])])
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return 0.0, 1.0
    low, high = float(finite.min()), float(finite.max())
    if high - low < 0.1:
        centre = (low + high) / 2
        low, high = centre - 0.05, centre + 0.05
    margin = 0.04 * (high - low)
    return low - margin, high + margin


def _save_png(figure: Figure, path: Path) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    atomic_write_bytes(path, buffer.getvalue())


# --------------------------------------------------------------------------- helpers


def safe_name(name: str) -> str:
    """``name`` with every character outside [A-Za-z0-9_-] replaced by "_" (DVC keys, files)."""
    return _UNSAFE.sub("_", name)


def _order_key(algorithm: str) -> tuple[int, str]:
    """Paper order first, unknown methods after in alphabetical order."""
    if algorithm in PAPER_ORDER:
        return PAPER_ORDER.index(algorithm), ""
    return len(PAPER_ORDER), algorithm


def _by_algorithm(runs: Sequence[RunResult]) -> dict[str, list[RunResult]]:
    groups: dict[str, list[RunResult]] = defaultdict(list)
    for run in sorted(runs, key=lambda r: (_order_key(r.algorithm), r.seed)):
        groups[run.algorithm].append(run)
    return dict(groups)


def _mean_std(values: Iterable[Any]) -> tuple[float, float]:
    """(mean, population std with ddof=0); NaN for no values; a null value counts as NaN."""
    array = np.array([_float(v) for v in values], dtype=float)
    if array.size == 0:
        return math.nan, math.nan
    return float(np.mean(array)), float(np.std(array, ddof=0))


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def _optional_float(value: Any) -> float | None:
    return float(value) if _is_number(value) else None


def _optional_int(value: Any) -> int | None:
    return int(value) if _is_int(value) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
