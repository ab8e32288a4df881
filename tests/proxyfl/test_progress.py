"""proxyfl.launch.progress: a job's lines at their level, and its rounds as they complete."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from proxyfl.launch.progress import RankLineParser, RoundFollower
from proxyfl.results import MetricRow, write_metrics
from tests.proxyfl.test_results import values


def _rows(rounds: range, accuracy: float = 0.5, epsilon: float | None = 1.0) -> list[MetricRow]:
    return [MetricRow.model_validate(values(round=r, client=c, accuracy=accuracy + c / 10,
                                            epsilon=None if epsilon is None else epsilon * r,
                                            primary=primary,
                                            evaluated_model="private" if primary else "proxy"))
            for r in rounds for c in (0, 1) for primary in (True, False)]  # fmt: skip


def test_rank_lines_keep_their_level_and_lose_their_timestamp() -> None:
    parser = RankLineParser()
    error = parser.parse("2026-11-23 10:00:00,001 [rank 2] ERROR proxyfl.run: no store")
    assert (error.rank, error.level) == (2, logging.ERROR)
    assert error.text == "[rank 2] ERROR proxyfl.run: no store"
    # a traceback line continues the line before, at its level
    assert parser.parse("Traceback (most recent call last):").level == logging.ERROR
    info = parser.parse("2026-11-23 10:00:01,002 [rank 0] INFO proxyfl.trainer: round 1/2")
    assert (info.rank, info.level) == (0, logging.INFO) and "2026" not in info.text
    assert parser.parse("mpiexec: something").rank is None


def test_rounds_are_reported_once_each_with_their_numbers(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    follower = RoundFollower(path, rounds=4)
    assert follower.poll() == []  # no file yet
    write_metrics(path, _rows(range(1, 2)))
    (first,) = follower.poll()
    assert (first.round, first.rounds, first.percent) == (1, 4, 25.0)
    assert first.accuracy == pytest.approx(0.55)  # primary models of clients 0 and 1
    assert first.epsilon == pytest.approx(1.0)
    # one round run since launch, three left: three times the time taken so far
    assert first.left_seconds == pytest.approx(3 * first.elapsed_seconds)
    assert follower.poll() == []  # unchanged
    time.sleep(0.01)
    write_metrics(path, _rows(range(1, 4), epsilon=None))
    later = follower.poll()
    assert [p.round for p in later] == [2, 3]
    assert later[-1].epsilon is None and "ε ∞" in later[-1].line()  # σ = 0: no guarantee


def test_a_resumed_run_counts_only_its_own_rounds_for_the_time_left(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    write_metrics(path, _rows(range(1, 3)))  # rounds 1-2 from the try before
    follower = RoundFollower(path, rounds=4)
    assert follower.poll() == []
    time.sleep(0.01)
    write_metrics(path, _rows(range(1, 4)))
    (third,) = follower.poll()
    assert third.round == 3
    # one round run in this launch, one left: about the time this launch has taken
    assert third.left_seconds == pytest.approx(third.elapsed_seconds)
    assert "round 3/4: accuracy 0.550, ε 3.00" in third.line()
