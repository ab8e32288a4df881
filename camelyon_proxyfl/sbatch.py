"""``camelyon-proxyfl sbatch``: the Slurm batch script that runs the pipeline's training
(or a whole ``dvc repro``, or any command of it) with one task per hospital, written from
``params.yaml`` and the cluster's shape rather than copied from the docs.

The script asks for one task per rank of the largest job (a rank per centre of
``train.centers``), spread over ``--nodes``; with GPUs, one GPU per task (``--gpus-per-task
=1``: Slurm binds each rank to its own) or, with ``--ranks-per-gpu R`` > 1, the node's GPUs
shared by its ranks (``--gpus-per-node``; a rank takes ``local rank mod #GPUs``:
:mod:`proxyfl.engine.runtime`). Before writing it, what can be known is checked: that the
GPUs hold the ranks, that the command will start its ranks with srun (``dvc repro`` reads
``train.launcher`` from the parameters file), and, where ``sinfo`` answers, that a node of
the partition has the CPUs and GPUs a node of the job asks for; Slurm would otherwise queue
the job for ever.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from camelyon_proxyfl.params.base import (
    DEFAULT_PARAMS,
    config_option,
    enter_project,
    from_folder,
    load_sections,
)
from camelyon_proxyfl.params.train import TrainParams
from camelyon_proxyfl.placement import largest_job_ranks
from plumbing.atomic import write_text
from plumbing.cli import EXIT_BAD_PARAMETERS, ConfigError, exit_on_bad_parameters

# the commands that take --launcher; any other (dvc repro, python -m flows.pipeline, ...)
# reads params.yaml's train.launcher
LAUNCHER_FLAG_COMMANDS = (("python", "-m", "flows.train"), ("camelyon-proxyfl", "train"))
DEFAULT_COMMAND = ("python", "-m", "flows.train")
_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$")


class ScriptError(ValueError):
    """The script asked for cannot run as asked: what to change."""


@dataclass(frozen=True, kw_only=True)
class BatchShape:
    """What the job asks Slurm for."""

    ranks: int
    nodes: int = 1
    gpus_per_node: int = 0
    ranks_per_gpu: int = 1
    cpus_per_task: int | None = None
    time: str = "12:00:00"
    partition: str | None = None
    overcommit: bool = False
    job_name: str = "camelyon-proxyfl"

    @property
    def tasks_per_node(self) -> int:
        return math.ceil(self.ranks / self.nodes)

    @property
    def gpus_needed_per_node(self) -> int:
        return math.ceil(self.tasks_per_node / self.ranks_per_gpu) if self.gpus_per_node else 0

    def problems(self) -> list[str]:
        """Why Slurm could not start this job on nodes of ``gpus_per_node`` GPUs."""
        found = []
        if self.nodes > self.ranks:
            found.append(f"--nodes {self.nodes} for {self.ranks} rank(s): a node would idle")
        if self.gpus_needed_per_node > self.gpus_per_node:
            found.append(
                f"{self.tasks_per_node} rank(s) a node at {self.ranks_per_gpu} a GPU need "
                f"{self.gpus_needed_per_node} GPU(s) a node, and a node has "
                f"{self.gpus_per_node}: raise --nodes or --ranks-per-gpu"
            )
        if not _TIME.match(self.time):
            found.append(f"--time {self.time!r}: Slurm's [D-]HH:MM:SS, e.g. 12:00:00")
        return found

    def directives(self) -> list[str]:
        """The script's ``#SBATCH`` lines."""
        options = [f"--job-name={self.job_name}", f"--nodes={self.nodes}", f"--ntasks={self.ranks}",
                   f"--ntasks-per-node={self.tasks_per_node}"]  # fmt: skip
        if self.cpus_per_task is not None:
            options.append(f"--cpus-per-task={self.cpus_per_task}")
        if self.gpus_per_node and self.ranks_per_gpu == 1:
            options.append("--gpus-per-task=1")
        elif self.gpus_per_node:
            options.append(f"--gpus-per-node={self.gpus_needed_per_node}")
        if self.overcommit:
            options.append("--overcommit")
        if self.partition:
            options.append(f"--partition={self.partition}")
        options += [f"--time={self.time}", "--output=slurm-%j.out"]
        return [f"#SBATCH {option}" for option in options]


def with_launcher(command: Sequence[str], launcher: str) -> list[str]:
    """``command`` starting its ranks with srun: ``--launcher srun`` added to the commands
    that take it; any other must read ``train.launcher: srun`` from the parameters file
    (:class:`ScriptError` otherwise)."""
    words = list(command)
    takes_flag = any(tuple(words[: len(prefix)]) == prefix for prefix in LAUNCHER_FLAG_COMMANDS)
    if takes_flag:
        return words if "--launcher" in words else [*words, "--launcher", "srun"]
    if launcher != "srun":
        raise ScriptError(
            f"`{shlex.join(words)}` starts the ranks as the parameters file says, and its "
            f"train.launcher is {launcher}: set train.launcher: srun there, so that each job "
            "is a step of the allocation"
        )
    return words


def script(shape: BatchShape, repository: Path, command: Sequence[str]) -> str:
    """The batch script: ``#SBATCH`` lines, then ``command`` in ``repository`` with its
    virtual environment."""
    lines = [
        "#!/bin/bash",
        f"# written by camelyon-proxyfl sbatch: {shape.ranks} rank(s), one Slurm task each",
        *shape.directives(),
        "set -euo pipefail",
        f"cd {shlex.quote(str(repository))}",
        "source .venv/bin/activate",
        shlex.join(command),
    ]
    return "\n".join(lines) + "\n"


