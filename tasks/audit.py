"""Audit tasks: the audit's rows, and ``results/audit.json``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prefect import task
from prefect.client.schemas.objects import State
from prefect.logging import get_run_logger

from analysis.audit.freshness import AuditInputs, forget_inputs, record_inputs, stale_reason
from analysis.audit.runs import (
    AuditCache,
    AuditViolation,
    audit_canary_run,
    audit_document,
    audit_training_run,
)
from analysis.audit.workers import audit_processes
from camelyon_proxyfl.params.audit import AuditSection
from camelyon_proxyfl.params.train import TrainSection
from proxyfl.results import atomic_write_json
from tasks.freshness import freshness_state


def audit_inputs(audit: AuditSection, train: TrainSection) -> AuditInputs:
    """The inputs of the audit ``audit`` and ``train`` describe, as they are now."""
    runs = [train.run_dir(algorithm, seed) for algorithm in train.algorithms
            for seed in train.seeds]  # fmt: skip
    canary_runs = [audit.canary_dir(algorithm) for algorithm in audit.canary.algorithms]
    return AuditInputs.now(audit.options(), runs, canary_runs, train.data)


@task(name="audit rows")
def audit_rows(audit: AuditSection, train: TrainSection) -> list[dict[str, Any]]:
    """Membership inference on every run ``train`` lists, and the ε lower bound of every
    canary run ``audit.canary.algorithms`` lists."""
    logger = get_run_logger()
    options = audit.options()
    rows: list[dict[str, Any]] = []
    with audit_processes(audit.workers if options.reference_models else 1) as pool:
        cache = AuditCache(pool=pool)
        for algorithm in train.algorithms:
            for seed in train.seeds:
                run_dir = train.run_dir(algorithm, seed)
                rows += audit_training_run(run_dir, train.data, options, cache)
                logger.info("membership inference: %s (%d model(s))", run_dir,
                            sum(row["method"] == algorithm and row["seed"] == seed
                                for row in rows))  # fmt: skip
        for algorithm in audit.canary.algorithms:
            rows += audit_canary_run(audit.canary_dir(algorithm), train.data, options)
            logger.info("one-run ε lower bound: %s", audit.canary_dir(algorithm))
    return rows


@task(name="audit up to date?")
def audit_freshness(out: Path, inputs: AuditInputs) -> State:
    """Whether ``out`` was computed from exactly ``inputs`` and is untouched since: a
    Completed state named "Up to date" (data ``False``) or "Stale" (data ``True``), its
    message the reason, so the UI tells whether the run computes the audit again."""
    recorded = "its runs, stores, settings, code and libraries"
    return freshness_state(str(out), stale_reason(out, inputs), recorded, "to compute")


@task(name="audit file")
def audit_file(rows: list[dict[str, Any]], audit: AuditSection, inputs: AuditInputs) -> Path:
    """``audit.out`` with the rows, its ``inputs`` recorded beside it; then an
    ``AuditViolation`` if any DP model's ε lower bound exceeds its accounted ε (the file
    is kept: it is the evidence; its inputs are not recorded, so the next run computes it
    again and fails again)."""
    document = audit_document(rows, audit.options())
    forget_inputs(audit.out)  # no record describes a file being rewritten
    atomic_write_json(audit.out, document)
    if not document["violations"]:
        record_inputs(audit.out, inputs)
    if document["violations"]:
        logging.getLogger(__name__).error("privacy audit violations: %s", document["violations"])
        raise AuditViolation(
            audit.out,
            "an ε lower bound exceeds the accounted ε, so the training does not keep its "
            "privacy promise (a bug): " + "; ".join(document["violations"]),
        )
    return audit.out
