"""``train:``: which runs to launch and how every one trains; and the train stage's view
of the file (``train`` only)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from camelyon_proxyfl.params.base import Section, StageParams
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
            run_dir=self.run_dir(algorithm, seed), centers=list(self.centers), resume=True,
            eval_centers=list(self.eval_centers) or None,
            ranks=(min(self.ranks, len(self.centers))
                   if self.ranks is not None and algorithm != "Joint" else None),
        )  # fmt: skip

    def job_configs(self) -> list[TrainConfig]:
        """One job per (algorithm, seed), in the paper's order of methods."""
        return [self.job_config(algorithm, seed)
                for algorithm in self.algorithms for seed in self.seeds]  # fmt: skip


class TrainParams(StageParams):
    """What ``python -m flows.train`` reads of a parameters file."""

    train: TrainSection = Field(default_factory=TrainSection)
