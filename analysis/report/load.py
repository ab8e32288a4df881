"""Reading finished runs: ``RUNS/{algorithm}/seed_{s}/{run.json,metrics.jsonl}`` into
:class:`RunResult`\\ s of validated :class:`~proxyfl.results.MetricRow`\\ s.

Every problem is a :class:`ReportError` naming the file (and for a metrics line, the line
and the field) and what is wrong, so that a report never averages a half-written run.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from proxyfl.kept import verify_kept
from proxyfl.names import ALGORITHMS
from proxyfl.results import METRICS_FILE, RUN_FILE, SAMPLE_DP, MetricRow

logger = logging.getLogger(__name__)

PAPER_ORDER: tuple[str, ...] = ALGORITHMS
JOINT = "Joint"
# the server's model (FedAvg, PrivateKT: proxyfl.algorithms.strategies): after a round every
# client holds the same one and tests it on the same merged test set, so a seed's clients
# report one model, not one each
SERVER_MODELS = frozenset({"central"})
_SEED_DIR = re.compile(r"^seed_(\d+)$")


class ReportError(ValueError):
    """The runs directory cannot be reported on; the message names the file and why."""


@dataclass(frozen=True)
class RunResult:
    """One finished run: ``RUNS/{algorithm}/seed_{seed}``, its run.json and metric rows."""

    algorithm: str
    seed: int
    path: Path
    run: Mapping[str, Any] = field(repr=False)
    rows: tuple[MetricRow, ...] = field(repr=False)

    @property
    def final_round(self) -> int:
        """The last round with metrics (equals ``config.rounds`` for a complete run)."""
        return max(row.round for row in self.rows)

    @property
    def config(self) -> Mapping[str, Any]:
        return self.run.get("config") or {}

    def primary_rows(self, round_number: int | None = None) -> list[MetricRow]:
        """The rows of the reported model, of one round if given, ordered by client."""
        rows = [
            row
            for row in self.rows
            if row.primary and (round_number is None or row.round == round_number)
        ]
        return sorted(rows, key=lambda row: (row.round, row.client))

    def model_rows(self, round_number: int | None = None) -> list[MetricRow]:
        """:meth:`primary_rows`, one per distinct model: a model of
        :data:`SERVER_MODELS` counts once a round (its lowest client's row), so that a mean ±
        std over these rows pools independent models, never one model repeated per client."""
        kept: dict[tuple[int, str], MetricRow] = {}
        distinct = []
        for row in self.primary_rows(round_number):
            if row.evaluated_model in SERVER_MODELS:
                first = kept.setdefault((row.round, row.evaluated_model), row)
                if first is not row:
                    if first.accuracy != row.accuracy:  # one model, one test set: a fault
                        logger.warning("%s: round %d: client %d's %s model scores %s, client "
                                       "%d's %s", self.path, row.round, first.client,
                                       row.evaluated_model, first.accuracy, row.client,
                                       row.accuracy)  # fmt: skip
                    continue
            distinct.append(row)
        return distinct


def accounted_epsilon(epsilon: float | None, notion: str) -> float | None:
    """The ε a record states: a null sample-level ε is infinite, since σ = 0 (no DP)
    accounts ε = ∞ and strict JSON writes it as null (:class:`~proxyfl.results.MetricRow`,
    ``run.json``, ``audit.json``); a null ε of another notion stays unknown (None)."""
    if epsilon is None and notion == SAMPLE_DP:
        return math.inf
    return epsilon


def order_key(algorithm: str) -> tuple[int, str]:
    """Paper order first, unknown methods after in alphabetical order."""
    if algorithm in PAPER_ORDER:
        return PAPER_ORDER.index(algorithm), ""
    return len(PAPER_ORDER), algorithm


def by_algorithm(runs: Sequence[RunResult]) -> dict[str, list[RunResult]]:
    """The runs grouped per method, methods in paper order, each group by seed."""
    groups: dict[str, list[RunResult]] = defaultdict(list)
    for run in sorted(runs, key=lambda r: (order_key(r.algorithm), r.seed)):
        groups[run.algorithm].append(run)
    return dict(groups)


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
    found = discover_runs(runs_dir)
    if not found:
        raise ReportError(
            f"{runs_dir}: no runs found (expected {runs_dir}/ALGORITHM/seed_S/{RUN_FILE})"
        )
    selected = _select(runs_dir, found, algorithms, seeds)
    runs = [_load_run(path, algorithm, seed) for (algorithm, seed), path in selected]
    logger.info("loaded %d run(s) from %s", len(runs), runs_dir)
    return runs


def discover_runs(runs_dir: Path) -> dict[tuple[str, int], Path]:
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
        pending = [
            name
            for name in missing
            if (runs_dir / name.replace("/seed_", "/.seed_")).with_suffix(".next").is_dir()
        ]
        note = (f" ({', '.join(pending)}: a replacement is pending beside it, in "
                f".seed_S.next; `python -m flows.train --algorithms A --seeds S --replace` "
                f"finishes it)" if pending else "")  # fmt: skip
        raise ReportError(f"{runs_dir}: requested runs not found: {', '.join(missing)}{note}")
    chosen = [
        (key, path)
        for key, path in found.items()
        if key[0] in wanted_algorithms and (wanted_seeds is None or key[1] in wanted_seeds)
    ]
    return sorted(chosen, key=lambda item: (order_key(item[0][0]), item[0][1]))


def _load_run(path: Path, algorithm: str, seed: int) -> RunResult:
    for name in (RUN_FILE, METRICS_FILE):  # DamagedFileError: named, with its repair
        verify_kept(path / name, path)
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
            f"--run-dir {path.parent}, rerun it, or leave it out of the report"
        )
    config = run.get("config")
    if not isinstance(config, dict):
        raise ReportError(f"{path}: malformed {RUN_FILE} (no 'config' object)")
    if run.get("algorithm") != algorithm or config.get("seed") != seed:
        raise ReportError(
            f"{path}: run.json says algorithm {run.get('algorithm')!r}, seed "
            f"{config.get('seed')!r}, but the directory is {algorithm}/seed_{seed}"
        )


def _read_metric_rows(path: Path, algorithm: str, seed: int) -> list[MetricRow]:
    if not path.is_file():
        raise ReportError(f"{path}: missing {METRICS_FILE}")
    rows: list[MetricRow] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ReportError(f"{path}: line {number}: malformed JSON ({error})") from error
        rows.append(_checked_row(f"{path}: line {number}", row, algorithm, seed))
    if not rows:
        raise ReportError(f"{path}: no metrics rows")
    return rows


def _checked_row(where: str, row: Any, algorithm: str, seed: int) -> MetricRow:
    """``row`` validated as a :class:`MetricRow` of this run's algorithm and seed."""
    if not isinstance(row, dict):
        raise ReportError(f"{where}: expected a JSON object")
    try:
        checked = MetricRow.model_validate(row)
    except ValidationError as error:
        raise ReportError(f"{where}: {describe_validation_error(error)}") from None
    if checked.algorithm != algorithm or checked.seed != seed:
        raise ReportError(
            f"{where}: row of {checked.algorithm!r} seed {checked.seed!r} in the run "
            f"directory of {algorithm}/seed_{seed}"
        )
    return checked


def describe_validation_error(error: ValidationError) -> str:
    """The fields a row lacks ("missing field(s) client, round"; nested ones by their path,
    "rows.2.mia_auc"), then each bad field with what it must be and what it holds ("field
    'round': Input should be ..., got 1.5"; a long value shortened)."""
    missing = [".".join(map(str, e["loc"])) for e in error.errors() if e["type"] == "missing"]
    parts = [f"missing field(s) {', '.join(missing)}"] if missing else []
    parts += [
        f"field {'.'.join(map(str, e['loc']))!r}: {e['msg']}, got {_shortened(repr(e['input']))}"
        for e in error.errors()
        if e["type"] != "missing"
    ]
    return "; ".join(parts)


def _shortened(text: str, most: int = 80) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def _check_rows(path: Path, run: RunResult) -> None:
    """One primary row per (client, round), and primary rows at the final round."""
    seen: set[tuple[int, int]] = set()
    for row in run.primary_rows():
        key = (row.round, row.client)
        if key in seen:
            raise ReportError(f"{path}: two primary rows for client {key[1]} in round {key[0]}")
        seen.add(key)
    if not run.primary_rows(run.final_round):
        raise ReportError(f"{path}: no primary rows in the final round {run.final_round}")
    listed = {c.get("client") for c in run.run.get("clients") or [] if isinstance(c, dict)}
    reported = {row.client for row in run.primary_rows(run.final_round)}
    missing = sorted(c for c in listed - reported if isinstance(c, int))
    if missing:  # a mean over fewer clients than trained would be reported silently
        raise ReportError(
            f"{path}: no row of client(s) {', '.join(map(str, missing))} in the final round "
            f"{run.final_round}, though {RUN_FILE} lists them: the file was cut short or "
            f"edited; train the run again (`python -m flows.train --algorithms "
            f"{run.algorithm} --seeds {run.seed} --replace`, or `dvc repro -f "
            f"train@{run.algorithm}-{run.seed}`)"
        )
    rounds = run.config.get("rounds")
    if isinstance(rounds, int) and rounds != run.final_round:
        logger.warning(
            "%s: metrics end at round %d but the run was configured for %d rounds",
            path,
            run.final_round,
            rounds,
        )
