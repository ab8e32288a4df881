"""The whole pipeline as one flow, each stage its own flow run in Prefect:

    slides --preprocess--> centre stores --train--> runs/ --report--> tables and curves

    python -m flows.pipeline                       # params.yaml (the demo configuration)
    python -m flows.pipeline --config params-paper.yaml

Also the entry points of the Prefect deployments in ``prefect.yaml``: ``pipeline`` for the
whole thing and ``preprocess_centre`` for one centre's store. Exits 1 when a stage fails
(the message says which and why), 2 on a bad parameter.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from prefect import flow

from flows.config import (
    DEFAULT_PARAMS,
    ConfigError,
    PreprocessConfig,
    ReportConfig,
    TrainFlowConfig,
    ValidationError,
    load_section,
)
from flows.preprocess import PreprocessFailed, run_preprocess
from flows.report import report
from flows.server import ServerStartError, address_towards, shared_prefect_api
from flows.train import train
from proxyfl.launch import TrainingJobFailed
from proxyfl.report import ReportError, ReportPaths


@dataclass(frozen=True)
class PipelineConfig:
    """The three stages' sections of one parameters file, validated together."""

    preprocess: PreprocessConfig
    train: TrainFlowConfig
    report: ReportConfig

    @classmethod
    def from_file(cls, params_file: Path) -> PipelineConfig:
        if not Path(params_file).is_file():
            raise ConfigError(f"parameters file {params_file} does not exist")
        preprocess = PreprocessConfig(**load_section(params_file, "preprocess"))
        train = TrainFlowConfig(**load_section(params_file, "train"))
        report = ReportConfig(**load_section(params_file, "report"))
        if train.data.resolve() != preprocess.out.resolve():
            raise ConfigError(
                f"train.data ({train.data}) must be preprocess.out ({preprocess.out}): "
                f"training reads the stores preprocessing writes"
            )
        missing = sorted(set(train.centers) - set(preprocess.centers))
        if missing:
            raise ConfigError(f"train.centers {missing} are not in preprocess.centers")
        return cls(preprocess=preprocess, train=train, report=report)


@flow(name="pipeline")
def pipeline(params_file: Path = DEFAULT_PARAMS) -> ReportPaths:
    """Slides to accuracy, macro-accuracy and ε tables, as ``params_file`` describes."""
    config = PipelineConfig.from_file(Path(params_file))
    run_preprocess(config.preprocess)
    train(config.train)
    return report(config.report)


@flow(name="preprocess-centre")
def preprocess_centre(center: int, params_file: Path = DEFAULT_PARAMS) -> None:
    """Rebuild one centre's store with the parameters of ``params_file``."""
    values = load_section(Path(params_file), "preprocess")
    run_preprocess(PreprocessConfig(**{**values, "centers": [center]}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_PARAMS,
                        help="parameters file (default params.yaml)")
    args = parser.parse_args(argv)
    try:
        config = PipelineConfig.from_file(args.config)
    except (ValidationError, ConfigError) as error:
        print(f"error: invalid parameters in {args.config}: {error}", file=sys.stderr)
        return 2
    scheduler = config.preprocess.scheduler_address
    try:  # one server for the pipeline, its stages and their workers (not one each)
        with shared_prefect_api(address_towards(scheduler) if scheduler else "127.0.0.1"):
            pipeline(args.config)
    except (PreprocessFailed, TrainingJobFailed, ReportError, ServerStartError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
