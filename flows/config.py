"""Configuration at the edge: ``params.yaml`` sections validated once, CLI flags on top.

Every field of a section model is a command-line flag (``patch_size`` -> ``--patch-size``)
whose default comes from ``params.yaml``; the validated model is then turned into the
typed parameter objects that the libraries take.
"""

from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from proxyfl.config import Algorithm, ConfigError, TrainConfig
from proxyfl.launch import TrainingJob
from proxyfl.names import ALGORITHMS
from wsi.center import SamplingParams, Shortfall
from wsi.patches import PatchParams

DEFAULT_PARAMS = Path("params.yaml")
Model = TypeVar("Model", bound=BaseModel)


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


class PreprocessConfig(BaseModel):
    """The ``preprocess:`` section of ``params.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_root: Path = Field(Path("data/synthetic"), description="Camelyon-17 dataset root")
    out: Path = Field(Path("data/patches"), description="directory of the centre stores")
    cache_dir: Path = Field(Path("data/cache/candidates"), description="per-slide cache")
    centers: list[int] = Field([0, 1, 2, 3], description="centres to build stores for")
    backend: Literal["auto", "openslide", "tiffslide"] = "auto"
    workers: int = Field(2, ge=1, description="parallel processes for per-slide work")
    patch_size: int = Field(512, ge=8, description="stored patch side, pixels at --level")
    level: int = Field(0, ge=0, description="pyramid level the patches are read at")
    mask_mpp: float = Field(8.0, gt=0, description="tissue/tumour mask resolution, µm/px")
    tissue_fraction_min: float = Field(0.5, gt=0, le=1)
    tumor_fraction_min: float = Field(0.5, gt=0, le=1)
    healthy_source: Literal["negative_slides", "outside_annotations"] = "negative_slides"
    min_saturation: float = Field(0.07, ge=0, le=1)
    patches_per_class: PatchesPerClass = Field(
        1000,
        description="patches of each label per centre: one number, or one per centre "
        "(flags: --patches-per-class 300, or --patches-per-class 0=1517 1=1701 ...)",
    )
    shortfall: Shortfall = Field(
        "fail",
        description="a centre short of patches_per_class: fail, or take_available "
        "(as many as it has, still balanced)",
    )
    max_per_slide: int | None = Field(None, ge=1, description="cap per slide and label")
    test_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = 0
    strict: bool = Field(False, description="exit non-zero on any slide or catalogue failure")
    runner: Literal["process", "dask"] = Field(
        "process", description="per-slide work: a local process pool, or a Dask cluster"
    )
    scheduler_address: str | None = Field(
        None,
        description="runner dask: the scheduler (tcp://host:8786); null starts a local "
        "cluster of `workers` processes",
    )

    @model_validator(mode="after")
    def _counts_cover_the_centres(self) -> PreprocessConfig:
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
        return PatchParams(
            patch_size=self.patch_size,
            level=self.level,
            mask_mpp=self.mask_mpp,
            tissue_fraction_min=self.tissue_fraction_min,
            tumor_fraction_min=self.tumor_fraction_min,
            healthy_source=self.healthy_source,
            min_saturation=self.min_saturation,
        )

    def sampling(self, center: int) -> SamplingParams:
        """How ``center``'s store is sampled and split."""
        return SamplingParams(
            patches_per_class=self.patches_for(center),
            shortfall=self.shortfall,
            max_per_slide=self.max_per_slide,
            test_fraction=self.test_fraction,
            seed=self.seed,
        )


# TrainConfig fields a training flow sets per job, so they are not options of the section
JOB_FIELDS = frozenset({"algorithm", "seed", "data", "out", "centers", "resume",
                        "stop_after_round"})


