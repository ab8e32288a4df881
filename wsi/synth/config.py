"""The settings of a synthetic dataset (and of ``params.yaml``'s ``data.synth``),
the label thresholds and the pyramid's geometry. Light: no image code."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from plumbing.parameters import Parameters
from wsi.catalogue import PATIENTS_PER_CENTER
from wsi.nodes import METASTASIS_LABELS, PATIENT_STAGES, NodeThresholds, label_scale

# in the ImageDescription of every slide wsi.synth writes: how a centre's report, and the
# report, tell synthetic slides from real ones (wsi.slide.is_synthetic_slide)
SYNTHETIC_MARKER = "wsi.synth"

Layout = Literal["nested", "flat"]
LAYOUTS: tuple[str, ...] = ("nested", "flat")
TUMOUR_GROUP = "metastases"
CARVE_OUT_GROUP = "normal"
TUMOUR_LABELS: tuple[str, ...] = METASTASIS_LABELS
SMALLEST_LEVEL_SIDE = 512
_STREAM_LABELS = 1
_STREAM_SLIDE = 2
_STREAM_BAND = 3
_STREAM_STAIN = 4
_STREAM_STAGES = 5

STAGE_WEIGHTS: tuple[float, ...] = (0.36, 0.12, 0.16, 0.24, 0.12)
"""The chances of ``pN0, pN0(i+), pN1mi, pN1, pN2`` (:data:`wsi.nodes.PATIENT_STAGES`)
for a patient outside its centre's tumour slots (:mod:`wsi.synth.rules`): near
Camelyon-17's cohorts, where about a third of the patients are pN0 and the metastatic
ones spread over the four other stages (the challenge paper, Bandi et al. 2019; the
dataset paper, Litjens et al. 2018)."""


def _max_levels(width: int, height: int) -> int:
    levels = 1
    while min(width, height) >> levels >= 1:
        levels += 1
    return levels


def auto_level_count(width: int, height: int, smallest_side: int = SMALLEST_LEVEL_SIDE) -> int:
    """Levels, each half the previous, until the longer side is <= ``smallest_side``."""
    levels = 1
    w, h = width, height
    while max(w, h) > smallest_side and min(w, h) >= 2:
        w, h = w // 2, h // 2
        levels += 1
    return levels


def level_dimensions(width: int, height: int, levels: int) -> list[tuple[int, int]]:
    """(width, height) of each level: each is the previous one halved (rounded down)."""
    dims = [(width, height)]
    for _ in range(levels - 1):
        w, h = dims[-1]
        dims.append((w // 2, h // 2))
    return dims


# --------------------------------------------------------------------------------------
# Configuration and results
# --------------------------------------------------------------------------------------


class SynthConfig(Parameters):
    """Every size and count of a synthetic dataset. Output depends on nothing else."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    centers: tuple[int, ...] = Field((0, 1, 2, 3, 4), description="centres to write")
    patients_per_center: int = Field(
        2, description=f"patients per centre (1..{PATIENTS_PER_CENTER})"
    )
    nodes_per_patient: int = Field(5, description="slides (lymph nodes) per patient")
    seed: int = Field(0, description="seed of every random draw")
    width: int = Field(6144, description="level-0 width, px")
    height: int = Field(4096, description="level-0 height, px")
    mpp: float = Field(0.25, description="level-0 µm per px")
    tile_size: int = Field(512, description="TIFF tile side, px (a multiple of 16)")
    levels: int | None = Field(None, description="pyramid levels (null: down to <= 512 px)")
    layout: Layout = Field("nested", description="center_{c}/patient_{p}/ or flat center_{c}/")
    jpeg_quality: int = Field(90, description="JPEG quality of the tiles (1..100)")
    stage_weights: tuple[float, float, float, float, float] = Field(
        STAGE_WEIGHTS, description="chances of pN0, pN0(i+), pN1mi, pN1, pN2 (wsi.synth.rules)"
    )
    tumour_patients_per_center: int = Field(
        2, description="patients per centre drawn pN1 or pN2 with a negative node, at least"
    )
    tissue_fraction: tuple[float, float] = Field(
        (0.30, 0.55), description="range of the tissue's share of a slide"
    )

    @model_validator(mode="after")
    def _consistent(self) -> SynthConfig:
        problems = []
        if not self.centers or any(c < 0 for c in self.centers):
            problems.append("centers must be a non-empty list of non-negative integers")
        if len(set(self.centers)) != len(self.centers):
            problems.append("centers must not repeat")
        if not 1 <= self.patients_per_center <= PATIENTS_PER_CENTER:
            problems.append(f"patients_per_center must be in 1..{PATIENTS_PER_CENTER}")
        if self.nodes_per_patient < 1:
            problems.append("nodes_per_patient must be >= 1")
        if self.seed < 0:
            problems.append("seed must be >= 0")
        if self.tile_size < 16 or self.tile_size % 16:
            problems.append("tile_size must be a positive multiple of 16")
        if self.width < 64 or self.height < 64:
            problems.append("width and height must be >= 64")
        if not self.mpp > 0:
            problems.append("mpp must be > 0")
        if self.levels is not None and not 1 <= self.levels <= _max_levels(self.width, self.height):
            problems.append(f"levels must be in 1..{_max_levels(self.width, self.height)}")
        if self.layout not in LAYOUTS:
            problems.append(f"layout must be one of {LAYOUTS}")
        if not 1 <= self.jpeg_quality <= 100:
            problems.append("jpeg_quality must be in 1..100")
        if any(w < 0 for w in self.stage_weights) or not sum(self.stage_weights) > 0:
            problems.append("stage_weights must be non-negative with a positive sum")
        elif self.nodes_per_patient < 4 and self.stage_weights[PATIENT_STAGES.index("pN2")]:
            problems.append("pN2 needs 4 or more nodes_per_patient: give it no stage_weight")
        if self.tumour_patients_per_center < 0:
            problems.append("tumour_patients_per_center must be >= 0")
        elif self.tumour_patients_per_center and (
            self.nodes_per_patient < 2 or not any(self.stage_weights[3:])
        ):
            problems.append("tumour_patients_per_center needs 2 or more nodes_per_patient "
                            "and a stage_weight for pN1 or pN2")  # fmt: skip
        low, high = self.tissue_fraction
        if not 0.05 <= low <= high <= 0.9:
            problems.append("tissue_fraction must satisfy 0.05 <= low <= high <= 0.9")
        if problems:
            raise ValueError("invalid SynthConfig: " + "; ".join(problems))
        return self

    @property
    def label_scale(self) -> float:
        """Factor applied to the real ITC / macro thresholds (:func:`wsi.nodes.label_scale`)."""
        return label_scale(min(self.width, self.height) * self.mpp)

    @property
    def thresholds(self) -> NodeThresholds:
        """The node classes' thresholds of these slides (:mod:`wsi.nodes`)."""
        return NodeThresholds.for_section(min(self.width, self.height) * self.mpp)

    @property
    def itc_max_um(self) -> float:
        """Lesions smaller than this are isolated tumour cells."""
        return self.thresholds.itc_max_um

    @property
    def macro_min_um(self) -> float:
        """Lesions larger than this are macro-metastases."""
        return self.thresholds.macro_min_um

    @property
    def level_count(self) -> int:
        return self.levels if self.levels is not None else auto_level_count(self.width, self.height)

    def patients(self) -> list[int]:
        return [
            PATIENTS_PER_CENTER * center + index
            for center in self.centers
            for index in range(self.patients_per_center)
        ]


class SynthSettings(Parameters):
    """``params.yaml``'s ``data.synth``: the embedded dataset's sizes, and how it is written.

    Centres are ``0 .. num_centers - 1``; the other :class:`SynthConfig` fields keep their
    defaults (the command line sets any of them).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    patients_per_center: int = SynthConfig.model_fields["patients_per_center"]
    seed: int = SynthConfig.model_fields["seed"]
    num_centers: int = Field(
        len(SynthConfig.model_fields["centers"].default), ge=1,
        description="centres 0 .. N-1 (instead of --centers)",
    )  # fmt: skip
    width: int = SynthConfig.model_fields["width"]
    height: int = SynthConfig.model_fields["height"]
    workers: int = Field(2, ge=1, description="slides written in parallel")

    def config(self) -> SynthConfig:
        values = self.model_dump(exclude={"num_centers", "workers"})
        return SynthConfig(**values, centers=tuple(range(self.num_centers)))
