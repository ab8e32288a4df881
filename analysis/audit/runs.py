"""The audit of run directories: one row per run, client and kept model.

- :func:`audit_training_run`: membership inference on a finished run's kept models
  (``models/client_c/*.safetensors``), members and non-members from
  :mod:`.population`; the loss attack always, LiRA offline when reference models are
  asked for (then the reported attack).
- :func:`audit_canary_run`: a canary run (``CANARY_DIR/canaries.json`` and
  ``CANARY_DIR/run/``): each model's scores on its client's canaries, IN against OUT, and
  the one-run ε lower bound (:mod:`.one_run`) beside the accountant's ε of that run.

Which models leave a hospital follows docs/algorithms.md §4's threat model: every kept model
but the private one is sent or released.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, MutableMapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis.audit.membership import MembershipResult, auc, membership_result
from analysis.audit.one_run import audit_canaries
from analysis.audit.options import AuditOptions
from analysis.audit.population import (
    AuditInputError,
    Population,
    client_population,
    member_mask,
    read_rows,
)
from analysis.audit.scores import lira_offline, log_likelihood, logit_confidence
from plumbing.errors import PipelineError
from proxyfl.canaries import CANARY_FILE, CANARY_RUN_DIR, CanaryPlan, CanaryPlanError
from proxyfl.config import TrainConfig
from proxyfl.kept import MODELS_DIR, verify_kept
from proxyfl.results import RUN_FILE
from wsi.store.schema import store_path

if TYPE_CHECKING:
    from analysis.audit.references import ReferenceRecipe, References
    from proxyfl.engine.trained import ModelCard

# torch's modules (the reference models, the kept models, the seeds' runtime) are imported
# by the functions that audit, not with this module: an audit found up to date, its --help
# and its refusals, and the pipeline's command, start in ~3 s, not ~7 (torch on 2 cores)

logger = logging.getLogger(__name__)

NOT_RELEASED = frozenset({"private"})  # the models that never leave their hospital


class AuditViolation(PipelineError):
    """An ε lower bound above the accountant's ε: the implementation does not keep its
    privacy promise (or the accounting is wrong). Never expected; always a bug."""


@dataclass
class AuditCache:
    """Populations and reference models shared by the runs of one audit, and the worker
    processes that train the reference models (:mod:`.workers`; none: in this process)."""

    populations: MutableMapping[tuple[Any, ...], Population] = field(default_factory=dict)
    references: MutableMapping[tuple[Any, ...], References] = field(default_factory=dict)
    pool: Executor | None = None


def read_finished_run(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_FILE
    if not path.is_file():
        raise AuditInputError(path, f"missing: {run_dir} holds no run to audit")
    verify_kept(path, run_dir)
    run = json.loads(path.read_text())
    if run.get("status") != "finished":
        raise AuditInputError(path, f"the run is {run.get('status')}, not finished")
    return run


def kept_models(run_dir: Path, client: int) -> list[Path]:
    """The safetensors files client ``client`` kept, sorted by name."""
    directory = run_dir / MODELS_DIR / f"client_{client}"
    found = sorted(directory.glob("*.safetensors"))
    if not found:
        raise AuditInputError(
            directory,
            "no kept model (*.safetensors): the run was trained before runs "
            "kept their models, or they were deleted; train it again to audit it",
        )
    return found


def _config(run: dict[str, Any], data_dir: Path, run_dir: Path) -> TrainConfig:
    return TrainConfig(**{**run["config"], "data": data_dir, "run_dir": run_dir})


def _client_centers(run: dict[str, Any], record: dict[str, Any]) -> tuple[int, ...]:
    if run["algorithm"] == "Joint":  # one client on every centre's training data
        return tuple(int(c) for c in run["config"]["centers"])
    return (int(record["center"]),)


def _privacy(run: dict[str, Any], client: int, card: ModelCard) -> tuple[str, float | None, float]:
    """The notion, ε and δ that cover ``card``'s model: none for a private model."""
    if card.evaluated_model in NOT_RELEASED:
        return "none", None, 0.0
    record = run["privacy"][str(client)]
    return record["notion"], record["epsilon"], float(record.get("delta") or 0.0)


def _recipe(config: TrainConfig, card: ModelCard) -> ReferenceRecipe:
    from analysis.audit.references import ReferenceRecipe

    return ReferenceRecipe(
        architecture=card.architecture, n_classes=card.n_classes, input_size=card.input_size,
        epochs=config.rounds * config.local_epochs, batch_size=config.batch_size,
        lr=config.private_learning_rate, weight_decay=config.weight_decay,
    )  # fmt: skip


