"""What a Slurm allocation holds, and what srun says of the tasks it ended.

A job under ``train.launcher: srun`` is one job step of the allocation the flow runs in
(``sbatch``, ``salloc``). Slurm describes the allocation in the environment of every process
of it (``SLURM_JOB_ID``, ``SLURM_JOB_CPUS_PER_NODE``, ``SLURM_CPUS_PER_TASK``,
``SLURM_OVERCOMMIT``); a step of K tasks of c CPUs each fits when

    sum over the allocation's nodes of floor(cpus_n / c) >= K,

or whatever K when the allocation was made with ``--overcommit``. A step that does not fit
is refused by srun at once ("More processors requested than permitted"), a flow's retry
then fails the same way: :meth:`Allocation.refusal` says so before any work, and how to ask
for the allocation the jobs need.

``srun`` of Slurm 22.05 to 23.02 does not take ``--cpus-per-task`` from the allocation
(``SLURM_CPUS_PER_TASK``), only from its own option or ``SRUN_CPUS_PER_TASK``:
:func:`srun_cpus_per_task` passes the allocation's on, so that a script need not. Many
sites' batch templates do it themselves (``export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK``),
which sets it empty where the job asked for no ``--cpus-per-task``; srun then refuses every
step (``Invalid numeric value "" for --cpus-per-task``): :func:`empty_srun_options` finds
such variables, which the launch leaves out, as if unset.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# "2", "2(x3)", "16,8(x2)": CPUs of each node of the allocation, runs of equal ones folded
_CPUS_RUN = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
# srun's words for tasks that ended badly: "srun: error: node0: task 1: Killed",
# "srun: error: node0: tasks 0-1,3: Terminated", "...: task 2: Exited with exit code 3"
_TASKS_ENDED = re.compile(r"^srun: error: (\S+): tasks? ([\d,\-]+): (.+)$")


def _cpus_per_node(folded: str) -> tuple[int, ...]:
    """``SLURM_JOB_CPUS_PER_NODE`` unfolded: ``"16,8(x2)"`` -> ``(16, 8, 8)``."""
    cpus: list[int] = []
    for part in folded.split(","):
        match = _CPUS_RUN.match(part.strip())
        if match is None:
            raise ValueError(f"SLURM_JOB_CPUS_PER_NODE={folded!r}: not Slurm's CPU counts")
        cpus += [int(match.group(1))] * int(match.group(2) or 1)
    return tuple(cpus)


def _task_ids(listed: str) -> list[int]:
    """``"0-1,3"`` -> ``[0, 1, 3]``."""
    ids: list[int] = []
    for part in listed.split(","):
        first, _, last = part.partition("-")
        ids += range(int(first), int(last or first) + 1)
    return ids


@dataclass(frozen=True)
class Allocation:
    """The Slurm allocation this process runs in, as its environment describes it."""

    job_id: str
    cpus_per_node: tuple[int, ...]
    cpus_per_task: int = 1
    overcommit: bool = False

    @classmethod
    def of(cls, environment: Mapping[str, str]) -> Allocation | None:
        """The allocation ``environment`` belongs to; ``None`` outside one (srun then
        makes an allocation for each job step, queued as any job), or where its variables
        are not Slurm's (then srun is left to judge)."""
        job_id = environment.get("SLURM_JOB_ID")
        folded = environment.get("SLURM_JOB_CPUS_PER_NODE")
        per_task = environment.get("SRUN_CPUS_PER_TASK") or environment.get(
            "SLURM_CPUS_PER_TASK", "1"
        )
        if not job_id or not folded or not per_task.isdigit() or int(per_task) < 1:
            return None
        try:
            cpus_per_node = _cpus_per_node(folded)
        except ValueError:
            return None
        return cls(
            job_id=job_id,
            cpus_per_node=cpus_per_node,
            cpus_per_task=int(per_task),
            overcommit=environment.get("SLURM_OVERCOMMIT") == "1",
        )

    @property
    def tasks_that_fit(self) -> int:
        """How many tasks of ``cpus_per_task`` CPUs a step can start at once."""
        return sum(cpus // self.cpus_per_task for cpus in self.cpus_per_node)

    def refusal(self, ranks: int) -> str | None:
        """Why a step of ``ranks`` tasks cannot start in this allocation, and what to ask
        for instead; ``None`` when it can."""
        if self.overcommit or ranks <= self.tasks_that_fit:
            return None
        cpus = "+".join(map(str, self.cpus_per_node))
        return (
            f"Slurm job {self.job_id} holds {cpus} CPU(s), room for {self.tasks_that_fit} "
            f"task(s) of {self.cpus_per_task} CPU(s), and a training job needs {ranks} (a rank "
            f"per centre): srun would refuse its step. Ask for --ntasks={ranks} (with "
            f"--cpus-per-task={self.cpus_per_task} each), or --overcommit to share the CPUs"
        )


def srun_cpus_per_task(environment: Mapping[str, str]) -> list[str]:
    """srun's ``--cpus-per-task`` option for a step of the allocation in ``environment``:
    the allocation's (``SLURM_CPUS_PER_TASK``) where srun would not take it itself (no
    ``SRUN_CPUS_PER_TASK``), else nothing."""
    given = environment.get("SLURM_CPUS_PER_TASK", "")
    if environment.get("SRUN_CPUS_PER_TASK") or not given.isdigit():
        return []
    return [f"--cpus-per-task={given}"]


def empty_srun_options(environment: Mapping[str, str]) -> list[str]:
    """The ``SRUN_*`` variables of ``environment`` set to nothing (or blanks). srun reads
    each as one of its options, and an empty value is no value: it refuses the step
    instead of running as if the variable were unset."""
    return sorted(name for name, value in environment.items()
                  if name.startswith("SRUN_") and not value.strip())  # fmt: skip


def tasks_ended(line: str) -> list[tuple[int, str]]:
    """The tasks a line of srun's says ended badly, and how (``"Killed"``, ``"Exited with
    exit code 3"``); nothing for any other line."""
    match = _TASKS_ENDED.match(line.strip())
    if match is None:
        return []
    return [(task, match.group(3).strip()) for task in _task_ids(match.group(2))]
