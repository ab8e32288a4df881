"""``params.yaml``, one pydantic model per section, nested as the file is.

    data:        DataSection        (root; synth: wsi.synth's settings)
    preprocess:  PreprocessSection  (wsi.patches.PatchParams + wsi.center.SamplingRules + ...)
    train:       TrainSection       (options: proxyfl.config.TrainOptions)
    report:      ReportSection

Every default and help text is a field of these models (or of the library models they
are made of), defined once; every command line is generated from them
(:mod:`plumbing.cli`). The defaults are the paper's configuration; ``params.yaml`` is the
demo's. Unknown sections and keys are errors, never silently ignored.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from plumbing.cli import (
    ConfigError,
    Flag,
    KeyPath,
    add_field_flag,
    add_model_flags,
    given,
    layered,
    read_yaml,
    validate,
)
from proxyfl.config import TrainConfig, TrainOptions
from proxyfl.names import PAPER_ALGORITHMS, Algorithm
from wsi.params import PatchParams, SamplingParams, SamplingRules
from wsi.synth.config import SynthSettings

DEFAULT_PARAMS = Path("params.yaml")
# The embedded synthetic dataset's root: `dvc.yaml`'s synth stage writes it there, and the
# pipeline flow writes it when data.root is this directory and it is absent.
SYNTHETIC_ROOT = Path("data/synthetic")
DATA_ROOT_FIX = (
    "set data.root in the parameters file (or --data-root) to your copy of the Camelyon-17 "
    f'training set (README: "Real data"), or to {SYNTHETIC_ROOT} for the embedded '
    "synthetic dataset"
)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataSection(Section):
    """``data:``: where the Camelyon-17 dataset is, and how the synthetic one is made."""

    root: Path = Field(
        SYNTHETIC_ROOT,
        description="dataset root (center_*/, lesion_annotations/, stage_labels.csv); "
        f"{SYNTHETIC_ROOT} is the embedded synthetic dataset, written from data.synth",
    )
    synth: SynthSettings = Field(
        default_factory=SynthSettings, description="the embedded synthetic dataset"
    )

    @property
    def is_synthetic(self) -> bool:
        """Whether ``root`` is the embedded synthetic dataset (relative to the working
        directory, as every path of the parameters file)."""
        return self.root.resolve() == SYNTHETIC_ROOT.resolve()


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
    workers: int = Field(2, ge=1, description="parallel processes for per-slide work")
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


class TrainSection(Section):
    """``train:``: which runs to launch, and the options every one of them trains with."""

    algorithms: list[Algorithm] = Field(
        list(PAPER_ALGORITHMS),
        description="methods to train (PrivateKT also reads the store of "
        "train.options.public_center)",
    )
    seeds: list[int] = Field([0], description="seeds; every method runs once per seed")
    centers: list[int] = Field([0, 1, 2, 3], description="the clients' centres")
    data: Path = Field(Path("data/patches"), description="directory of the centre stores")
    runs: Path = Field(Path("runs"), description="runs land in RUNS/{algorithm}/seed_{s}")
    options: TrainOptions = Field(
        default_factory=TrainOptions, description="how every client trains"
    )
    hosts: list[str] = Field(
        [],
        description="machines the ranks run on (hydra's mpiexec -hosts, over ssh; NAME:N "
        "puts N ranks on one; run directory and stores at the same paths on each). Empty: "
        "this machine only, and nothing of a job listens on a network socket",
    )
    retries: int = Field(
        1, ge=0,
        description="times a failed job is launched again, resuming from its last round "
        "that every rank completed (bad input, exit 2, is not retried)",
    )  # fmt: skip

    @field_validator("hosts")
    @classmethod
    def _host_names(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            if not re.fullmatch(r"[A-Za-z0-9_.\-]+(:[1-9][0-9]*)?", host):
                raise ValueError(f"{host!r} is not a host name, or NAME:N with N ranks on it")
        return hosts

    @model_validator(mode="after")
    def _every_job_is_valid(self) -> TrainSection:
        for algorithm in self.algorithms:  # fail at the edge, before any job starts
            self.job_config(algorithm, self.seeds[0] if self.seeds else 0)
        return self

    def run_dir(self, algorithm: str, seed: int) -> Path:
        return self.runs / algorithm / f"seed_{seed}"

    def job_config(self, algorithm: str, seed: int) -> TrainConfig:
        """The validated configuration one job will run with. It always resumes: a run
        directory left by a killed or failed attempt continues from its last round that
        every rank completed (one without checkpoints starts from round 1)."""
        return TrainConfig(
            **self.options.model_dump(), algorithm=algorithm, seed=seed, data=self.data,
            out=self.run_dir(algorithm, seed), centers=list(self.centers), resume=True,
        )  # fmt: skip

    def job_configs(self) -> list[TrainConfig]:
        """One job per (algorithm, seed), in the paper's order of methods."""
        return [self.job_config(algorithm, seed)
                for algorithm in self.algorithms for seed in self.seeds]  # fmt: skip


class ReportSection(Section):
    """``report:``: where the tables, metrics, curves and plots go."""

    out: Path = Field(Path("results"), description="tables/, metrics.json, curves/, plots/")
    other_configurations: Literal["refuse", "separate"] = Field(
        "refuse",
        description="a listed run made with other parameters than train's (or stopped at "
        "another round): refuse the report, naming it, or table it apart, labelled with its "
        "parameters (separate); never mixed into a row",
    )


