"""Which finished runs a report may table: only runs of the configuration it is given.

A run records the configuration that made it (``run.json``'s ``fingerprint``,
:meth:`proxyfl.config.TrainConfig.fingerprint`). A run listed for the report whose
fingerprint differs from the one its parameters give, or whose metrics stop before its
last round, is never averaged into a row: by default the report is refused, naming each
such run and what differs; asked explicitly (``other="separate"``), those runs are
tabled apart, one table per set of differing values, labelled with them. Runs that exist
in the runs directory but are not listed are named in a note.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from analysis.report.load import ReportError, RunResult, discover_runs, load_runs, order_key
from proxyfl.config import fingerprint_changes

logger = logging.getLogger(__name__)

OtherRuns = Literal["refuse", "separate"]
Fingerprint = Mapping[str, Any]


@dataclass(frozen=True)
class OtherConfiguration:
    """A listed run made with other parameters than the report's: ``changes`` maps each
    differing key to (the run's value, the report's value)."""

    run: RunResult
    changes: Mapping[str, tuple[Any, Any]]

    @property
    def name(self) -> str:
        return f"{self.run.algorithm}/seed_{self.run.seed}"

    @property
    def label(self) -> str:
        """The run's own values of the differing keys: ``rounds=5, sigma=1.0``."""
        return ", ".join(f"{key}={_value(old)}" for key, (old, _) in self.changes.items())

    def describe(self) -> str:
        """``ProxyFL/seed_0 (runs/ProxyFL/seed_0): rounds 5, the parameters say 10``."""
        differences = "; ".join(
            f"{key} {_value(old)}, the parameters say {_value(new)}"
            for key, (old, new) in self.changes.items()
        )
        return f"{self.name} ({self.run.path}): {differences}"


@dataclass(frozen=True)
class RunSelection:
    """The runs to table (``runs``), the listed runs of other configurations tabled apart
    (``other``, only when asked), and the runs found but not listed (``unlisted``)."""

    runs: list[RunResult]
    other: list[OtherConfiguration] = field(default_factory=list)
    unlisted: list[str] = field(default_factory=list)

    def other_groups(self) -> dict[str, list[RunResult]]:
        """The runs of other configurations, one group per label, in paper order."""
        groups: dict[str, list[RunResult]] = {}
        for item in sorted(self.other, key=lambda o: (o.label, order_key(o.run.algorithm))):
            groups.setdefault(item.label, []).append(item.run)
        return groups

    def unlisted_note(self) -> str:
        """One sentence naming the runs left out because they are not listed ("" if none)."""
        if not self.unlisted:
            return ""
        return (f"Not listed in the parameters (train.algorithms, train.seeds), so not in "
                f"these tables: {', '.join(self.unlisted)}.")  # fmt: skip


def _value(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def configuration_of(run: RunResult, expected: Fingerprint) -> dict[str, tuple[Any, Any]]:
    """How ``run`` differs from the ``expected`` fingerprint: its recorded configuration
    (every key, run's value and expected value), and its last round of metrics against its
    own configured rounds (``final_round``). Empty when it is a run of ``expected``."""
    recorded = run.run.get("fingerprint")
    if not isinstance(recorded, Mapping):
        return {"configuration": ("not recorded", "recorded")}
    changes = fingerprint_changes(recorded, json.loads(json.dumps(dict(expected))))
    rounds = recorded.get("rounds")
    if isinstance(rounds, int) and run.final_round != rounds:
        changes["final_round"] = (run.final_round, rounds)
    return changes


def select_runs(
    runs_dir: Path,
    algorithms: Sequence[str],
    seeds: Sequence[int],
    expected: Mapping[tuple[str, int], Fingerprint] | None = None,
    other: OtherRuns = "refuse",
) -> RunSelection:
    """The listed runs of ``runs_dir`` (every algorithm × seed, finished and well formed:
    :func:`~analysis.report.load.load_runs`), checked against ``expected[(algorithm,
    seed)]``; a :class:`ReportError` naming every run of another configuration unless
    ``other`` is ``"separate"``. With ``expected`` None, runs are not compared."""
    loaded = load_runs(runs_dir, algorithms=algorithms, seeds=seeds)
    listed = {(a, s) for a in algorithms for s in seeds}
    unlisted = [f"{a}/seed_{s}" for (a, s) in sorted(discover_runs(Path(runs_dir)),
                key=lambda key: (order_key(key[0]), key[1])) if (a, s) not in listed]  # fmt: skip
    if unlisted:
        logger.warning("%s: runs not listed, left out of the report: %s", runs_dir,
                       ", ".join(unlisted))  # fmt: skip
    if expected is None:
        return RunSelection(loaded, [], unlisted)
    matching, others = [], []
    for run in loaded:
        changes = configuration_of(run, expected[(run.algorithm, run.seed)])
        if changes:
            others.append(OtherConfiguration(run, changes))
        else:
            matching.append(run)
    if others and other == "refuse":
        raise ReportError(
            f"{runs_dir}: {len(others)} run(s) were made with other parameters than the "
            f"report's, and are not tabled with the others: "
            + " | ".join(o.describe() for o in others)
            + ". Train them with these parameters (`python -m flows.train --algorithms ... "
            "--seeds ... --replace`, or `dvc repro`), report on the parameters they were made "
            "with (--config, or the flags that made them), or table them apart "
            "(--other-configurations separate)"
        )
    if others:
        logger.warning("runs of other configurations, tabled apart: %s",
                       "; ".join(o.describe() for o in others))  # fmt: skip
    if not matching:
        raise ReportError(
            f"{runs_dir}: no listed run was made with the report's parameters: "
            + " | ".join(o.describe() for o in others)
        )
    return RunSelection(matching, others, unlisted)