def partition_nodes(partition: str | None) -> list[tuple[int, int]] | None:
    """(CPUs, GPUs) of each node of ``partition`` (the default one when ``None``), as
    ``sinfo`` says; ``None`` where there is no ``sinfo`` or it does not answer."""
    if shutil.which("sinfo") is None:
        return None
    selected = ["--partition", partition] if partition else []
    try:
        shown = subprocess.run(
            ["sinfo", "--noheader", "--Node", "--format=%P %c %G", *selected],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if shown.returncode != 0:
        return None
    nodes = []
    for line in shown.stdout.splitlines():
        name, cpus, gres = [*line.split(), "", "", ""][:3]
        if partition is None and not name.endswith("*"):
            continue  # the default partition's nodes only
        gpus = sum(int(m.group(1)) for m in re.finditer(r"gpu(?::[^:(,]+)?:(\d+)", gres))
        nodes.append((int(cpus), gpus))
    return nodes


def cluster_problems(shape: BatchShape, nodes: list[tuple[int, int]]) -> list[str]:
    """Why no node of ``nodes`` (:func:`partition_nodes`) can take a node of the job."""
    where = f"partition {shape.partition}" if shape.partition else "the default partition"
    if not nodes:
        return [f"sinfo lists no node in {where}"]
    cpus = shape.tasks_per_node * (shape.cpus_per_task or 1)
    fitting = [n for n in nodes if (shape.overcommit or n[0] >= cpus)
               and n[1] >= shape.gpus_needed_per_node]  # fmt: skip
    if len(fitting) >= shape.nodes:
        return []
    most = max(c for c, _ in nodes)
    return [
        f"a node of the job needs {cpus} CPU(s) and {shape.gpus_needed_per_node} GPU(s), and "
        f"{len(fitting)} of the {len(nodes)} node(s) of {where} have them (at most {most} "
        f"CPUs): Slurm would queue the job for ever. Raise --nodes, lower --cpus-per-task, or "
        "--overcommit to share a node's CPUs"
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="camelyon-proxyfl sbatch",
        description="Write the Slurm batch script of the training: a task per hospital, "
        "checked against params.yaml and the cluster (sinfo). Submit it with sbatch.",
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_PARAMS, metavar="PARAMS",
                        help="parameters file (its train.centers: the ranks)")  # fmt: skip
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=0, help="0: CPU only")
    parser.add_argument("--ranks-per-gpu", type=int, default=1)
    parser.add_argument("--cpus-per-task", type=int, default=None,
                        help="CPUs of each rank (default: Slurm's, one)")  # fmt: skip
    parser.add_argument("--time", default="12:00:00", help="[D-]HH:MM:SS")
    parser.add_argument("--partition", default=None, help="default: the cluster's default")
    parser.add_argument("--overcommit", action="store_true",
                        help="more ranks than CPUs: they share the cores (a try-out)")  # fmt: skip
    parser.add_argument("--job-name", default="camelyon-proxyfl")
    parser.add_argument("--repository", type=Path, default=Path.cwd(),
                        help="where the job runs: this repository, at the same path on the "
                        "nodes (default: the folder of params.yaml)")  # fmt: skip
    parser.add_argument("--no-cluster-check", action="store_true",
                        help="do not ask sinfo whether a node can take the job")  # fmt: skip
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="write the script there (default: standard output)")  # fmt: skip
    parser.add_argument("command", nargs="*", default=list(DEFAULT_COMMAND),
                        help="what the job runs, after -- (default: "
                        f"{shlex.join(DEFAULT_COMMAND)})")  # fmt: skip
    return parser


@exit_on_bad_parameters
def main(argv: Sequence[str] | None = None) -> int:
    started_in = enter_project(argv)  # the repository: where params.yaml is, from below
    args = _parser().parse_args(argv)
    args.output = from_folder(started_in, args.output)
    path, required = config_option(argv)
    train = load_sections(TrainParams, path, required=required).train
    for name in ("nodes", "ranks_per_gpu"):
        if getattr(args, name) < 1:
            raise ConfigError("command line", f"--{name.replace('_', '-')} must be at least 1")
    if args.gpus_per_node < 0 or (args.cpus_per_task is not None and args.cpus_per_task < 1):
        raise ConfigError("command line", "--gpus-per-node >= 0 and --cpus-per-task >= 1")
    shape = BatchShape(
        ranks=largest_job_ranks(train), nodes=args.nodes, gpus_per_node=args.gpus_per_node,
        ranks_per_gpu=args.ranks_per_gpu, cpus_per_task=args.cpus_per_task, time=args.time,
        partition=args.partition, overcommit=args.overcommit, job_name=args.job_name,
    )  # fmt: skip
    problems = shape.problems()
    try:
        command = with_launcher(args.command, train.launcher)
    except ScriptError as error:
        problems.append(str(error))
    if not problems and not args.no_cluster_check:
        nodes = partition_nodes(args.partition)
        problems += cluster_problems(shape, nodes) if nodes is not None else []
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_BAD_PARAMETERS
    text = script(shape, args.repository.resolve(), command)
    if args.output is None:
        sys.stdout.write(text)
    else:
        write_text(args.output, text)
        args.output.chmod(0o755)
        print(f"{args.output}: sbatch {args.output} submits it", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
