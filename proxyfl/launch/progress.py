"""Following a training job while it runs: its ranks' log lines, and its rounds.

- :class:`RankLineParser` splits a line of ``proxyfl.run``'s logging format
  (``TIME [rank k] LEVEL logger: message``) so that a caller can forward it at its level,
  without a second timestamp;
- :class:`RoundFollower` watches ``metrics.jsonl`` (rank 0 rewrites it after each round
  with every client's rows) and says when a round is complete, with its mean accuracy,
  the largest ε so far and the time left at the pace of the rounds seen.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

from proxyfl.results import MetricRow, read_metrics


def rank_line_format(place: str) -> str:
    """The logging format of a rank's lines, ``place`` its bracket (``rank 1``, or the
    ``%(place)s`` field a hosting rank fills in): the lines :data:`_RANK_LINE` reads."""
    return f"%(asctime)s [{place}] %(levelname)s %(name)s: %(message)s"


_RANK_LINE = re.compile(
    r"^\S+ \S+ \[(?P<place>rank (?P<rank>\d+)(?: client \d+)?)\] (?P<level>[A-Z]+) "
    r"(?P<name>[\w.]+): (?P<message>.*)$"
)  # a rank's line; "rank R client C" from a rank that hosts several clients


@dataclass(frozen=True)
class RankLine:
    """One line of a job's output: the rank and level it came with (``None`` and the level
    of the line before, for a continuation such as a traceback or mpiexec's own output)."""

    rank: int | None
    level: int
    text: str  # the message, without the rank's timestamp


class RankLineParser:
    """Parses a job's lines in order; a line not in the ranks' format continues the last."""

    def __init__(self) -> None:
        self._level = logging.INFO

    def parse(self, line: str) -> RankLine:
        match = _RANK_LINE.match(line)
        if match is None:
            return RankLine(None, self._level, line)
        level = logging.getLevelName(match["level"])
        self._level = level if isinstance(level, int) else logging.INFO
        return RankLine(int(match["rank"]), self._level, f"[{match['place']}] "
                        f"{match['level']} {match['name']}: {match['message']}")  # fmt: skip


@dataclass(frozen=True)
class RoundProgress:
    """A job after one more complete round."""

    round: int
    rounds: int
    accuracy: float | None  # mean over clients of the primary model's accuracy
    epsilon: float | None  # the largest ε any client has spent; None when infinite
    elapsed_seconds: float
    left_seconds: float | None  # at the pace of the rounds run since launch

    @property
    def percent(self) -> float:
        return 100.0 * self.round / self.rounds if self.rounds else 100.0

    def line(self) -> str:
        accuracy = "n/a" if self.accuracy is None else f"{self.accuracy:.3f}"
        epsilon = "∞" if self.epsilon is None else f"{self.epsilon:.2f}"
        left = "" if self.left_seconds is None else f", ~{_duration(self.left_seconds)} left"
        return (f"round {self.round}/{self.rounds}: accuracy {accuracy}, ε {epsilon}, "
                f"{_duration(self.elapsed_seconds)} elapsed{left}")  # fmt: skip


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class RoundFollower:
    """The rounds of ``metrics.jsonl`` completed since the last :meth:`poll`."""

    def __init__(self, metrics_path: Path, rounds: int) -> None:
        self.path, self.rounds = Path(metrics_path), rounds
        self.started = time.monotonic()
        self._stamp: tuple[int, int] | None = None
        # rounds already there (a resumed run's) took none of this launch's time
        self._first_round = max((row.round for row in read_metrics(self.path)), default=0)
        self._last_round = self._first_round

    def poll(self) -> list[RoundProgress]:
        """Cheap when nothing changed (one ``stat``); a half-written file cannot be seen
        (rank 0 replaces it atomically)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return []
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return []
        self._stamp = stamp
        rows = read_metrics(self.path)
        done = sorted({row.round for row in rows if row.round > self._last_round})
        if not done:
            return []
        elapsed = time.monotonic() - self.started
        progress = []
        for number in done:
            ran = number - self._first_round
            left = elapsed / ran * (self.rounds - number) if ran > 0 else None
            progress.append(RoundProgress(number, self.rounds, *_summary(rows, number),
                                          elapsed, left))  # fmt: skip
        self._last_round = done[-1]
        return progress


def _summary(rows: list[MetricRow], number: int) -> tuple[float | None, float | None]:
    this_round = [row for row in rows if row.round == number]
    accuracies = [row.accuracy for row in this_round if row.primary and row.accuracy is not None]
    accuracy = sum(accuracies) / len(accuracies) if accuracies else None
    epsilons = [row.epsilon for row in this_round]
    if any(eps is None for eps in epsilons) or not epsilons:
        return accuracy, None
    worst = max(eps for eps in epsilons if eps is not None)
    return accuracy, worst if math.isfinite(worst) else None