class ReportConfig(Section):
    """What the report flow runs with: the runs ``train:`` describes (and the parameters
    they must have been made with), and ``report:``."""

    train: TrainSection = Field(description="the runs to report on, and their parameters")
    out: Path = Field(description="tables, metrics.json, curves and plots (report.out)")
    other_configurations: Literal["refuse", "separate"] = Field(
        "refuse", description="report.other_configurations"
    )

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


class Params(Section):
    """A whole parameters file."""

    data: DataSection = Field(default_factory=DataSection)
    preprocess: PreprocessSection = Field(default_factory=PreprocessSection)
    train: TrainSection = Field(default_factory=TrainSection)
    report: ReportSection = Field(default_factory=ReportSection)

    def preprocess_config(self) -> PreprocessConfig:
        return PreprocessConfig(**dict(self.preprocess), data_root=self.data.root)

    def report_config(self) -> ReportConfig:
        return ReportConfig(train=self.train, out=self.report.out,
                            other_configurations=self.report.other_configurations)  # fmt: skip

    def check_pipeline(self, source: Path | str) -> None:
        """The stages must fit together: training reads the stores preprocessing writes."""
        problems = []
        if self.train.data.resolve() != self.preprocess.out.resolve():
            problems.append(
                f"train.data: {self.train.data} must be preprocess.out ({self.preprocess.out}): "
                f"training reads the stores preprocessing writes"
            )
        missing = sorted(set(self.train.centers) - set(self.preprocess.centers))
        if missing:
            problems.append(f"train.centers: {missing} are not in preprocess.centers")
        public = self.train.options.public_center
        if "PrivateKT" in self.train.algorithms and public not in self.preprocess.centers:
            problems.append(
                f"train.algorithms: PrivateKT reads centre {public}'s store as its public "
                f"pool (train.options.public_center), which preprocess.centers does not build"
            )
        if problems:
            raise ConfigError(source, "; ".join(problems))


# --------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------


def config_option(argv: Sequence[str] | None) -> tuple[Path, bool]:
    """The ``--config`` file of ``argv`` (default ``params.yaml``) and whether it was given."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--config", type=Path, default=None)
    known, _ = early.parse_known_args(argv)
    return (known.config or DEFAULT_PARAMS), known.config is not None


class ParamsCommand:
    """A command whose flags set keys of a parameters file.

    >>> command = ParamsCommand("python -m flows.preprocess", __doc__, argv)
    >>> command.add_section(PreprocessSection, ("preprocess",))
    >>> command.add_key("--data-root", ("data", "root"))
    >>> args, params = command.parse()
    """

    def __init__(self, prog: str, description: str, argv: Sequence[str] | None) -> None:
        self.argv = argv
        self.params_file, explicit = config_option(argv)
        asking_for_help = argv is not None and bool({"-h", "--help"} & set(argv))
        try:
            self.document = read_yaml(self.params_file, required=explicit)
        except ConfigError:
            if not asking_for_help:
                raise
            self.document = {}
        self.parser = argparse.ArgumentParser(prog=prog, description=description)
        self.parser.add_argument(
            "--config", type=Path, default=DEFAULT_PARAMS, metavar="PARAMS",
            help="parameters file; flags override its keys (default: params.yaml where it "
            "exists, else the built-in defaults, the paper's)",
        )  # fmt: skip
        self.flags: list[Flag] = []

    def add_section(
        self,
        model: type[BaseModel],
        key: KeyPath,
        *,
        exclude: Sequence[str] = (),
        group: str | None = None,
    ) -> None:
        """A flag for each field of ``model``, the section at ``key``."""
        parser = self.parser.add_argument_group(group) if group else self.parser
        self.flags += add_model_flags(
            parser,
            model,
            key,
            exclude=exclude,
            current=self.section(*key),
            source=str(self.params_file),
        )

    def add_key(self, option: str, key: KeyPath) -> None:
        """A flag for one key of another section (``--data-root`` for ``data.root``)."""
        model: Any = Params
        for part in key[:-1]:
            model = model.model_fields[part].annotation
        self.flags.append(add_field_flag(self.parser, option, key, model.model_fields[key[-1]],
                                         current=self.section(*key[:-1]),
                                         source=str(self.params_file)))  # fmt: skip

    def section(self, *key: str) -> Mapping[str, Any]:
        """The file's values at ``key`` (for the help texts)."""
        level: Any = self.document
        for part in key:
            level = level.get(part) if isinstance(level, Mapping) else None
        return level if isinstance(level, Mapping) else {}

    def parse(self) -> tuple[argparse.Namespace, Params]:
        """The parsed flags and the whole file validated with them laid over it."""
        args = self.parser.parse_args(self.argv)
        values = given(args, self.flags)
        merged = layered(self.document, values)
        return args, validate(Params, merged, self.params_file, values)


def load_params(path: Path = DEFAULT_PARAMS, *, required: bool = True) -> Params:
    """The parameters file at ``path``, validated; a :class:`ConfigError` otherwise."""
    return validate(Params, read_yaml(path, required=required), path)
