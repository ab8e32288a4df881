"""The training loop of one rank: rounds of local training, exchange, evaluation, records
and a checkpoint, from the newest round every rank has completed
(:func:`latest_common_round`). The client's set-up is :class:`~proxyfl.trainer.ClientTrainer`;
what each round records, :mod:`proxyfl.records`."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from proxyfl.comm.control import allgather_json, gather_json
from proxyfl.engine import checkpoint as ckpt
from proxyfl.records import (
    metric_rows,
    rank_machine_record,
    rank_record,
    write_client_predictions,
)
from proxyfl.results import METRICS_FILE, MetricRow, atomic_write_json, read_metrics, write_metrics
from proxyfl.trainer import ClientTrainer, RoundLosses

logger = logging.getLogger(__name__)


class StopAfterRound(SystemExit):
    """Raised on every rank by the ``--stop-after-round`` test hook."""


def latest_common_round(comm: Any, run_dir: Path, rank: int) -> int:
    """The newest round every rank has an intact checkpoint for (0: none). A checkpoint
    that does not verify (cut short, damaged on disk) is skipped, each rank saying which
    and why; rank 0 says what each rank has when they differ, so a fresh start is never a
    surprise."""
    mine, skipped = ckpt.verified_rounds(run_dir, rank)
    for round_number, reason in skipped:
        logger.warning("checkpoint of round %d skipped: %s", round_number, reason)
    everyone = allgather_json(comm, mine)
    common = max(set.intersection(*(set(rounds) for rounds in everyone)), default=0)
    if rank == 0 and any(rounds != everyone[0] for rounds in everyone):
        held = "; ".join(
            f"rank {r}: " + (f"rounds {', '.join(map(str, rounds))}" if rounds
                             else "no intact checkpoint")
            for r, rounds in enumerate(everyone)
        )  # fmt: skip
        outcome = f"resuming after round {common}" if common else "starting from round 1"
        logger.info("checkpoints differ between ranks (%s): %s, the latest all hold intact",
                    held, outcome)  # fmt: skip
    return common


def run_training(trainer: ClientTrainer, start_round: int) -> None:
    """Rounds ``start_round + 1 .. T``; rank 0 writes metrics after each. A round's
    checkpoint is written while the next trains (:class:`~proxyfl.engine.checkpoint.
    CheckpointWriter`), and is on disk before that round's barrier and when this returns."""
    keep = trainer.config.keep_checkpoints
    with ckpt.CheckpointWriter(trainer.run_dir, trainer.runtime.rank, keep) as writer:
        _run_rounds(trainer, start_round, writer)


def _run_rounds(trainer: ClientTrainer, start_round: int, writer: ckpt.CheckpointWriter) -> None:
    cfg, runtime = trainer.config, trainer.runtime
    comm = runtime.comm
    metrics_path = trainer.run_dir / METRICS_FILE
    rows: list[MetricRow] = []
    if runtime.is_root:
        rows = [r for r in read_metrics(metrics_path) if r.round <= start_round]
    for round_number in range(start_round + 1, cfg.rounds + 1):
        started = time.perf_counter()
        if trainer.active and not trainer.within_budget_after_next_round():
            logger.warning(
                "client %d stops before round %d: ε would exceed the budget %.3g",
                trainer.data.client, round_number, cfg.epsilon_budget,
            )  # fmt: skip
            trainer.active = False
        flags = allgather_json(comm, trainer.active)
        members = [rank for rank, active in enumerate(flags) if active]
        trainer.timings.records_seconds += time.perf_counter() - started
        distribution = trainer.distribute_round(members, round_number)

        started = time.perf_counter()
        trains = trainer.active and distribution.trains
        losses = trainer.train_round() if trains else RoundLosses()
        trainer.timings.train_seconds += time.perf_counter() - started

        started = time.perf_counter()
        writer.wait()  # the last round's checkpoint on disk before the barrier (module doc)
        trainer.timings.checkpoint_seconds += time.perf_counter() - started

        comm_seconds = distribution.seconds + trainer.exchange_round(members, round_number)
        trainer.timings.comm_seconds += comm_seconds

        started = time.perf_counter()
        if round_number == cfg.rounds:  # the final models, patch by patch, for the report
            trainer.last_scores, probabilities = trainer.evaluate_with_probabilities()
            write_client_predictions(trainer, probabilities)
        elif cfg.evaluate_every_round and (trainer.active or trainer.last_scores is None):
            # a stopped client's are frozen
            trainer.last_scores = trainer.evaluate(cfg.round_evaluation == "primary")
        trainer.timings.eval_seconds += time.perf_counter() - started

        started = time.perf_counter()
        scores = trainer.last_scores
        round_rows = metric_rows(trainer, round_number, scores, losses) if scores else []
        gathered = gather_json(comm, [row.model_dump() for row in round_rows], root=0)
        if runtime.is_root:
            assert gathered is not None
            rows.extend(MetricRow.model_validate(row) for part in gathered for row in part)
            write_metrics(metrics_path, rows)
        logger.info(  # a record too: ε is the accountant's to compute, not free
            "round %d/%d client %d: %s ε=%.3f loss=%s comm=%.3fs",
            round_number, cfg.rounds, trainer.data.client,
            " ".join(f"{k}={v.accuracy:.3f}" for k, v in (scores or {}).items()) or "(no eval)",
            trainer.epsilon(), _format_loss(losses.shared), comm_seconds,
        )  # fmt: skip
        trainer.timings.records_seconds += time.perf_counter() - started

        started = time.perf_counter()
        writer.submit(round_number, trainer.state_dict(round_number))
        trainer.timings.checkpoint_seconds += time.perf_counter() - started
        started = time.perf_counter()
        ranks = trainer.run_dir / "ranks"
        atomic_write_json(ranks / f"rank_{runtime.rank}.json", rank_record(trainer))
        atomic_write_json(ranks / f"rank_{runtime.rank}.machine.json",
                          rank_machine_record(trainer))  # fmt: skip
        trainer.timings.records_seconds += time.perf_counter() - started
        if cfg.stop_after_round is not None and round_number == cfg.stop_after_round:
            writer.wait()
            comm.Barrier()
            raise StopAfterRound(3)


def _format_loss(loss: float | None) -> str:
    """A round's mean training loss for the log ("-" when the client did not train)."""
    return "-" if loss is None else f"{loss:.4f}"
