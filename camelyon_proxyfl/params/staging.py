"""The stage step's view of the parameters file: ``data`` (the slides and their labels),
``preprocess`` (the stores' splits and the patch geometry), ``train`` (the runs) and
``stage``."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from camelyon_proxyfl.params.base import StageParams
from camelyon_proxyfl.params.data import DataSection
from camelyon_proxyfl.params.preprocess import PreprocessSection
from camelyon_proxyfl.params.stage import StageSection
from camelyon_proxyfl.params.train import TrainSection


class StagingParams(StageParams):
    """What ``python -m flows.stage`` reads of a parameters file."""

    data: DataSection = Field(default_factory=DataSection)
    preprocess: PreprocessSection = Field(default_factory=PreprocessSection)
    train: TrainSection = Field(default_factory=TrainSection)
    stage: StageSection = Field(default_factory=StageSection)

    def centre_settings(self) -> dict[str, Any]:
        """The settings that decide a centre's maps and calls: ``dvc.yaml``'s ``stage@c``
        parameters less the paths, whose content the staging's record holds instead
        (:mod:`analysis.staging.freshness`: the slides, the store, the models)."""
        preprocess, stage = self.preprocess, self.stage
        return {
            "preprocess.backend": preprocess.backend,
            "preprocess.patch_size": preprocess.patch_size,
            "preprocess.level": preprocess.level,
            "preprocess.mask_mpp": preprocess.mask_mpp,
            "preprocess.tissue_fraction_min": preprocess.tissue_fraction_min,
            "preprocess.min_saturation": preprocess.min_saturation,
            "train.centers": list(self.train.centers),
            "stage.batch_size": stage.batch_size,
            "stage.device": stage.device,
            "stage.thresholds": list(stage.thresholds),
            "stage.itc_max_um": stage.itc_max_um,
            "stage.macro_min_um": stage.macro_min_um,
            "stage.reference_section_um": stage.reference_section_um,
        }