class TrainFlowConfig(BaseModel):
    """The ``train:`` section: which runs to launch, and the engine's options for all of them.

    ``options`` holds ``proxyfl.run`` options (the fields of :class:`proxyfl.config.TrainConfig`
    other than the per-job ones), passed to every job as explicit command-line flags.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithms: list[Algorithm] = Field(list(ALGORITHMS), description="methods to train")
    seeds: list[int] = Field([0], description="seeds; every method runs once per seed")
    centers: list[int] = Field([0, 1, 2, 3], description="the clients' centres")
    data: Path = Field(Path("data/patches"), description="directory of the centre stores")
    runs: Path = Field(Path("runs"), description="runs land in RUNS/{algorithm}/seed_{s}")
    options: dict[str, Any] = Field({}, description="proxyfl.run options")

    def model_post_init(self, context: Any) -> None:
        unknown = sorted(set(self.options) - set(TrainConfig.model_fields))
        per_job = sorted(set(self.options) & JOB_FIELDS)
        if unknown:
            raise ConfigError(f"train.options: unknown training option(s) {unknown}")
        if per_job:
            raise ConfigError(f"train.options: {per_job} are set per job by the flow")
        for algorithm in self.algorithms:  # fail at the edge, before any job starts
            self.engine_config(algorithm, self.seeds[0] if self.seeds else 0)

    def engine_config(self, algorithm: str, seed: int) -> TrainConfig:
        """The validated configuration one job will run with."""
        values = {**self.options, "algorithm": algorithm, "seed": seed,
                  "data": self.data, "out": self.run_dir(algorithm, seed),
                  "centers": list(self.centers)}
        try:
            return TrainConfig(**values)
        except ValidationError as error:
            reasons = "; ".join(
                f"{'.'.join(map(str, item['loc']))}: {item['msg']}" for item in error.errors()
            )
            raise ConfigError(f"train.options: {reasons}") from None

    def run_dir(self, algorithm: str, seed: int) -> Path:
        return self.runs / algorithm / f"seed_{seed}"

    def jobs(self) -> list[TrainingJob]:
        """One job per (algorithm, seed), in the paper's order of methods."""
        return [
            TrainingJob(
                algorithm=algorithm,
                seed=seed,
                data=self.data,
                out=self.run_dir(algorithm, seed),
                centers=tuple(self.centers),
                options=dict(self.options),
            )
            for algorithm in self.algorithms
            for seed in self.seeds
        ]


class ReportConfig(BaseModel):
    """The ``report:`` section (the methods and seeds come from ``train:``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runs: Path = Field(Path("runs"), description="the training runs to report on")
    out: Path = Field(Path("results"), description="tables, metrics.json, curves and plots")
    algorithms: list[Algorithm] = Field(list(ALGORITHMS), description="methods to report")
    seeds: list[int] = Field([0], description="seeds to report")


def load_section(path: Path, section: str) -> dict[str, Any]:
    """One top-level section of a YAML parameters file (empty when the file is absent)."""
    if not path.is_file():
        return {}
    content = yaml.safe_load(path.read_text()) or {}
    values = dict(content.get(section) or {})
    if section == "preprocess" and "data_root" not in values:
        root = (content.get("data") or {}).get("root")
        if root is not None:
            values["data_root"] = root
    if section == "report":
        train = content.get("train") or {}
        for key in ("runs", "algorithms", "seeds"):
            if key in train and key not in values:
                values[key] = train[key]
    return values


def _flag_type(annotation: Any) -> tuple[Any, dict[str, Any]]:
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin is Annotated:
        return _flag_type(args[0])
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _flag_type(args[0])
    if origin in (typing.Union, types.UnionType):  # e.g. a number or one per centre
        return str, {"nargs": "+"}
    if origin is list:
        kind, extra = _flag_type(args[0])
        return kind, {**extra, "nargs": "+"}
    if origin is Literal:
        return str, {"choices": list(typing.get_args(annotation))}
    if annotation is bool:
        return None, {"action": argparse.BooleanOptionalAction}
    return annotation, {}


def add_model_flags(
    parser: argparse.ArgumentParser,
    model: type[BaseModel],
    exclude: frozenset[str] = frozenset(),
) -> None:
    """One ``--flag`` per model field; defaults are resolved later from the params file."""
    for name, info in model.model_fields.items():
        if name in exclude:
            continue
        kind, extra = _flag_type(info.annotation)
        if kind is not None:
            extra["type"] = kind
        default = info.default if not isinstance(info.default, list) else " ".join(
            map(str, info.default)
        )
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=None,
            help=f"{info.description or name} (default: params.yaml, else {default})",
            **extra,
        )


def resolve(
    model: type[Model], args: argparse.Namespace, params_file: Path, section: str
) -> Model:
    """The section from ``params_file`` with every flag given on the command line on top."""
    values = load_section(params_file, section)
    values.update(
        {name: getattr(args, name) for name in model.model_fields if getattr(args, name, None)
         is not None}
    )
    return model(**values)


__all__ = [
    "ConfigError",
    "PreprocessConfig",
    "ReportConfig",
    "TrainFlowConfig",
    "ValidationError",
    "add_model_flags",
    "load_section",
    "resolve",
]
