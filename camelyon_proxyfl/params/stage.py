"""``stage:``: the staging of patients by the kept models (analysis.staging). Light: the
report reads it too (for the summary and pictures); the stage step's view of the whole
file is :mod:`camelyon_proxyfl.params.staging`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from camelyon_proxyfl.params.base import Section
from plumbing.atomic import unwritable_reason
from wsi.nodes import ITC_MAX_UM, MACRO_MIN_UM, REFERENCE_SECTION_UM, NodeThresholds


class StageSection(Section):
    """``stage:``: where each centre's maps and calls go, how slides are mapped, and the
    rules' numbers (Camelyon-17's: Bandi et al. 2019, §II-B)."""

    out: Path = Field(
        Path("staging"),
        description="STAGING/center_{c}/: that centre's maps and calls, nothing else in it",
    )
    summary: Path = Field(
        Path("results/staging.json"), description="every method's staging measures"
    )

    def unwritable_folders(self) -> dict[str, str]:
        """Key -> why, for each folder the staging writes (``out``, ``summary``'s) that
        cannot be written: checked before any slide is mapped or server started."""
        writes = {"stage.out": (self.out, "each centre's maps and calls are written there"),
                  "stage.summary": (self.summary.parent, f"{self.summary.name} is written "
                                                         "there")}  # fmt: skip
        reasons = {key: unwritable_reason(folder, f"{what}; make it writable, or set {key} "
                                          "to a path where it is")
                   for key, (folder, what) in writes.items()}  # fmt: skip
        return {key: reason for key, reason in reasons.items() if reason is not None}

    batch_size: int = Field(
        256, ge=1, description="patches per inference batch (on a GPU: as many as fit)"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: a GPU when one is visible, else the CPU"
    )
    thresholds: list[float] = Field(
        [0.5, 0.6, 0.7, 0.8, 0.9, 0.95],
        min_length=1,
        description="candidate tumour-probability thresholds of a lesion; each test patient "
        "is staged with the one that classes its centre's other test patients' nodes best",
    )
    itc_max_um: float = Field(
        ITC_MAX_UM, gt=0, description="isolated tumour cells: a largest lesion under this (µm)"
    )
    macro_min_um: float = Field(
        MACRO_MIN_UM, gt=0, description="macro-metastasis: a largest lesion over this (µm)"
    )
    reference_section_um: float = Field(
        REFERENCE_SECTION_UM,
        gt=0,
        description="a section with a shorter side (µm) has both thresholds scaled by "
        "short side / this (the synthetic slides; real ones are larger)",
    )
    bootstrap: int = Field(1000, ge=1, description="patient resamples behind the intervals")
    seed: int = Field(0, description="the bootstrap's draws")

    @model_validator(mode="after")
    def _thresholds_make_sense(self) -> StageSection:
        if not all(0.0 < t < 1.0 for t in self.thresholds):
            raise ValueError("thresholds must lie strictly between 0 and 1")
        self.node_thresholds()  # itc_max_um < macro_min_um
        return self

    def node_thresholds(self) -> NodeThresholds:
        """The node rule's thresholds for a real-size section."""
        return NodeThresholds(self.itc_max_um, self.macro_min_um)
