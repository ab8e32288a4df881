"""``audit:``: the privacy audit of the runs ``train:`` lists (analysis.audit), and the
audit stage's view of the file (``train`` and ``audit``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import ConfigDict, Field

from analysis.audit.options import AuditOptions
from camelyon_proxyfl.params.base import StageParams
from camelyon_proxyfl.params.train import TrainSection
from proxyfl.canaries import CANARY_FILE, CANARY_RUN_DIR
from proxyfl.config import TrainConfig


class AuditSection(AuditOptions):
    """``audit:``: where the audit's canary runs and results go, and how it attacks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    out: Path = Field(Path("results/audit.json"), description="the audit's rows")
    canary_runs: Path = Field(
        Path("runs/canary"),
        description="canary runs land in CANARY_RUNS/{algorithm}/ (canaries.json, run/)",
    )
    workers: int = Field(
        2, ge=1,
        description="processes training reference models side by side (1: in the audit's "
        "own); the results are the same bit for bit for any number",
    )  # fmt: skip

    def options(self) -> AuditOptions:
        """How the audit attacks (audit.json's settings): what changes its numbers."""
        return AuditOptions(**self.model_dump(exclude={"out", "canary_runs", "workers"}))

    def canary_dir(self, algorithm: str) -> Path:
        return self.canary_runs / algorithm

    def canary_job(self, train: TrainSection, algorithm: str) -> TrainConfig:
        """The canary run of ``algorithm``: ``train``'s job at the canary seed, on the
        canary plan, in its own run directory, evaluated after its final round only."""
        job = train.job_config(algorithm, self.canary.seed)
        directory = self.canary_dir(algorithm)
        return TrainConfig(**{**job.model_dump(), "run_dir": directory / CANARY_RUN_DIR,
                              "canaries": directory / CANARY_FILE,
                              "evaluate_every_round": False})  # fmt: skip


class AuditParams(StageParams):
    """What ``python -m flows.audit`` reads of a parameters file."""

    train: TrainSection = Field(default_factory=TrainSection)
    audit: AuditSection = Field(default_factory=AuditSection)
