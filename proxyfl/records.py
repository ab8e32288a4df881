"""What a run records of itself, besides its checkpoints, in two kinds of file.

Its results, the same bytes for the same configuration, stores and code on any machine
(DVC's md5 of the run directory, dvc.lock): a row per evaluated model and round
(``metrics.jsonl``, :class:`~proxyfl.results.MetricRow`), each rank's record
(``ranks/rank_R.json``) and ``run.json``, with each client's privacy guarantee stated in
its notion (:data:`~proxyfl.results.PRIVACY_NOTIONS`).

Where and how it ran, which differs with every machine and launch: ``machine.json`` (when,
the platform, each rank's host, process, files opened and seconds per phase) and
``ranks/rank_R.machine.json``, beside ``job.log``. ``.dvcignore`` leaves these out of the
run directory's hash.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from plumbing.kernels import in_effect as kernels_in_effect
from plumbing.verified import record_digest
from proxyfl.config import TrainConfig
from proxyfl.engine.access import ACCESS_LOG
from proxyfl.engine.runtime import kernel_set
from proxyfl.privacy.ldp import LDPLedger
from proxyfl.privacy.ledger import PrivacyLedger
from proxyfl.results import (
    MACHINE_FILE,
    PRIVACY_NOTIONS,
    RUN_FILE,
    MetricRow,
    Predictions,
    atomic_write_json,
    machine_versions,
    predictions_path,
    training_library_versions,
    write_predictions,
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
) -> list[MetricRow]:
    """One row per model of ``trainer``'s client evaluated after ``round_number``
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
            evaluated_model=label,
            center=trainer.data.center,
            primary=label == trainer.strategy.primary_label,
            active=trainer.active,
            n_train=len(trainer.data.train),
            privacy_notion=trainer.ledger.notion,
            epsilon_per_round=trainer.ledger.epsilon_per_round,
        )
        for label in trainer.strategy.evaluated_labels
        if label in scores  # all after the final round; the primary one alone may be before
    ]


TUMOR = 1  # the positive class of the stores' labels (wsi.store.schema: 0 healthy, 1 tumour)


def client_predictions(
    trainer: ClientTrainer, probabilities: Mapping[str, np.ndarray]
) -> Predictions:
    """Each evaluated model's probability of tumour on every test patch, with the patch's
    centre, row in that centre's test split, patient and label (``probabilities``: model
    label -> (N, classes) in the order of the client's test splits)."""
    splits = trainer.data.test_splits
    center = np.concatenate([np.full(len(s), s.info.attrs.center, np.int64) for s in splits])
    row = np.concatenate([np.arange(len(s), dtype=np.int64) for s in splits])
    patient = np.concatenate([np.asarray(s.info.splits[s.split].patients, dtype=str)
                              for s in splits])  # fmt: skip
    label = np.concatenate([np.asarray(s.labels, dtype=np.int64) for s in splits])
    models = sorted(probabilities)
    return Predictions(
        evaluated_model=np.repeat(np.array(models, dtype=str), len(label)),
        center=np.tile(center, len(models)),
        row=np.tile(row, len(models)),
        patient=np.tile(patient, len(models)),
        label=np.tile(label, len(models)),
        p_tumor=np.concatenate([probabilities[name][:, TUMOR] for name in models]),
    )


def write_client_predictions(
    trainer: ClientTrainer, probabilities: Mapping[str, np.ndarray]
) -> None:
    """``predictions/client_{c}.csv`` (:func:`client_predictions`), and its digest."""
    path = predictions_path(trainer.run_dir, trainer.data.client)
    write_predictions(path, client_predictions(trainer, probabilities))
    record_digest(path)


def write_trained_models(trainer: ClientTrainer) -> list[Path]:
    """Each of the client's models as it is after the final round, with its card
    (:mod:`proxyfl.engine.trained`): ``models/client_{c}/{evaluated_model}.safetensors``."""
    from proxyfl.engine.trained import CLASSES, NORMALISATION, ModelCard, save_trained
    from proxyfl.kept import trained_path

    config, data = trainer.config, trainer.data
    written = []
    for label, model in trainer.evaluated_models().items():
        architecture = (config.private_model_for(data.client) if label == "private"
                        else config.proxy_model)  # fmt: skip
        card = ModelCard(
            architecture=architecture, n_classes=data.n_classes, input_size=trainer.input_size,
            patch_size=data.patch_size, normalisation=NORMALISATION,
            classes=CLASSES[: data.n_classes], evaluated_model=label,
            algorithm=trainer.strategy.name, seed=config.seed, client=data.client,
            center=data.center, rounds=config.rounds, config_digest=config.digest(),
        )  # fmt: skip
        path = trained_path(trainer.run_dir, data.client, label)
        save_trained(model, path, card)
        written.append(path)
    return written


