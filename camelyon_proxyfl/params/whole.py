"""A whole parameters file, every section validated: what the pipeline runs with."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from camelyon_proxyfl.params.audit import AuditSection
from camelyon_proxyfl.params.base import DEFAULT_PARAMS, StageParams, load_sections
from camelyon_proxyfl.params.data import DataSection
from camelyon_proxyfl.params.machine import MachineSection
from camelyon_proxyfl.params.preprocess import (
    PreprocessConfig,
    PreprocessParams,
    PreprocessSection,
    synthetic_centres_problem,
)
from camelyon_proxyfl.params.report import ReportConfig, ReportParams, ReportSection
from camelyon_proxyfl.params.stage import StageSection
from camelyon_proxyfl.params.staging import StagingParams
from camelyon_proxyfl.params.train import TrainSection
from plumbing.cli import ConfigError


class Params(StageParams):
    """A whole parameters file."""

    data: DataSection = Field(default_factory=DataSection)
    preprocess: PreprocessSection = Field(default_factory=PreprocessSection)
    train: TrainSection = Field(default_factory=TrainSection)
    audit: AuditSection = Field(default_factory=AuditSection)
    stage: StageSection = Field(default_factory=StageSection)
    report: ReportSection = Field(default_factory=ReportSection)
    machine: MachineSection = Field(default_factory=MachineSection)

    def preprocess_config(self) -> PreprocessConfig:
        return PreprocessParams(data=self.data, preprocess=self.preprocess).config()

    def report_config(self) -> ReportConfig:
        return ReportParams(train=self.train, report=self.report, audit=self.audit,
                            stage=self.stage).config()  # fmt: skip

    def staging_params(self) -> StagingParams:
        return StagingParams(data=self.data, preprocess=self.preprocess, train=self.train,
                             stage=self.stage)  # fmt: skip

    def check_pipeline(self, source: Path | str) -> None:
        """The stages must fit together: training reads the stores preprocessing writes."""
        problems = []
        if self.train.data.resolve() != self.preprocess.out.resolve():
            problems.append(
                f"train.data: {self.train.data} must be preprocess.out ({self.preprocess.out}): "
                f"training reads the stores preprocessing writes"
            )
        synthetic = synthetic_centres_problem(self.data, self.preprocess)
        if synthetic is not None:
            problems.append(f"preprocess.centers: {synthetic}")
        missing = sorted(set(self.train.centers) - set(self.preprocess.centers))
        if missing:
            problems.append(f"train.centers: {missing} are not in preprocess.centers")
        public = self.train.options.public_center
        reads_public_store = self.train.options.public_pool == "center"
        if ("PrivateKT" in self.train.algorithms and reads_public_store
                and public not in self.preprocess.centers):  # fmt: skip
            problems.append(
                f"train.algorithms: PrivateKT reads centre {public}'s store as its public "
                f"pool (train.options.public_center), which preprocess.centers does not build"
            )
        if problems:
            raise ConfigError(source, "; ".join(problems))


def load_params(path: Path = DEFAULT_PARAMS, *, required: bool = True) -> Params:
    """The parameters file at ``path``, every section validated; a
    :class:`~plumbing.cli.ConfigError` otherwise."""
    return load_sections(Params, path, required=required)
