"""``preprocess:``: the patch and sampling parameters, and how the work is run; and the
preprocess stage's view of the file (``data`` and ``preprocess``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator

from camelyon_proxyfl.params.base import StageParams
from camelyon_proxyfl.params.data import DataSection
from plumbing.atomic import unwritable_reason
from plumbing.parameters import distinct
from wsi.params import PatchParams, SamplingParams, SamplingRules


def _count_or_per_centre(value: Any) -> Any:
    """Command-line forms of a per-centre count: ``["300"]`` or ``["0=1517", "1=1701"]``."""
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        return value
    if len(value) == 1 and "=" not in value[0]:
        return value[0]
    pairs = [item.split("=", 1) for item in value]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"give one number, or CENTRE=NUMBER per centre; got {' '.join(value)}")
    return {centre: count for centre, count in pairs}


PatchesPerClass = Annotated[
    Annotated[int, Field(ge=1)] | dict[int, Annotated[int, Field(ge=1)]],
    BeforeValidator(_count_or_per_centre),
]


class PreprocessSection(SamplingRules, PatchParams):
    """``preprocess:``: the patch and sampling parameters, and how the work is run."""

    out: Path = Field(Path("data/patches"), description="directory of the centre stores")
    cache_dir: Path = Field(
        Path("data/cache/candidates"), description="per-slide cache of usable candidates"
    )
    centers: list[int] = Field([0, 1, 2, 3], description="centres to build stores for")
    backend: Literal["auto", "openslide", "tiffslide"] = Field("auto", description="slide reader")
    workers: int = Field(
        2, ge=1, description="parallel processes for per-slide work (1: none, in this process)"
    )
    patches_per_class: PatchesPerClass = Field(
        {0: 1517, 1: 1701, 2: 1834, 3: 1861},  # the paper's Table 1
        description="patches of each label per centre: one per centre (dvc.yaml's "
        "preprocess@c reads its own), or one for all (flags: --patches-per-class 300, or "
        "--patches-per-class 0=1517 1=1701 ...)",
    )
    strict: bool = Field(False, description="exit non-zero on any slide or catalogue failure")
    runner: Literal["process", "dask"] = Field(
        "process", description="per-slide work: a local process pool, or a Dask cluster"
    )
    scheduler_address: str | None = Field(
        None,
        description="runner dask: the scheduler (tcp://host:8786); null starts a local "
        "cluster of `workers` processes",
    )

    @field_validator("centers")
    @classmethod
    def _each_centre_once(cls, value: list[int]) -> list[int]:
        return list(distinct(value, "centre(s)"))

    def unwritable_folders(self) -> dict[str, str]:
        """Key -> why, for each folder preprocessing writes (``out``, ``cache_dir``) that
        cannot be written: checked before any slide is read or server started."""
        writes = {"out": "the centre stores are written there",
                  "cache_dir": "each slide's candidates are cached there"}  # fmt: skip
        reasons = {f"preprocess.{key}": unwritable_reason(getattr(self, key), f"{what}; make "
                   f"it writable, or set preprocess.{key} to a folder that is")
                   for key, what in writes.items()}  # fmt: skip
        return {key: reason for key, reason in reasons.items() if reason is not None}

    @model_validator(mode="after")
    def _counts_cover_the_centres(self) -> PreprocessSection:
        if isinstance(self.patches_per_class, dict):
            missing = sorted(set(self.centers) - set(self.patches_per_class))
            if missing:
                raise ValueError(f"patches_per_class gives no number for centre(s) {missing}")
        if self.scheduler_address is not None and self.runner != "dask":
            raise ValueError("scheduler_address is set but runner is not dask")
        return self

    def patches_for(self, center: int) -> int:
        """Patches of each label that ``center``'s store is asked for."""
        if isinstance(self.patches_per_class, dict):
            return self.patches_per_class[center]
        return self.patches_per_class

    @property
    def patch(self) -> PatchParams:
        return PatchParams(**self.model_dump(include=set(PatchParams.model_fields)))

    def sampling(self, center: int) -> SamplingParams:
        """How ``center``'s store is sampled and split."""
        rules = self.model_dump(include=set(SamplingRules.model_fields))
        return SamplingParams(**rules, patches_per_class=self.patches_for(center))


class PreprocessConfig(PreprocessSection):
    """What the preprocess flow runs with: its section and the dataset it reads."""

    data_root: Path = Field(description="dataset root (data.root)")


def synthetic_centres_problem(data: DataSection, preprocess: PreprocessSection) -> str | None:
    """Why the synthetic dataset cannot give every centre of ``preprocess.centers`` (they
    would fail after the slides are written, as centres without slides), or ``None``."""
    if not data.is_synthetic:
        return None
    written = range(data.synth.num_centers)
    absent = [center for center in preprocess.centers if center not in written]
    if not absent:
        return None
    last = len(written) - 1
    return (f"{absent} are not centres of the synthetic dataset, which "
            f"data.synth.num_centers ({len(written)}) makes centres 0 to {last}")  # fmt: skip


class PreprocessParams(StageParams):
    """What ``python -m flows.preprocess`` reads of a parameters file."""

    data: DataSection = Field(default_factory=DataSection)
    preprocess: PreprocessSection = Field(default_factory=PreprocessSection)

    @model_validator(mode="after")
    def _synthetic_centres(self) -> PreprocessParams:
        problem = synthetic_centres_problem(self.data, self.preprocess)
        if problem is not None:
            raise ValidationError.from_exception_data(self.__class__.__name__, [{
                "type": "value_error", "loc": ("preprocess", "centers"), "input":
                self.preprocess.centers, "ctx": {"error": ValueError(problem)}}])  # fmt: skip
        return self

    def config(self) -> PreprocessConfig:
        return PreprocessConfig(**dict(self.preprocess), data_root=self.data.root)
