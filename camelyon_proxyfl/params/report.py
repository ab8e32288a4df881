"""``report:``: where the tables, metrics, curves and plots go; and the report stage's view
of the file (``train``, for the runs to report on, ``audit``, for the privacy audit's file
to show, ``stage``, for the staging's summary and pictures, and ``report``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from camelyon_proxyfl.params.audit import AuditSection
from camelyon_proxyfl.params.base import Section, StageParams
from camelyon_proxyfl.params.stage import StageSection
from camelyon_proxyfl.params.train import TrainSection
from plumbing.atomic import unwritable_reason
from proxyfl.names import Algorithm


class ReportSection(Section):
    """``report:``: where the tables, metrics, curves and plots go."""

    out: Path = Field(Path("results"), description="tables/, metrics.json, curves/, plots/")
    other_configurations: Literal["refuse", "separate"] = Field(
        "refuse",
        description="a listed run made with other parameters than train's (or stopped at "
        "another round): refuse the report, naming it, or table it apart, labelled with its "
        "parameters (separate); never mixed into a row",
    )
    staging_pictures_mb: float = Field(
        6.0,
        gt=0,
        description="MB of slide pictures report.html embeds (base64: 4/3 as many), the "
        "slides most methods called wrong first; 6 keeps the page under 10 MB",
    )


class ReportConfig(Section):
    """What the report flow runs with: the runs ``train:`` describes (and the parameters
    they must have been made with), the privacy audit's file (``audit.out``), and
    ``report:``."""

    train: TrainSection = Field(description="the runs to report on, and their parameters")
    out: Path = Field(description="tables, metrics.json, curves and plots (report.out)")
    # report:'s defaults, defined there once
    other_configurations: Literal["refuse", "separate"] = Field(
        ReportSection.model_fields["other_configurations"].default,
        description="report.other_configurations",
    )
    staging_pictures_mb: float = Field(
        ReportSection.model_fields["staging_pictures_mb"].default,
        gt=0,
        description="report.staging_pictures_mb",
    )
    audit: Path | None = Field(
        None,
        description="the privacy audit's rows (audit.out): shown when the file exists; "
        "None or absent: the report says no audit was recorded",
    )
    staging: Path | None = Field(
        None,
        description="the staging's summary (stage.summary): shown when the file exists; "
        "None or absent: the report says no staging was recorded",
    )
    staging_dir: Path | None = Field(
        None, description="the centres' staging folders, with the pictures (stage.out)"
    )

    def unwritable_folders(self) -> dict[str, str]:
        """Key -> why, for the report's folder when it cannot be written: checked before
        any run is read or server started."""
        reason = unwritable_reason(self.out, "the tables, metrics, curves, plots and "
                                   "report.html are written there; make it writable, or set "
                                   "report.out to a folder that is")  # fmt: skip
        return {"report.out": reason} if reason else {}

    @property
    def runs(self) -> Path:
        return self.train.runs

    @property
    def algorithms(self) -> list[Algorithm]:
        return self.train.algorithms

    @property
    def seeds(self) -> list[int]:
        return self.train.seeds

    @property
    def data(self) -> Path:
        """The centre stores: their reports give report.html's Table 1 and failures."""
        return self.train.data

    def expected_fingerprints(self) -> dict[tuple[str, int], dict[str, Any]]:
        """The configuration each listed run must have been made with."""
        return {(algorithm, seed): self.train.job_config(algorithm, seed).fingerprint()
                for algorithm in self.algorithms for seed in self.seeds}  # fmt: skip


class ReportParams(StageParams):
    """What ``python -m flows.report`` reads of a parameters file."""

    train: TrainSection = Field(default_factory=TrainSection)
    report: ReportSection = Field(default_factory=ReportSection)
    audit: AuditSection = Field(default_factory=AuditSection)
    stage: StageSection = Field(default_factory=StageSection)

    def config(self) -> ReportConfig:
        return ReportConfig(train=self.train, out=self.report.out,
                            other_configurations=self.report.other_configurations,
                            staging_pictures_mb=self.report.staging_pictures_mb,
                            audit=self.audit.out, staging=self.stage.summary,
                            staging_dir=self.stage.out)  # fmt: skip
