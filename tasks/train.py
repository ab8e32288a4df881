"""Training tasks: one MPI job per (algorithm, seed), its ranks' lines in the run's log."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.logging import get_run_logger

from proxyfl.launch import TrainingJob, run_job


@task(name="training run", task_run_name="{job.algorithm} seed {job.seed}")
def training_run(job: TrainingJob) -> Path:
    """``job.out`` holding metrics.jsonl and run.json; raises ``TrainingJobFailed``."""
    logger = get_run_logger()
    logger.info("%s seed %d: %d rank(s) -> %s", job.algorithm, job.seed, job.ranks, job.out)
    run_job(job, on_line=logger.info)
    return job.out
