"""``train:``: which runs to launch and how every one trains; and the train stage's view
of the file (``train`` only)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails

from camelyon_proxyfl.params.base import Section, StageParams
from plumbing.parameters import distinct
from proxyfl.config import TrainConfig, TrainOptions
from proxyfl.names import PAPER_ALGORITHMS, Algorithm, Launcher


class TrainSection(Section):
    """``train:``: which runs to launch, and the options every one of them trains with."""

    algorithms: list[Algorithm] = Field(
        list(PAPER_ALGORITHMS),
        description="methods to train (PrivateKT also reads the store of "
        "train.options.public_center)",
    )
    seeds: list[int] = Field([0], description="seeds; every method runs once per seed")
    centers: list[int] = Field([0, 1, 2, 3], description="the clients' centres")
    eval_centers: list[int] = Field(
        [], description="centres evaluated on only, not clients (their test splits join "
        "the clients'; none of their training data is read)",
    )  # fmt: skip
    ranks: int | None = Field(
        None, ge=1,
        description="processes (MPI ranks) a job's clients run on, each hosting ⌊C/R⌋ or "
        "⌈C/R⌉ of them in turn; the same bytes whatever the number. Empty: one per client",
    )  # fmt: skip
    data: Path = Field(Path("data/patches"), description="directory of the centre stores")
    runs: Path = Field(Path("runs"), description="runs land in RUNS/{algorithm}/seed_{s}")
    options: TrainOptions = Field(
        default_factory=TrainOptions, description="how every client trains"
    )
    launcher: Launcher = Field(
        "mpiexec",
        description="what starts a job's ranks: mpiexec (this machine, or train.hosts / "
        "train.hostfile over ssh), srun (inside a Slurm allocation, which places the "
        "ranks: one task per rank) or flare (each centre a NVIDIA FLARE site, with its own "
        "certificate, on this machine: docs/sites.md)",
    )
    hosts: list[str] = Field(
        [],
        description="machines the ranks run on (hydra's mpiexec -hosts, over ssh; NAME:N "
        "puts N ranks on one; run directory and stores at the same paths on each). Empty: "
        "this machine only, and nothing of a job listens on a network socket",
    )
    hostfile: Path | None = Field(
        None,
        description="a file naming the machines the ranks run on, one NAME[:N] a line "
        "(hydra's mpiexec -f); instead of train.hosts",
    )
    ssh_timeout_s: int = Field(
        10, ge=1,
        description="seconds each host of train.hosts / train.hostfile other than this "
        "machine has to answer ssh (ConnectTimeout, BatchMode) before any job starts; one "
        "that does not is an error, and nothing is launched",
    )  # fmt: skip
    retries: int = Field(
        1, ge=0,
        description="times a failed job is launched again, resuming from its last round "
        "that every rank completed (bad input, exit 2, is not retried)",
    )  # fmt: skip

    @field_validator("algorithms", "seeds")
    @classmethod
    def _each_once_and_some(cls, value: list, info: ValidationInfo) -> list:
        if not value:
            raise ValueError(f"no {info.field_name}: list at least one (a job runs per "
                             "method and seed)")  # fmt: skip
        return list(distinct(value, info.field_name.removesuffix("s") + "(s)"))

    @field_validator("centers", "eval_centers")
    @classmethod
    def _each_centre_once(cls, value: list[int]) -> list[int]:
        return list(distinct(value, "centre(s)"))

    @field_validator("hosts")
    @classmethod
    def _host_names(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            if not re.fullmatch(r"[A-Za-z0-9_.\-]+(:[1-9][0-9]*)?", host):
                raise ValueError(f"{host!r} is not a host name, or NAME:N with N ranks on it")
        return hosts

    @model_validator(mode="after")
    def _one_placement(self) -> TrainSection:
        if self.hosts and self.hostfile is not None:
            raise ValueError("hosts and hostfile are both set: name the hosts one way, a "
                             "list or a file")  # fmt: skip
        if self.launcher == "flare" and self.ranks is not None and self.ranks < len(self.centers):
            raise ValueError("launcher flare runs a site per centre: several clients a site "
                             "are not built yet; leave ranks unset")  # fmt: skip
        if self.launcher != "mpiexec" and (self.hosts or self.hostfile is not None):
            given = "hosts" if self.hosts else "hostfile"
            where = ("where Slurm's allocation says" if self.launcher == "srun"
                     else "as FLARE sites of this machine")  # fmt: skip
            raise ValueError(f"launcher {self.launcher} runs the ranks {where}: {given} must "
                             "be left unset")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _every_job_is_valid(self) -> TrainSection:
        for algorithm in self.algorithms:  # fail at the edge, before any job starts
            try:
                self.job_config(algorithm, self.seeds[0])
            except ValidationError as error:
                raise ValidationError.from_exception_data(
                    error.title, [_as_train_keys(item) for item in error.errors()]
                ) from None
        return self

    def run_dir(self, algorithm: str, seed: int) -> Path:
        return self.runs / algorithm / f"seed_{seed}"

    def job_config(self, algorithm: str, seed: int) -> TrainConfig:
        """The validated configuration one job will run with. It always resumes: a run
        directory left by a killed or failed attempt continues from its last round that
        every rank completed (one without checkpoints starts from round 1)."""
        return TrainConfig(
            **self.options.model_dump(), algorithm=algorithm, seed=seed, data=self.data,
            run_dir=self.run_dir(algorithm, seed), centers=list(self.centers), resume=True,
            eval_centers=list(self.eval_centers) or None,
            ranks=(min(self.ranks, len(self.centers))
                   if self.ranks is not None and algorithm != "Joint" else None),
        )  # fmt: skip

    def job_configs(self) -> list[TrainConfig]:
        """One job per (algorithm, seed), in the paper's order of methods."""
        return [self.job_config(algorithm, seed)
                for algorithm in self.algorithms for seed in self.seeds]  # fmt: skip


def _as_train_keys(error: Any) -> InitErrorDetails:
    """A job's configuration error (:class:`~proxyfl.config.TrainConfig`, whose fields
    and flags are ``proxyfl.run``'s) at the key of this section that sets it: ``graph`` is
    ``options.graph``; a message of the whole configuration (no key) names its flags'
    keys too, ``--private-model`` as ``train.options.private_model (--private-model)``.
    Each is a value error of its message (any type's, a custom one's included)."""
    loc = tuple(error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    if not loc:
        message = _FLAG.sub(_key_of_flag, message)
    elif loc[0] in TrainOptions.model_fields:
        loc = ("options", *loc)
    return {"type": "value_error", "loc": loc, "input": error["input"],
            "ctx": {"error": ValueError(message)}}  # fmt: skip


_FLAG = re.compile(r"(?<![\w/.:-])--([a-z][a-z0-9-]*)\b")  # a flag, not a path's "--"


def _key_of_flag(match: re.Match[str]) -> str:
    name = match.group(1).replace("-", "_")
    if name in TrainOptions.model_fields:
        return f"train.options.{name} ({match.group(0)})"
    if name in TrainSection.model_fields:
        return f"train.{name} ({match.group(0)})"
    return match.group(0)


class TrainParams(StageParams):
    """What ``python -m flows.train`` reads of a parameters file."""

    train: TrainSection = Field(default_factory=TrainSection)
