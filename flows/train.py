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

import argparse
import sys
from pathlib import Path

from prefect import flow

from flows.config import (
    DEFAULT_PARAMS,
    JOB_FIELDS,
    ConfigError,
    TrainFlowConfig,
    ValidationError,
    add_model_flags,
    load_section,
)
from proxyfl.config import TrainConfig
from proxyfl.launch import TrainingJobFailed
from tasks.train import training_run


@flow(name="train")
def train(config: TrainFlowConfig) -> list[Path]:
    """Run every (algorithm, seed) job of ``config``; the run directories, in order."""
    return [training_run(job) for job in config.jobs()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m flows.train",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_PARAMS,
                        help="parameters file whose 'train:' section gives the defaults")
    add_model_flags(parser, TrainFlowConfig, exclude=frozenset({"options"}))
    options = parser.add_argument_group("training options (train.options in params.yaml)")
    add_model_flags(options, TrainConfig, exclude=JOB_FIELDS)  # type: ignore[arg-type]
    return parser.parse_args(argv)


def resolve_train(args: argparse.Namespace) -> TrainFlowConfig:
    """The ``train:`` section with the flags given on the command line on top."""
    values = load_section(args.config, "train")
    options = dict(values.pop("options", None) or {})
    for name in TrainFlowConfig.model_fields:
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    for name in set(TrainConfig.model_fields) - JOB_FIELDS:
        if getattr(args, name, None) is not None:
            options[name] = getattr(args, name)
    return TrainFlowConfig(**values, options=options)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = resolve_train(args)
    except (ValidationError, ConfigError) as error:
        print(f"error: invalid training parameters: {error}", file=sys.stderr)
        return 2
    try:
        train(config)
    except TrainingJobFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
