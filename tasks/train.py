"""Training tasks: one MPI job per (algorithm, seed), its ranks' lines in the run's log."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from prefect import Task, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.client.schemas.objects import State, TaskRun
from prefect.logging import get_run_logger

from plumbing.locks import Busy, exclusive
from plumbing.refusals import EXIT_REFUSED
from proxyfl.engine.validation import EXIT_BAD_INPUT
from proxyfl.launch.hosts import HostLostError
from proxyfl.launch.job import JOB_LOG, TrainingJob, TrainingJobFailed, launch_planned
from proxyfl.launch.progress import RankLineParser, RoundProgress
from proxyfl.launch.rundir import Action, LaunchPlan, RunConflict, plan_launch
from wsi.store.schema import StoreError


def worth_retrying(task: Task[..., Any], task_run: TaskRun, state: State) -> bool:
    """A job that failed on bad input (exit 2) or that the machine refused (exit 3: a full
    disk, a read-only folder) fails the same way again; others (a killed rank, a lost node)
    may go through when resumed."""
    try:
        state.result()
    except TrainingJobFailed as error:
        return error.exit_code not in (EXIT_BAD_INPUT, EXIT_REFUSED)
    except (RunConflict, StoreError, Busy, HostLostError):  # the same again
        return False
    except Exception:
        return True
    return False


@task(name="training run", task_run_name="{job.algorithm} seed {job.seed}",
      retry_condition_fn=worth_retrying)  # fmt: skip
def training_run(job: TrainingJob, replace: bool = False) -> Path:
    """``job.run_dir`` holding metrics.jsonl and run.json; raises ``TrainingJobFailed``, or
    ``RunConflict`` for a run of another configuration there without ``replace``
    (:func:`proxyfl.launch.rundir.plan_launch`: a finished run of this configuration is kept, a
    replaced one stays until its successor has finished). Its job resumes
    (``job.config.resume``), so a retry continues where the last try stopped.

    The ranks' lines reach the run's log at their own level (one timestamp: Prefect's); a
    progress artifact (key ``training-{algorithm}-seed-{s}``) follows the rounds."""
    logger = get_run_logger()
    name = f"{job.algorithm} seed {job.seed}"
    with exclusive([job.run_dir], "training into"):  # one launch per run directory
        plan = plan_launch(job.config, replace)
        logger.info("%s: %s: %s", name, job.run_dir, plan.reason)
        if plan.action is not Action.KEEP:
            _launch(job, plan, name)
    return job.run_dir


def _launch(job: TrainingJob, plan: LaunchPlan, name: str) -> None:
    logger = get_run_logger()
    logger.info("%s: %d rank(s) -> %s", name, job.ranks, plan.work)
    logger.info("launch command: %s", shlex.join(job.in_directory(plan.work).command()))
    artifact = create_progress_artifact(
        0.0, key=f"training-{job.algorithm.lower()}-seed-{job.seed}",
        description=f"{name}: starting {job.ranks} rank(s)",
    )  # fmt: skip
    parser = RankLineParser()

    def forward(line: str) -> None:
        parsed = parser.parse(line)
        logger.log(parsed.level, "%s", parsed.text)

    def on_round(progress: RoundProgress) -> None:
        logger.info("%s %s", name, progress.line())
        update_progress_artifact(artifact, progress.percent, f"{name}: {progress.line()}")

    try:
        launch_planned(job, plan, on_line=forward, on_round=on_round)
    except TrainingJobFailed as error:
        who = f"rank {error.rank}" if error.rank is not None else "the job"
        logger.error("%s: %s failed (exit code %d); see %s", name, who, error.exit_code,
                     error.job.run_dir / JOB_LOG)  # fmt: skip
        raise
