"""Stage flow: each centre's own models map its test slides, class the nodes, stage patients.

Every method's node accuracy, slide AUC and pN-stage kappa, from its models' calls.

    per centre c (each within STAGING/center_c/, the stage's out):
      staging models -> centre slides -> maps of each slide (a task per slide: one read,
      every model) -> centre calls: STAGING/center_c/calls.json and the test slides' maps
    staging summary -> results/staging.json (stage.summary)

    python -m flows.stage                    # every centre of train.centers, then the summary
    python -m flows.stage --centers 0 --step centres   # one centre (dvc.yaml's stage@0)
    python -m flows.stage --step summary     # the centres' calls summarised (dvc: staging)
    python -m flows.stage --batch-size 1024 --device cuda

The runs are those ``train:`` lists (finished, with their kept models); each centre's
slides are those of its patients in ``data.root`` whose store (``preprocess.out``) puts
them in its test split: each is staged at the lesion threshold its centre's other test
patients choose (cross-fitted, :mod:`analysis.staging.centre`). A centre whose models,
slides, store, settings and code are those recorded when it was last staged is kept
(:mod:`analysis.staging.freshness`). Every number comes from ``params.yaml``'s ``stage:``
section (the node rule's thresholds are Camelyon-17's), and every flag overrides one. A
slide that cannot be read is recorded in its centre's calls (and the summary) and the
rest are staged. Prints the staging table. Exits 1 when a run keeps no model or a store
is missing, 2 on a bad parameter or a file that does not verify.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger

from analysis.report.staging import staging_table
from analysis.staging.models import StagingModelError
from camelyon_proxyfl.params.base import ParamsCommand
from camelyon_proxyfl.params.stage import StageSection
from camelyon_proxyfl.params.staging import StagingParams
from flows.server import run_flow_command
from plumbing.cli import exit_on_bad_parameters, refuse_unwritable
from plumbing.processes import start_command
from tasks.stage import (
    centre_calls_file,
    centre_freshness,
    centre_inputs,
    slide_maps,
    staging_models,
    staging_slides,
    staging_summary,
)
from wsi.catalogue import DatasetRootError
from wsi.store.schema import StoreError

Step = Literal["all", "centres", "summary"]


@flow(name="stage")
def staging(params: StagingParams, centers: Sequence[int], step: Step = "all") -> dict[str, Any]:
    """Stage ``centers`` (``step`` all or centres), then summarise every centre of
    ``train.centers`` (all or summary); returns the summary (empty without one)."""
    logger = get_run_logger()
    if step in ("all", "centres"):
        for center in centers:
            slides = staging_slides(params, center)  # the data root and the store first
            models = staging_models(params, center)
            inputs = centre_inputs(params, center, models)
            if not centre_freshness(params.stage.out, inputs).result():  # "Up to date"
                continue  # kept: its models, slides, store, settings and code are recorded
            patients = len({s.patient for s in slides})
            logger.info("centre %d: %d slides of %d test patients, %d models", center,
                        len(slides), patients, len(models))  # fmt: skip
            outcomes = []
            for done, slide in enumerate(slides, start=1):
                outcomes.append(slide_maps(slide, models, params))
                logger.info("centre %d: %d/%d slides mapped", center, done, len(slides))
            path = centre_calls_file(params, models, slides, outcomes, inputs)
            logger.info("centre %d: %s", center, path)
    if step == "centres":
        return {}
    summary = staging_summary(params, params.train.centers)
    logger.info("staging of %d method(s): %s", len(summary["methods"]), params.stage.summary)
    return summary


def parse_config(argv: list[str] | None) -> tuple[StagingParams, list[int], Step]:
    command = ParamsCommand(StagingParams, "python -m flows.stage", __doc__.split("\n")[0], argv)
    for option, key in (("--data-root", ("data", "root")), ("--data", ("preprocess", "out")),
                        ("--runs", ("train", "runs")),
                        ("--algorithms", ("train", "algorithms")),
                        ("--seeds", ("train", "seeds"))):  # fmt: skip
        command.add_key(option, key)
    command.add_section(StageSection, ("stage",))
    command.parser.add_argument(
        "--centers", type=int, nargs="+", metavar="C",
        help="the centres to stage now (default: every centre of train.centers)",
    )  # fmt: skip
    command.parser.add_argument(
        "--step", choices=["all", "centres", "summary"], default="all",
        help="all: stage the centres, then summarise; centres: stage them only; summary: "
        "summarise the centres' calls only",
    )  # fmt: skip
    args, params = command.parse()
    centers = args.centers if args.centers is not None else list(params.train.centers)
    unknown = sorted(set(centers) - set(params.train.centers))
    if unknown:
        command.parser.error(f"--centers {unknown}: not in train.centers {params.train.centers}")
    return params, centers, args.step


@exit_on_bad_parameters
def main(argv: list[str] | None = None) -> int:
    params, centers, step = parse_config(argv)
    written = {"all": ("stage.out", "stage.summary"), "centres": ("stage.out",),
               "summary": ("stage.summary",)}[step]  # fmt: skip
    unwritable = params.stage.unwritable_folders()
    if refuse_unwritable({key: why for key, why in unwritable.items() if key in written}):
        return 2
    outcome: dict[str, Any] = {}

    def run() -> None:
        outcome.update(staging(params, centers, step))

    failures = (DatasetRootError, StagingModelError, StoreError, FileNotFoundError)
    status = run_flow_command(run, failures=failures)
    if status == 0 and outcome:
        print(staging_table(outcome), end="")
        print(f"staging: {Path(params.stage.summary)}")
    return status


if __name__ == "__main__":
    start_command()
    sys.exit(main())
