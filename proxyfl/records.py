"""What a run records of itself, besides its checkpoints: a row per evaluated model and
round (``metrics.jsonl``, :class:`~proxyfl.results.MetricRow`), each rank's record
(``ranks/rank_R.json``), and ``run.json``, with each client's privacy guarantee stated in
its notion (:data:`~proxyfl.results.PRIVACY_NOTIONS`)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from proxyfl.config import TrainConfig
from proxyfl.engine.access import ACCESS_LOG
from proxyfl.privacy.ldp import LDPLedger
from proxyfl.privacy.ledger import PrivacyLedger
from proxyfl.results import (
    PRIVACY_NOTIONS,
    RUN_FILE,
    MetricRow,
    atomic_write_json,
    training_library_versions,
)
from proxyfl.trainer import ClientTrainer, RoundLosses

if TYPE_CHECKING:
    from proxyfl.engine.evaluate import Scores


def privacy_record(ledger: PrivacyLedger) -> dict[str, Any]:
    """A client's guarantee, with the notion it is stated in (run.json's ``privacy``)."""
    epsilon = ledger.epsilon()
    record: dict[str, Any] = {
        "notion": ledger.notion,
        "notion_text": PRIVACY_NOTIONS[ledger.notion],
        "epsilon": epsilon if math.isfinite(epsilon) else None,
        "delta": ledger.delta,
        "epsilon_per_round": ledger.epsilon_per_round,
    }
    if isinstance(ledger, LDPLedger):
        record["rounds_released"] = ledger.releases
        record["composition"] = "basic sequential composition: rounds_released · ε"
        record["assumption_not_computed"] = (
            "the paper's model-shuffling argument (ε over all rounds) assumes an "
            "anonymising shuffler; it is not implemented or accounted here"
        )
    return record


def metric_rows(
    trainer: ClientTrainer,
    round_number: int,
    scores: dict[str, Scores],
    losses: RoundLosses,
    comm_s: float,
) -> list[MetricRow]:
    """One row per evaluated model of ``trainer``'s client after ``round_number``
    (``metrics.jsonl``)."""
    epsilon = trainer.epsilon()
    return [
        MetricRow(
            algorithm=trainer.strategy.name,
            seed=trainer.config.seed,
            client=trainer.data.client,
            round=round_number,
            accuracy=scores[label].accuracy,
            macro_accuracy=scores[label].macro_accuracy,
            epsilon=epsilon if math.isfinite(epsilon) else None,
            delta=trainer.ledger.delta,
            train_loss=losses.private if label == "private" else losses.shared,
            comm_seconds=comm_s,
            evaluated_model=label,
            center=trainer.data.center,
            primary=label == trainer.strategy.primary_label,
            active=trainer.active,
            n_train=len(trainer.data.train),
            privacy_notion=trainer.ledger.notion,
            epsilon_per_round=trainer.ledger.epsilon_per_round,
        )
        for label in trainer.strategy.evaluated_labels
    ]


def rank_record(trainer: ClientTrainer) -> dict[str, Any]:
    """What a rank did: its data, models, files opened, messages sent, time and privacy
    (``ranks/rank_R.json``, and run.json's ``clients`` when the run has finished)."""
    return {
        "rank": trainer.runtime.rank,
        "client": trainer.data.client,
        "center": trainer.data.center,
        "device": str(trainer.runtime.device),
        "hostname": trainer.runtime.hostname,
        "n_train": len(trainer.data.train),
        "proxy_parameters": trainer.proxy_parameters,
        "private_parameters": trainer.private_parameters,
        "opened": list(ACCESS_LOG.opened),
        "sent": list(trainer.communicator.log.entries),
        "timings": trainer.timings.as_dict(),
        "epsilon": trainer.epsilon(),
        "privacy": privacy_record(trainer.ledger),
        "active": trainer.active,
    }


def client_summary(trainer: ClientTrainer) -> dict[str, Any]:
    """A rank's set-up (run.json's ``clients`` while the run is running)."""
    from proxyfl.engine.runtime import environment_summary

    return {
        "rank": trainer.runtime.rank,
        "client": trainer.data.client,
        "center": trainer.data.center,
        "device": str(trainer.runtime.device),
        "local_rank": trainer.runtime.local_rank,
        "hostname": trainer.runtime.hostname,
        "n_train": len(trainer.data.train),
        "private_model": (
            trainer.config.private_model_for(trainer.data.client)
            if trainer.strategy.mutual_learning
            else None
        ),
        "proxy_model": trainer.config.proxy_model,
        "proxy_parameters": trainer.proxy_parameters,
        "private_parameters": trainer.private_parameters,
        "sample_rate": trainer.training.sample_rate,
        "steps_per_round": trainer.steps_per_round,
        "privacy_notion": trainer.ledger.notion,
        **environment_summary(),
    }


def write_run_json(
    config: TrainConfig,
    size: int,
    records: list[dict[str, Any]],
    status: str,
    wall: list[float] | None = None,
) -> None:
    """``RUN_DIR/run.json``: the configuration, its identity, every client's record and
    the versions; once finished, the timings and each client's ε in its notion."""
    _, run_dir = config.require_paths()
    payload: dict[str, Any] = {
        "status": status,
        "algorithm": config.algorithm,
        "config": config.model_dump(mode="json"),
        "fingerprint": config.fingerprint(),
        "config_digest": config.digest(),
        "world_size": size,
        "clients": records,
        "devices": [record["device"] for record in records],
        "versions": training_library_versions(),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if status == "finished":
        timings = [record["timings"] for record in records]
        payload["timings"] = {
            "per_rank": timings,
            "wall_seconds": max(wall) if wall else None,
            # this launch's seconds per rank (a resumed run's phases also hold the rounds
            # run before: then they may sum to more)
            "wall_seconds_per_rank": list(wall) if wall else None,
            "total_comm_seconds": sum(t["comm_seconds"] for t in timings),
            "max_comm_seconds": max(t["comm_seconds"] for t in timings),
            "total_train_seconds": sum(t["train_seconds"] for t in timings),
            "total_eval_seconds": sum(t["eval_seconds"] for t in timings),
        }
        payload["epsilon"] = {str(r["client"]): r["epsilon"] for r in records}
        # the same ε with the notion it is stated in (sample_dp | label_ldp), δ, the
        # per-round ε (PrivateKT) and how rounds compose
        payload["privacy"] = {str(r["client"]): r["privacy"] for r in records}
    atomic_write_json(run_dir / RUN_FILE, payload)
