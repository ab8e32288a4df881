"""Canary-run tasks: the plan of a method's canary run (its run: tasks.train)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from prefect import task
from prefect.logging import get_run_logger

from camelyon_proxyfl.params.audit import AuditSection
from camelyon_proxyfl.params.train import TrainSection
from plumbing.atomic import write_text
from proxyfl.canaries import CanaryPlan, CanaryPlanError
from wsi.store.reader import PatchSplitReader, read_store_info
from wsi.store.schema import StoreError, store_path


@task(name="canary plan", task_run_name="canaries of {algorithm}")
def canary_plan(audit: AuditSection, train: TrainSection, algorithm: str) -> Path:
    """``CANARY_RUNS/{algorithm}/canaries.json``: the canaries of every client centre and
    their coins, drawn from ``audit.seed`` (the same seed, the same plan)."""
    job = audit.canary_job(train, algorithm)
    labels, classes, sizes = {}, set(), set()
    for center in train.centers:
        path = store_path(train.data, center)
        try:
            attrs = read_store_info(path, splits=("train",), center=center).attrs
        except StoreError as error:
            raise CanaryPlanError(error.subject, error.reason) from None
        classes.add(attrs.n_classes)
        sizes.add(attrs.patch_size)
        reader = PatchSplitReader(path, "train")
        labels[center] = np.asarray(reader.labels)
        reader.close()
    if len(sizes) != 1 or len(classes) != 1:
        raise CanaryPlanError(
            train.data,
            f"the stores of centres {train.centers} disagree: patch sizes {sorted(sizes)}, "
            f"classes {sorted(classes)}",
        )
    try:
        plan = CanaryPlan.draw(labels, audit.canary.count, classes.pop(), sizes.pop(),
                               audit.seed, audit.canary.kind)  # fmt: skip
    except CanaryPlanError as error:
        raise CanaryPlanError("audit.canary.count", str(error)) from None
    assert job.canaries is not None
    write_text(job.canaries, plan.to_json())
    included = sum(sum(s.included) for s in plan.centers.values())
    get_run_logger().info("%s: %d %s canaries per client, %d of %d IN (coins seeded by "
                          "audit.seed %d)", job.canaries, audit.canary.count, plan.kind,
                          included, audit.canary.count * len(plan.centers), audit.seed)  # fmt: skip
    return job.canaries
