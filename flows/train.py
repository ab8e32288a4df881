"""Training flow: one MPI job per method and seed, each rank one hospital.

    for each algorithm, for each seed:
        mpiexec -n K python -m mpi4py -m proxyfl.run ...  ->  runs/{algorithm}/seed_{s}/

    python -m flows.train                                  # everything params.yaml lists
    python -m flows.train --algorithms ProxyFL Joint --seeds 0 1 --rounds 5
    python -m flows.train --hostfile hosts.txt             # ranks on the hosts it names

Methods, seeds, centres and directories come from ``params.yaml``'s ``train:`` section, the
engine's options from ``train.options``; every flag overrides one. Jobs run one after
another (each already occupies a process per client); on one machine their ranks are
forked from one warm server started with the command, which imports torch and Opacus once
while the flow run starts (:mod:`plumbing.warm`). Where their ranks run is
``train.launcher`` with ``train.hosts`` or ``train.hostfile`` (:mod:`camelyon_proxyfl.placement`;
docs/clusters.md).

A run directory that holds a finished run of the same configuration and stores is kept;
an unfinished one of the same configuration resumes; one of another configuration is
refused (exit 2, naming it and the keys that differ) unless ``--replace`` is given, and a
finished run replaced stays in place until the new one has finished
(:mod:`proxyfl.launch.rundir`). Before any server or job starts, the checks of
:mod:`camelyon_proxyfl.training_checks` run on the stores (readable, batch size against
every client's training size, PrivateKT's pool), the run directories and the placement (a
hostfile there, srun on PATH): exit 2 with every error. Exits 1 when a job fails (the
message names the rank and its last lines).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from prefect import flow

from camelyon_proxyfl.findings import Finding, errors
from camelyon_proxyfl.params.base import ParamsCommand
from camelyon_proxyfl.params.train import TrainParams, TrainSection
from camelyon_proxyfl.placement import placement
from camelyon_proxyfl.training_checks import check_training
from flows.server import run_flow_command
from plumbing.cli import exit_on_bad_parameters
from plumbing.locks import Busy
from plumbing.processes import start_command
from proxyfl.config import TrainOptions
from proxyfl.launch.job import TrainingJob, TrainingJobFailed, warm_ranks
from proxyfl.launch.rundir import RunConflict, discard_staged, staging_dir
from tasks.train import training_run


@flow(name="train")
def train(config: TrainSection, replace: bool = False) -> list[Path]:
    """Run every (algorithm, seed) job of ``config``; the run directories, in order.
    ``replace``: runs of another configuration (or finished ones) are trained again."""
    run = training_run.with_options(retries=config.retries)
    where = placement(config)
    with warm_ranks(where):  # one warm server for all the jobs (kept from main's, if any)
        return [run(TrainingJob(job, where), replace) for job in config.job_configs()]


@dataclass(frozen=True)
class LaunchChoices:
    """What a launch was asked to do besides its parameters (flags, not params.yaml)."""

    replace: bool = False  # train finished runs, or runs of another configuration, again
    discard_staged: bool = False  # delete interrupted replacements waiting beside runs


def parse_config(argv: list[str] | None) -> tuple[TrainSection, LaunchChoices]:
    """The ``train:`` section of the parameters file with the flags given laid over it,
    and the launch's :class:`LaunchChoices`."""
    command = ParamsCommand(TrainParams, "python -m flows.train", __doc__.split("\n")[0], argv)
    command.parser.add_argument(
        "--replace", action="store_true",
        help="train again a run directory that holds a finished run, or a run of another "
        "configuration (a finished run stays until the new one has finished); without it "
        "such a run is kept, or the launch refused",
    )  # fmt: skip
    command.parser.add_argument(
        "--discard-staged", action="store_true",
        help="delete the interrupted replacements (RUNS/ALGORITHM/.seed_S.next, a killed "
        "--replace's checkpoints and all) of the runs this launch names, then launch as "
        "usual; without it they wait, and --replace resumes them",
    )  # fmt: skip
    command.add_section(TrainSection, ("train",), exclude=("options",))
    command.add_section(TrainOptions, ("train", "options"),
                        group="training options (train.options in params.yaml)")  # fmt: skip
    args, params = command.parse()
    return params.train, LaunchChoices(args.replace, args.discard_staged)


def discard_staged_runs(config: TrainSection) -> None:
    """:func:`~proxyfl.launch.rundir.discard_staged` for every run of ``config``, each
    said on standard output."""
    for job in config.job_configs():
        assert job.run_dir is not None
        freed = discard_staged(job.run_dir)
        if freed is not None:
            print(f"{job.run_dir}: its interrupted replacement {staging_dir(job.run_dir)} "
                  f"deleted ({freed:.1f} MB)")  # fmt: skip


def report_findings(findings: list[Finding]) -> int:
    """Print the errors among ``findings`` to stderr, one a line: 2 if any, else 0."""
    failed = errors(findings)
    for finding in failed:
        print(finding, file=sys.stderr)
    if failed:
        print(f"{len(failed)} error(s): nothing was launched", file=sys.stderr)
    return 2 if failed else 0


@exit_on_bad_parameters
def main(argv: list[str] | None = None) -> int:
    config, choices = parse_config(argv)
    replace = choices.replace
    if choices.discard_staged:
        try:
            discard_staged_runs(config)
        except Busy as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    if report_findings(check_training(config, replace)):
        return 2
    # the ranks' server imports torch on the other core while Prefect starts the flow run
    with warm_ranks(placement(config)):
        return run_flow_command(lambda: train(config, replace),
                                failures=(TrainingJobFailed, RunConflict, Busy))  # fmt: skip


if __name__ == "__main__":
    start_command()
    sys.exit(main())
