"""The stage step's view of the parameters file: ``data`` (the slides and their labels),
``preprocess`` (the stores' splits and the patch geometry), ``train`` (the runs) and
``stage``."""

from __future__ import annotations

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
