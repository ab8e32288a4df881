"""Training tasks: one MPI job per (algorithm, seed), its ranks' lines in the run's log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import Task, task
from prefect.client.schemas.objects import State, TaskRun
from prefect.logging import get_run_logger

from proxyfl.launch import TrainingJob, TrainingJobFailed, run_job
from proxyfl.validation import EXIT_BAD_INPUT


def worth_retrying(task: Task[..., Any], task_run: TaskRun, state: State) -> bool:
    """A job that failed on bad input (exit 2) fails the same way again; others (a killed
    rank, a lost node, out of memory) may go through when resumed."""
    try:
        state.result()
    except TrainingJobFailed as error:
        return error.exit_code != EXIT_BAD_INPUT
    except Exception:
        return True
    return False


@task(name="training run", task_run_name="{job.algorithm} seed {job.seed}",
      retry_condition_fn=worth_retrying)  # fmt: skip
def training_run(job: TrainingJob) -> Path:
    """``job.out`` holding metrics.jsonl and run.json; raises ``TrainingJobFailed``. Its
    job resumes (``job.config.resume``), so a retry continues where the last try stopped."""
    logger = get_run_logger()
    logger.info("%s seed %d: %d rank(s) -> %s", job.algorithm, job.seed, job.ranks, job.out)
    run_job(job, on_line=logger.info)
    return job.out