def _membership_fields(result: MembershipResult) -> dict[str, Any]:
    return {
        "mia_auc": result.auc,
        "mia_auc_ci": [result.auc_interval.low, result.auc_interval.high],
        "tpr_at_1pct_fpr": result.tpr_at_1pct_fpr,
        "tpr_at_1pct_fpr_ci": [result.tpr_at_1pct_fpr_interval.low,
                               result.tpr_at_1pct_fpr_interval.high],
        "tpr_at_0_1pct_fpr": result.tpr_at_0_1pct_fpr,
        "tpr_at_0_1pct_fpr_ci": [result.tpr_at_0_1pct_fpr_interval.low,
                                 result.tpr_at_0_1pct_fpr_interval.high],
        "n_members": result.n_members,
        "n_non_members": result.n_non_members,
        "roc_fpr": list(result.roc_fpr),
        "roc_tpr": list(result.roc_tpr),
    }  # fmt: skip


def _undefined_membership(n_members: int, n_non_members: int) -> dict[str, Any]:
    """The membership fields when one side is empty: null, and no curve."""
    return {
        "loss_attack_auc": None, "mia_auc": None, "mia_auc_ci": None,
        "tpr_at_1pct_fpr": None, "tpr_at_1pct_fpr_ci": None,
        "tpr_at_0_1pct_fpr": None, "tpr_at_0_1pct_fpr_ci": None,
        "n_members": n_members, "n_non_members": n_non_members, "roc_fpr": [], "roc_tpr": [],
    }  # fmt: skip


def _row(
    run: dict[str, Any], kind: str, client: int, center: int, card: ModelCard
) -> dict[str, Any]:
    notion, epsilon, delta = _privacy(run, client, card)
    return {
        "method": run["algorithm"],
        "seed": int(run["config"]["seed"]),
        "client": client,
        "center": center,
        "model": "private" if card.evaluated_model in NOT_RELEASED else "shared",
        "evaluated_model": card.evaluated_model,
        "architecture": card.architecture,
        "released": card.evaluated_model not in NOT_RELEASED,
        "run": kind,
        "privacy_notion": notion,
        "epsilon_accounted": epsilon,
        "delta": delta,
    }


def _models(run_dir: Path, client: int) -> Iterator[tuple[Any, ModelCard]]:
    from proxyfl.engine.trained import load_trained

    for path in kept_models(run_dir, client):
        try:  # a DamagedFileError (named, with its repair: exit 2) passes through
            yield load_trained(path)
        except (OSError, ValueError, RuntimeError) as error:
            raise AuditInputError(path, f"cannot be loaded ({error})") from None


def audit_training_run(
    run_dir: Path, data_dir: Path, options: AuditOptions, cache: AuditCache | None = None
) -> list[dict[str, Any]]:
    """Membership-inference rows of every client and kept model of the run at ``run_dir``."""
    from analysis.audit.references import model_logits, train_references
    from proxyfl.engine.runtime import derived_seed

    cache = cache if cache is not None else AuditCache()
    run = read_finished_run(run_dir)
    config = _config(run, data_dir, run_dir)
    rows = []
    for record in run["clients"]:
        client, centers = int(record["client"]), _client_centers(run, record)
        if centers not in cache.populations:
            cache.populations[centers] = client_population(data_dir, centers)
        population = cache.populations[centers]
        membership = member_mask(config, population)
        members, non_members = membership.members, membership.non_members
        for model, card in _models(run_dir, client):
            logits = model_logits(model, population.images, card.input_size)
            loss_scores = log_likelihood(logits, population.labels)
            loss_auc = auc(loss_scores[members], loss_scores[non_members])
            seed = derived_seed(options.seed, "bootstrap", client)
            attack, scores = "loss", loss_scores
            if options.reference_models:
                recipe = _recipe(config, card)
                reference_key = (population.key, recipe)
                if reference_key not in cache.references:
                    cache.references[reference_key] = train_references(
                        recipe, population.images, population.labels,
                        options.reference_models, derived_seed(options.seed, population.key),
                        pool=cache.pool, where=f"centre(s) {list(population.centers)}",
                    )  # fmt: skip
                references = cache.references[reference_key]
                confidence = np.stack([logit_confidence(z, population.labels)
                                       for z in references.logits])  # fmt: skip
                scores = lira_offline(logit_confidence(logits, population.labels), confidence,
                                      references.out_mask)  # fmt: skip
                attack = "lira_offline"
            result = membership_result(scores[members], scores[non_members],
                                       bootstrap=options.bootstrap, seed=seed)  # fmt: skip
            row = _row(run, "training", client, int(record["center"]), card)
            row.update(attack=attack, reference_models=options.reference_models,
                       epsilon_lower_bound=None, loss_attack_auc=loss_auc,
                       **_membership_fields(result))  # fmt: skip
            rows.append(row)
    return rows


