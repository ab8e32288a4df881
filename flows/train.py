"""Training flow: one MPI job per method and seed, each rank one hospital.

    for each algorithm, for each seed:
        mpiexec -n K python -m mpi4py -m proxyfl.run ...  ->  runs/{algorithm}/seed_{s}/

    python -m flows.train                                  # everything params.yaml lists
    python -m flows.train --algorithms ProxyFL Joint --seeds 0 1 --rounds 5

Methods, seeds, centres and directories come from ``params.yaml``'s ``train:`` section, the
engine's options from ``train.options``; every flag overrides one. Jobs run one after
another (each already occupies a process per client). Exits 1 when a job fails (the
message names the rank and its last lines), 2 on a bad parameter.
"""

from __future__ import annotations

import sys
from pathlib import Path

from prefect import flow

from camelyon_proxyfl.params import ParamsCommand, TrainSection
from flows.server import run_flow_command
from plumbing.cli import exit_on_bad_parameters
from plumbing.processes import end_with_parent
from proxyfl.config import TrainOptions
from proxyfl.launch import TrainingJob, TrainingJobFailed
from tasks.train import training_run


@flow(name="train")
def train(config: TrainSection) -> list[Path]:
    """Run every (algorithm, seed) job of ``config``; the run directories, in order."""
    run = training_run.with_options(retries=config.retries)
    return [run(TrainingJob(job)) for job in config.job_configs()]


def parse_config(argv: list[str] | None) -> TrainSection:
    """The ``train:`` section of the parameters file with the flags given laid over it."""
    command = ParamsCommand("python -m flows.train", __doc__.split("\n")[0], argv)
    command.add_section(TrainSection, ("train",), exclude=("options",))
    command.add_section(TrainOptions, ("train", "options"),
                        group="training options (train.options in params.yaml)")  # fmt: skip
    _, params = command.parse()
    return params.train


@exit_on_bad_parameters
def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    return run_flow_command(lambda: train(config), failures=(TrainingJobFailed,))


if __name__ == "__main__":
    end_with_parent()
    sys.exit(main())