def rank_record(trainer: ClientTrainer) -> dict[str, Any]:
    """What a rank did: its data, models, messages sent and privacy (``ranks/rank_R.json``,
    and run.json's ``clients`` when the run has finished)."""
    return {
        "rank": trainer.runtime.rank,
        "client": trainer.data.client,
        "center": trainer.data.center,
        "device": str(trainer.runtime.device),
        "kernels": kernel_set(trainer.runtime.device),  # what the bits are promised for
        "n_train": len(trainer.data.train),
        "proxy_parameters": trainer.proxy_parameters,
        "private_parameters": trainer.private_parameters,
        "sent": list(trainer.communicator.log.entries),
        "epsilon": trainer.epsilon(),
        "privacy": privacy_record(trainer.ledger),
        "active": trainer.active,
    }


def rank_machine_record(trainer: ClientTrainer) -> dict[str, Any]:
    """Where and how a rank ran: its host and process, the files it opened (by path, as
    this machine names them) and its seconds per phase (``ranks/rank_R.machine.json``,
    and machine.json's ``ranks``)."""
    from proxyfl.engine.memory import memory_peaks
    from proxyfl.engine.runtime import environment_summary

    return {
        "rank": trainer.runtime.rank,
        "hostname": trainer.runtime.hostname,
        "local_rank": trainer.runtime.local_rank,
        "host_rank": trainer.runtime.host_rank,
        **environment_summary(),
        "opened": list(ACCESS_LOG.opened),
        "timings": trainer.timings.as_dict(),
        "memory": memory_peaks(trainer.runtime.device),
        "memory_budget_gb": round(trainer.budget_bytes / 1e9, 3),
        "eval_batch_size": trainer.eval_batch_size,
        "dp_chunk_size": getattr(trainer.training, "chunk_size", None),
        "compiled": trainer.compiled,
        "compile_cache_served": trainer.graphs_cached if trainer.compiled else None,
        "recompiles": trainer.recompiles,
        "prefetch": trainer.config.prefetch,
        "deterministic": trainer.config.deterministic,
        # a hosted client's state moved off the device while its rank's others computed
        "off_device": trainer.residency.record() if trainer.residency is not None else None,
    }


def client_summary(trainer: ClientTrainer) -> dict[str, Any]:
    """A rank's set-up (run.json's ``clients`` while the run is running)."""
    return {
        "rank": trainer.runtime.rank,
        "client": trainer.data.client,
        "center": trainer.data.center,
        "device": str(trainer.runtime.device),
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
    }


def write_run_json(
    config: TrainConfig, size: int, records: list[dict[str, Any]], status: str
) -> None:
    """``RUN_DIR/run.json``: the configuration, its identity, every client's record and
    the versions; once finished, each client's ε in its notion. Nothing of the machine or
    the clock (:func:`write_machine_json`): the same run gives the same bytes anywhere."""
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
        # the CPU kernels' pin the ranks ran with ({}: native), which decides the late
        # digits on x86-64 as the versions do (plumbing.kernels)
        "cpu_kernels": kernels_in_effect(),
    }
    if status == "finished":
        payload["epsilon"] = {str(r["client"]): r["epsilon"] for r in records}
        # the same ε with the notion it is stated in (sample_dp | label_ldp), δ, the
        # per-round ε (PrivateKT) and how rounds compose
        payload["privacy"] = {str(r["client"]): r["privacy"] for r in records}
    atomic_write_json(run_dir / RUN_FILE, payload)


def write_machine_json(
    config: TrainConfig,
    records: list[dict[str, Any]],
    wall: list[float] | None = None,
    startup: list[float | None] | None = None,
) -> None:
    """``RUNDIR/machine.json``: when and where the run ran, each rank's
    :func:`rank_machine_record` and, with ``wall`` (each rank's seconds on its own clock,
    once finished) and ``startup`` (each rank's seconds before that clock started,
    :func:`~proxyfl.engine.timings.process_age`; None where unknown), where the time went.

    ``process_seconds_per_rank`` = startup + wall: each rank's life from its process's
    creation to its last record, which its ``per_rank`` phases account for
    (:mod:`proxyfl.engine.timings`). The launcher adds what it saw once the job has exited
    (``launcher``, :func:`proxyfl.launch.accounting.record_launcher_wall`)."""
    _, run_dir = config.require_paths()
    payload: dict[str, Any] = {
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": machine_versions(),
        "ranks": records,
    }
    if wall is not None:
        timings = [record["timings"] for record in records]
        payload["timings"] = {
            "per_rank": timings,
            "wall_seconds": max(wall),
            # this launch's seconds per rank (a resumed run's phases also hold the rounds
            # run before: then they may sum to more)
            "wall_seconds_per_rank": list(wall),
            "startup_seconds_per_rank": list(startup) if startup is not None else None,
            "process_seconds_per_rank": (
                [None if s is None else s + w for s, w in zip(startup, wall, strict=True)]
                if startup is not None
                else None
            ),
            "total_comm_seconds": sum(t["comm_seconds"] for t in timings),
            "max_comm_seconds": max(t["comm_seconds"] for t in timings),
            "total_train_seconds": sum(t["train_seconds"] for t in timings),
            "total_eval_seconds": sum(t["eval_seconds"] for t in timings),
        }
    atomic_write_json(run_dir / MACHINE_FILE, payload)
