"""Privacy audit flow: membership inference on the kept models, ε bounds from canaries.

Membership inference on every run's kept models, and the ε lower bound of each canary run
(analysis.audit; docs/algorithms.md §4; canary runs: flows.canary).

    runs/ALGORITHM/seed_S + runs/canary/ALGORITHM -> results/audit.json

    python -m flows.audit                          # params.yaml's runs and audit:
    python -m flows.audit --reference-models 0     # the loss attack only (no LiRA)

The runs are those ``train:`` lists (finished, with their kept models), the canary runs
those ``audit.canary.algorithms`` lists; every number comes from ``params.yaml``'s
``audit:`` section, and every flag overrides one. An audit file whose runs, stores,
settings, code and libraries are those recorded beside it is kept, and its summary printed
again (:mod:`analysis.audit.freshness`; DVC deletes it before its stage runs, so ``dvc
repro`` always computes it). Prints the audit's summary. Exits 1 when
a run, a kept model, a store or a canary run is missing (the message names it) or when an
ε lower bound exceeds its accounted ε (a privacy bug: audit.json is written, naming it);
2 on a bad parameter.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prefect import flow, get_run_logger

from analysis.audit.population import AuditInputError
from analysis.audit.runs import AuditViolation, summary_lines
from analysis.audit.workers import ReferenceTrainingError
from camelyon_proxyfl.params.audit import AuditParams, AuditSection
from camelyon_proxyfl.params.base import ParamsCommand
from camelyon_proxyfl.params.train import TrainSection
from flows.server import run_flow_command
from plumbing.cli import exit_on_bad_parameters
from plumbing.processes import start_command
from tasks.audit import audit_file, audit_freshness, audit_inputs, audit_rows


@flow(name="audit")
def privacy_audit(train: TrainSection, audit: AuditSection) -> Path:
    """``audit.out``: membership inference on the runs ``train`` lists and the ε lower
    bounds of the canary runs ``audit.canary.algorithms`` lists."""
    inputs = audit_inputs(audit, train)
    if audit_freshness(audit.out, inputs).result():  # a State: "Up to date" or "Stale"
        rows = audit_rows(audit, train)
        audit_file(rows, audit, inputs)
    else:  # kept: its runs, stores, settings, code and libraries are those it recorded
        rows = json.loads(audit.out.read_text())["rows"]
    logger = get_run_logger()
    for line in summary_lines(rows):
        logger.info("%s", line)
    return audit.out


def parse_config(argv: list[str] | None) -> tuple[TrainSection, AuditSection]:
    command = ParamsCommand(AuditParams, "python -m flows.audit", __doc__.split("\n")[0], argv)
    for option, key in (("--runs", ("train", "runs")), ("--data", ("train", "data")),
                        ("--algorithms", ("train", "algorithms")),
                        ("--seeds", ("train", "seeds"))):  # fmt: skip
        command.add_key(option, key)
    command.add_section(AuditSection, ("audit",), exclude=("canary",))
    _, params = command.parse()
    return params.train, params.audit


@exit_on_bad_parameters
def main(argv: list[str] | None = None) -> int:
    train, audit = parse_config(argv)
    return run_flow_command(lambda: privacy_audit(train, audit),
                            failures=(AuditInputError, AuditViolation,
                                      ReferenceTrainingError))  # fmt: skip


if __name__ == "__main__":
    start_command()
    sys.exit(main())
