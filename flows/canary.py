"""Canary-run flow: one method trained once more with canaries, for the privacy audit.

The run the audit's one-run ε lower bound comes from (analysis.audit; the audit itself:
flows.audit).

    plan (canaries.json) -> MPI job -> runs/canary/{algorithm}/run/

    python -m flows.canary ProxyFL

The method's clients train as ``train:`` says, at ``audit.canary.seed``, each on its
training split less the OUT canaries of a new plan and with the IN ones relabelled
(``audit.canary``: count, labels; coins from ``audit.seed``; the plan is recorded beside
the run), where ``train.launcher``, ``train.hosts`` or ``train.hostfile`` place it. A
finished canary run of the same configuration, stores and plan is kept; one of another
configuration is replaced. Exits 1 when the job fails or a store is missing, 2 on a bad
parameter (a hostfile that is not there included).
"""

from __future__ import annotations

import sys
from pathlib import Path

from prefect import flow

from camelyon_proxyfl.params.audit import AuditParams, AuditSection
from camelyon_proxyfl.params.base import ParamsCommand
from camelyon_proxyfl.params.train import TrainSection
from camelyon_proxyfl.placement import placement, placement_findings
from flows.server import run_flow_command
from plumbing.cli import exit_on_bad_parameters
from plumbing.locks import Busy
from plumbing.processes import start_command
from proxyfl.canaries import CanaryPlanError
from proxyfl.launch.job import TrainingJob, TrainingJobFailed, warm_ranks
from proxyfl.launch.rundir import RunConflict, holds_another_configuration
from tasks.canary import canary_plan
from tasks.train import training_run


@flow(name="canary-run", flow_run_name="canary run of {algorithm}")
def canary_run(train: TrainSection, audit: AuditSection, algorithm: str) -> Path:
    """``algorithm`` trained once more, on its clients' data with the IN canaries of a new
    plan and without the OUT ones: ``CANARY_RUNS/{algorithm}/``."""
    canary_plan(audit, train, algorithm)
    job = TrainingJob(audit.canary_job(train, algorithm), placement(train))
    replace = holds_another_configuration(job.config)  # a derived run: never a conflict
    with warm_ranks(job.placement):
        training_run.with_options(retries=train.retries)(job, replace=replace)
    return audit.canary_dir(algorithm)


def parse_config(argv: list[str] | None) -> tuple[TrainSection, AuditSection, str]:
    command = ParamsCommand(AuditParams, "python -m flows.canary", __doc__.split("\n")[0], argv)
    command.parser.add_argument(
        "algorithm", help="the method of the canary run (one of audit.canary.algorithms)"
    )
    command.add_key("--data", ("train", "data"))
    args, params = command.parse()
    if args.algorithm not in params.audit.canary.algorithms:
        command.parser.error(f"{args.algorithm}: not in audit.canary.algorithms "
                             f"{params.audit.canary.algorithms}")  # fmt: skip
    placed = placement_findings(params.train)  # where the job runs: before any server
    if placed:
        command.parser.error("; ".join(f"{f.subject}: {f.message}" for f in placed))
    return params.train, params.audit, args.algorithm


@exit_on_bad_parameters
def main(argv: list[str] | None = None) -> int:
    train, audit, algorithm = parse_config(argv)
    failures = (CanaryPlanError, TrainingJobFailed, RunConflict, Busy)
    with warm_ranks(placement(train)):  # importing while the flow run starts
        return run_flow_command(lambda: canary_run(train, audit, algorithm), failures=failures)


if __name__ == "__main__":
    start_command()
    sys.exit(main())
