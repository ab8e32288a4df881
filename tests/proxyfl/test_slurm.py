"""What a Slurm allocation's environment says (proxyfl.launch.slurm), and the srun command
line built from it; tests/slurm/ runs them on a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxyfl.launch.job import rank_environment
from proxyfl.launch.placement import Placement
from proxyfl.launch.slurm import Allocation, empty_srun_options, srun_cpus_per_task, tasks_ended


@pytest.mark.parametrize(
    ("folded", "per_task", "fit"),
    [("2", None, 2), ("2(x3)", None, 6), ("16,8(x2)", "4", 8), ("3", "2", 1), ("8", "16", 0)],
)
def test_the_tasks_that_fit_are_each_nodes_cpus_over_a_tasks(
    folded: str, per_task: str | None, fit: int
) -> None:
    environment = {"SLURM_JOB_ID": "7", "SLURM_JOB_CPUS_PER_NODE": folded}
    if per_task is not None:
        environment["SLURM_CPUS_PER_TASK"] = per_task
    allocation = Allocation.of(environment)
    assert allocation is not None and allocation.tasks_that_fit == fit
    assert allocation.refusal(fit) is None
    refusal = allocation.refusal(fit + 1)
    assert refusal is not None and f"room for {fit} task(s)" in refusal
    assert f"--ntasks={fit + 1}" in refusal and "--overcommit" in refusal


def test_srun_cpus_per_task_wins_and_overcommit_fits_any_count() -> None:
    environment = {"SLURM_JOB_ID": "7", "SLURM_JOB_CPUS_PER_NODE": "4",
                   "SLURM_CPUS_PER_TASK": "4", "SRUN_CPUS_PER_TASK": "1"}  # fmt: skip
    allocation = Allocation.of(environment)
    assert allocation is not None and allocation.tasks_that_fit == 4
    overcommitted = Allocation.of({**environment, "SLURM_OVERCOMMIT": "1"})
    assert overcommitted is not None and overcommitted.refusal(64) is None


@pytest.mark.parametrize(
    "environment",
    [{}, {"SLURM_JOB_ID": "7"}, {"SLURM_JOB_ID": "7", "SLURM_JOB_CPUS_PER_NODE": "two"},
     {"SLURM_JOB_ID": "7", "SLURM_JOB_CPUS_PER_NODE": "2", "SLURM_CPUS_PER_TASK": "0"}],
)  # fmt: skip
def test_no_allocation_outside_one_or_where_slurms_words_are_not_there(
    environment: dict[str, str],
) -> None:
    assert Allocation.of(environment) is None


def test_the_allocations_cpus_per_task_reach_srun_where_it_would_not_take_them() -> None:
    assert srun_cpus_per_task({}) == []
    assert srun_cpus_per_task({"SLURM_CPUS_PER_TASK": "8"}) == ["--cpus-per-task=8"]
    both = {"SLURM_CPUS_PER_TASK": "8", "SRUN_CPUS_PER_TASK": "8"}
    assert srun_cpus_per_task(both) == []  # srun reads its own variable
    assert srun_cpus_per_task({"SLURM_CPUS_PER_TASK": ""}) == []


def test_an_empty_srun_variable_is_left_out_of_the_launch_as_if_unset(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK`` in a script whose job asked for
    no --cpus-per-task sets it empty: srun would refuse the step, so the launch leaves it
    out (and says so in one line); set, it reaches srun as it is."""
    exported = {"SRUN_CPUS_PER_TASK": "", "SRUN_X": " ", "SRUN_Y": "2", "SLURM_CPUS_PER_TASK": ""}
    assert empty_srun_options(exported) == ["SRUN_CPUS_PER_TASK", "SRUN_X"]
    monkeypatch.setenv("SRUN_CPUS_PER_TASK", "")
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    placement = Placement(launcher="srun")
    with caplog.at_level("INFO", logger="proxyfl.launch.job"):
        environment = rank_environment(placement)
    assert "SRUN_CPUS_PER_TASK" not in environment
    assert "SRUN_CPUS_PER_TASK set but empty: launching as if unset" in caplog.text
    assert placement.command_prefix(2)[:2] == ["srun", "--ntasks=2"]
    monkeypatch.setenv("SRUN_CPUS_PER_TASK", "2")
    assert rank_environment(placement)["SRUN_CPUS_PER_TASK"] == "2"


def test_the_srun_command_line_carries_the_allocations_cpus_per_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SRUN_CPUS_PER_TASK", raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    srun = Placement(launcher="srun")
    assert srun.command_prefix(4) == ["srun", "--ntasks=4", "--mpi=pmi2", "--kill-on-bad-exit=1"]
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "8")
    assert srun.command_prefix(4)[:3] == ["srun", "--ntasks=4", "--cpus-per-task=8"]


def test_srun_lines_name_the_tasks_that_ended_and_how() -> None:
    assert tasks_ended("srun: error: node0: task 1: Killed") == [(1, "Killed")]
    assert tasks_ended("srun: error: gpu-07: tasks 0-2,5: Terminated") == [
        (0, "Terminated"), (1, "Terminated"), (2, "Terminated"), (5, "Terminated")
    ]  # fmt: skip
    assert tasks_ended("srun: error: node0: task 3: Exited with exit code 2") == [
        (3, "Exited with exit code 2")
    ]
    assert tasks_ended("srun: Force Terminated StepId=3.0") == []
    assert tasks_ended("[rank 1] INFO proxyfl.loop: task 1: Killed") == []


def test_the_first_task_srun_says_ended_badly_is_the_cause_not_those_it_stopped(
    tmp_path: Path,
) -> None:
    """srun's --kill-on-bad-exit stops the other tasks with SIGTERM (SIGKILL KillWait s
    later) once one has died or exited non-zero: the first other end is the cause, named as
    its fault record's header names it (``rank R`` where it left none)."""
    from proxyfl.engine.validation import fault_path
    from proxyfl.launch.job import _signal_failure, _SignaledRanks

    signaled = _SignaledRanks("srun")
    for line in ("srun: error: node0: tasks 0,2: Terminated",
                 "srun: error: node0: task 1: Bus error",
                 "srun: error: node0: task 3: Exited with exit code 1"):  # fmt: skip
        signaled.add(line)
    assert signaled.first() == (1, "Bus error")
    code, failure = _signal_failure(tmp_path, 1, "Bus error")
    assert code == 135 and "SIGBUS" in failure.error and failure.rank == 1
    assert failure.client == "rank 1"
    header = fault_path(tmp_path, 1)  # what a hosting rank's FatalSignalRecord leaves
    header.parent.mkdir()
    header.write_text("rank 1 (clients 2, 3)\n")
    assert _signal_failure(tmp_path, 1, "Killed")[1].client == "rank 1 (clients 2, 3)"
    exited = _SignaledRanks("srun")
    for line in ("srun: error: node0: task 0: Exited with exit code 142",
                 "srun: error: node0: task 1: Killed"):  # fmt: skip
        exited.add(line)
    assert exited.first() == (0, "Exited with exit code 142")
    code, failure = _signal_failure(tmp_path, 0, "Exited with exit code 142")
    assert code == 142 and failure.error == "exited with code 142" and failure.rank == 0
    alone = _SignaledRanks("srun")
    alone.add("srun: error: node0: tasks 0-1: Terminated")  # scancel: every task alike
    assert alone.first() == (0, "Terminated")