def canary_patches(
    plan: CanaryPlan, data_dir: Path, centers: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The canaries of ``centers``: images, the labels they carry, their coins."""
    images, labels, included = [], [], []
    for center in centers:
        if center not in plan.centers:
            raise AuditInputError(f"centre {center}", "the canary plan has no canaries for it")
        canaries = plan.centers[center]
        if plan.kind == "noise":
            images.append(plan.noise_images(center))
        else:
            path = store_path(data_dir, center)
            images.append(read_rows(path, "train", np.asarray(canaries.rows))[0])
        labels.append(np.asarray(canaries.labels, dtype=np.int64))
        included.append(np.asarray(canaries.included, dtype=bool))
    return np.concatenate(images), np.concatenate(labels), np.concatenate(included)


def audit_canary_run(
    canary_dir: Path, data_dir: Path, options: AuditOptions
) -> list[dict[str, Any]]:
    """The ε lower bound of every client and kept model of the canary run in
    ``canary_dir``, beside that run's accounted ε."""
    from analysis.audit.references import model_logits
    from proxyfl.engine.runtime import derived_seed

    plan_path = canary_dir / CANARY_FILE
    if not plan_path.is_file():
        raise AuditInputError(plan_path, f"missing: {canary_dir} is not a canary run")
    try:
        plan = CanaryPlan.read(plan_path)
    except CanaryPlanError as error:
        raise AuditInputError(error.subject, error.reason) from None
    run_dir = canary_dir / CANARY_RUN_DIR
    run = read_finished_run(run_dir)
    rows = []
    for record in run["clients"]:
        client, centers = int(record["client"]), _client_centers(run, record)
        images, labels, included = canary_patches(plan, data_dir, centers)
        for model, card in _models(run_dir, client):
            scores = log_likelihood(model_logits(model, images, card.input_size), labels)
            bound = audit_canaries(scores, included, options.canary.guesses,
                                   delta=float(run["config"]["delta"]),
                                   confidence=options.canary.confidence)  # fmt: skip
            row = _row(run, "canary", client, int(record["center"]), card)
            row.update(attack="loss", reference_models=0,
                       epsilon_lower_bound=bound.epsilon_lower_bound,
                       canaries=bound.canaries, canary_guesses=bound.guesses,
                       canary_correct=bound.correct)  # fmt: skip
            if included.any() and not included.all():
                seed = derived_seed(options.seed, "canary", client)
                result = membership_result(scores[included], scores[~included],
                                           bootstrap=options.bootstrap, seed=seed)  # fmt: skip
                row.update(loss_attack_auc=result.auc, **_membership_fields(result))
            else:  # every coin on one side (few canaries): the bound stands, no AUC exists
                side = "IN" if included.all() else "OUT"
                logger.warning("%s client %d: all %d canaries %s: no canary AUC", canary_dir,
                               client, len(included), side)  # fmt: skip
                row.update(_undefined_membership(int(included.sum()), int((~included).sum())))
            rows.append(row)
    return rows


def violations(rows: list[dict[str, Any]]) -> list[str]:
    """Every row whose ε lower bound exceeds the ε accounted for its model."""
    found = []
    for row in rows:
        bound, accounted = row.get("epsilon_lower_bound"), row.get("epsilon_accounted")
        if (row["privacy_notion"] == "sample_dp" and bound is not None and accounted is not None
                and math.isfinite(accounted) and bound > accounted):  # fmt: skip
            found.append(f"{row['method']} seed {row['seed']} client {row['client']} "
                         f"{row['evaluated_model']}: ε lower bound {bound:.3f} > accounted "
                         f"ε {accounted:.3f}")  # fmt: skip
    return found


AUDIT_NOTES = {
    "training": "membership inference on the run's kept models: members = the client's "
    "training patches, non-members = its centre's held-out test patches",
    "canary": "the canary run: scores of the client's canaries (IN against OUT) and the "
    "one-run ε lower bound at the stated confidence (Steinke et al. 2023)",
    "epsilon_lower_bound": "sample-level: a (ε, δ)-DP training gives a bound above ε with "
    "probability below 1 - confidence; null where the run has no canaries",
    "privacy_notion": "none: a private model, trained without DP, that never leaves its hospital",
}


def audit_document(rows: list[dict[str, Any]], options: AuditOptions) -> dict[str, Any]:
    """``results/audit.json``: the rows, the settings and what each kind of row means."""
    return {
        "settings": options.model_dump(mode="json"),
        "notes": AUDIT_NOTES,
        "rows": rows,
        "violations": violations(rows),
    }


def summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per method and model: mean membership AUC over clients; one per canary
    model: the largest ε lower bound beside its accounted ε."""
    lines: list[str] = []
    groups: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        if row["run"] == "training":
            groups.setdefault((row["method"], row["evaluated_model"]), []).append(row["mia_auc"])
    for (method, model), aucs in groups.items():
        lines.append(f"membership AUC {method} {model}: {sum(aucs) / len(aucs):.3f} "
                     f"(mean of {len(aucs)} client(s))")  # fmt: skip
    for row in rows:
        if row["run"] == "canary":
            accounted = row["epsilon_accounted"]
            lines.append(
                f"canary run {row['method']} client {row['client']} {row['evaluated_model']}: "
                f"ε lower bound {row['epsilon_lower_bound']:.2f}, accounted "
                + (f"{accounted:.2f}" if accounted is not None else "none (no DP)")
            )
    return lines
