"""Preprocessing flow: Camelyon-17 slides -> balanced, patient-disjoint HDF5 stores per centre.

    slide catalogue [-> dropped candidates of --redo-slides]
                    -> slide candidates (one task per slide, in parallel)
                    -> center store (one task per centre) -> patch summary

    python -m flows.preprocess --data-root ROOT --out OUT --centers 0 1 2 3
    python -m flows.preprocess --patch-size 256 --patches-per-class 12 --seed 3 --workers 2
    python -m flows.preprocess --centers 2 --redo-slides patient_041_node_2

Defaults come from ``params.yaml`` (section ``preprocess:``); every flag overrides one.
``--redo-slides`` is an action, not a parameter: it drops those slides' cached candidates
so they are recomputed, and the stores of ``--centers`` are rebuilt.
Every centre is checked against its ``patches_per_class`` before any store is written;
exits 1 when a centre cannot be built (or, with ``--strict``, on any slide or catalogue
failure), 2 on a bad parameter, a folder it writes that cannot be written, or a
``--redo-slides`` id that is not a labelled slide of ``--centers``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

from prefect import flow
from prefect.futures import PrefectFuture, wait
from prefect.logging import get_run_logger
from prefect.task_runners import TaskRunner
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from camelyon_proxyfl.params.base import ParamsCommand
from camelyon_proxyfl.params.preprocess import (
    PreprocessConfig,
    PreprocessParams,
    PreprocessSection,
)
from flows.artifacts import publish_failures, publish_table_1
from flows.inline import InlineTaskRunner
from flows.processes import ParentBoundProcessPool
from flows.server import address_towards, run_flow_command, shared_prefect_api
from plumbing.atomic import remove_stale_temporaries
from plumbing.cli import exit_on_bad_parameters, refuse_unwritable
from plumbing.locks import Busy, exclusive
from plumbing.processes import start_command
from plumbing.refusals import EXIT_REFUSED
from tasks.data import require_dataset
from tasks.preprocess import (
    REFUSED,
    center_store,
    dropped_candidates,
    patch_summary,
    slide_candidates,
    slide_catalogue,
    store_freshness,
)
from wsi.catalogue import DatasetRootError, SlideRecord, scan_camelyon
from wsi.freshness import StoreInputs
from wsi.preprocess import group_outcomes, record_failed_center, shortfalls
from wsi.store.schema import store_path
from wsi.summary import (
    TABLE_1_COLUMNS,
    TABLE_1_HEADER,
    CenterReport,
    SlideFailure,
    read_center_reports,
)

T = TypeVar("T")
R = TypeVar("R")


class PreprocessFailed(RuntimeError):
    """Raised at the end of the flow when a centre fell short (or --strict and a slide failed).
    :attr:`exit_status` 3 where the machine refused every centre that failed (no room for
    its store), else 1."""

    def __init__(self, message: str, exit_status: int = 1) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class UnknownSlidesError(ValueError):
    """``redo_slides`` names slides that are not labelled slides of the requested centres."""


def check_slides_known(
    slide_ids: Sequence[str], records: Sequence[SlideRecord], centers: Sequence[int]
) -> None:
    """Raise :class:`UnknownSlidesError` naming every id of ``slide_ids`` that is not a
    labelled slide of ``centers`` among ``records``."""
    wanted = set(centers)
    known = {r.slide_id for r in records if r.center in wanted and r.node_label is not None}
    unknown = [slide_id for slide_id in slide_ids if slide_id not in known]
    if unknown:
        raise UnknownSlidesError(
            f"--redo-slides: {', '.join(unknown)} "
            f"{'is not a labelled slide' if len(unknown) == 1 else 'are not labelled slides'}"
            f" of centres {', '.join(map(str, centers))}"
        )


def _submitted_with_progress(
    submit: Callable[[T], PrefectFuture[R]], items: Sequence[T], description: str
) -> list[PrefectFuture[R]]:
    """``submit(item)`` for each of ``items``, with a progress bar that advances as each
    task finishes; returns once all have, their futures in the items' order. The bar is
    up before the first task starts: an inline runner (:mod:`flows.inline`) finishes each
    task within its ``submit``."""
    columns = (
        *Progress.get_default_columns()[:1],
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, transient=False) as progress:
        bar = progress.add_task(description, total=len(items))
        futures = []
        for item in items:
            future = submit(item)
            future.add_done_callback(lambda _: progress.advance(bar))
            futures.append(future)
        wait(futures)
        # a pool's future wakes its waiters before it runs its callbacks
        progress.update(bar, completed=len(futures))
    return futures


@flow(name="preprocess", log_prints=True)
def preprocess(config: PreprocessConfig, redo_slides: Sequence[str] = ()) -> list[CenterReport]:
    """Build ``config.out/center_{c}.h5`` for every requested centre, with the summary.

    ``redo_slides`` (slide ids of those centres) have their cached candidates dropped
    and recomputed first; it is an action, not a parameter, so it is not in ``config``.
    """
    require_dataset(config.data_root)
    for directory in (config.out, config.cache_dir):  # left by a killed run
        for path in remove_stale_temporaries(directory):
            get_run_logger().info("removed %s, left by a run that was killed", path)
    inputs = current_store_inputs(config)  # before any slide is read for this build
    records, catalogue_failures = slide_catalogue(config.data_root, config.centers)
    if redo_slides:
        check_slides_known(redo_slides, records, config.centers)
        dropped_candidates(redo_slides, config.cache_dir)
    candidate_futures = _submitted_with_progress(
        lambda record: slide_candidates.submit(
            record, config.patch, config.cache_dir, config.backend
        ),
        records,
        "slides",
    )
    outcomes = [future.result() for future in candidate_futures]

    grouped = group_outcomes(records, outcomes, catalogue_failures)
    short = shortfalls(config.centers, grouped.patches, config.sampling)
    for center, reason in short.items():  # not built; the others are
        get_run_logger().error("%s", reason)
        record_failed_center(center, reason, config.out, grouped.failures[center])

    to_build = [center for center in config.centers if center not in short]
    store_futures = _submitted_with_progress(
        lambda center: center_store.submit(
            center,
            grouped.patches[center],
            config.patch,
            config.sampling(center),
            config.out,
            config.backend,
            grouped.failures[center],
            [record for record in records if record.center == center],
            inputs[center],
        ),
        to_build,
        "centre stores",
    )
    failed, refused = dict(short), set()
    for center, future in zip(to_build, store_futures, strict=True):
        outcome = future.result(raise_on_failure=False)
        if isinstance(outcome, BaseException):  # the task itself crashed (e.g. its worker)
            failed[center] = f"{type(outcome).__name__}: {outcome}"
            record_failed_center(center, failed[center], config.out, grouped.failures[center])
        elif outcome.status == "failed":
            failed[center] = outcome.error or "failed"
            if future.state.name == REFUSED:
                refused.add(center)

    rows = patch_summary(config.out, grouped.unplaced)
    reports = read_center_reports(config.out)
    failures = [f for r in reports if r.center in config.centers for f in r.failures]
    failures += grouped.unplaced
    print_summary(rows, failures)
    publish_table_1(rows)
    publish_failures(failures)
    if failed:
        raise PreprocessFailed("; ".join(failed[center] for center in sorted(failed)),
                               EXIT_REFUSED if refused == set(failed) else 1)  # fmt: skip
    if config.strict and failures:
        raise PreprocessFailed(f"{len(failures)} slide or catalogue failure(s) and --strict is set")
    return [report for report in reports if report.center in config.centers]


def current_store_inputs(config: PreprocessConfig) -> dict[int, StoreInputs]:
    """What decides each requested centre's store now (:mod:`wsi.freshness`)."""
    return {
        center: StoreInputs.current(config.data_root, center, config.patch, config.sampling(center))
        for center in config.centers
    }


def stale_stores(config: PreprocessConfig) -> list[int]:
    """The requested centres whose stores must be built: one "store up to date?" task each
    (:func:`tasks.preprocess.store_freshness`), so the UI says which are kept and why the
    others are not."""
    inputs = current_store_inputs(config)
    futures = [store_freshness.submit(c, config.out, inputs[c]) for c in config.centers]
    return [center for center, future in zip(config.centers, futures, strict=True)
            if future.result()]  # fmt: skip


def print_summary(rows: list[dict[str, object]], failures: list[SlideFailure]) -> None:
    """Table 1 (patches per centre, split and label) and the failures, on the terminal."""
    table = Table(title="Patches per centre (Table 1)")
    for column in TABLE_1_HEADER:
        table.add_column(column, justify="left" if column in ("split", "patients") else "right")
    for row in rows:
        table.add_row(*(str(row[key]) for key in TABLE_1_COLUMNS))
    console = Console()
    console.print(table)
    for failure in failures:
        console.print(f"[red]failed[/red] {failure.slide} at {failure.stage}: {failure.error}")


def task_runner(config: PreprocessConfig) -> TaskRunner:
    """Where the flow's tasks run, by ``config.runner``:

    - ``process``: a pool of ``config.workers`` local processes; with one worker, no pool:
      the tasks run one after the other in this process (:mod:`flows.inline`);
    - ``dask``: the Dask cluster whose scheduler is ``config.scheduler_address``, else a
      local cluster of ``config.workers`` worker processes of one thread each.

    Local workers die with this process, even when it is killed (:mod:`flows.processes`).
    """
    if config.runner == "process":
        if config.workers == 1:
            return InlineTaskRunner()
        return ParentBoundProcessPool(max_workers=config.workers)
    from prefect_dask import DaskTaskRunner  # imports distributed: only when asked for

    if config.scheduler_address:
        return DaskTaskRunner(address=config.scheduler_address)
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": config.workers,
            "threads_per_worker": 1,
            "processes": True,
            # loopback only, every port free (runs side by side would fight over :8787)
            "host": "127.0.0.1",
            "dashboard_address": "127.0.0.1:0",
        }
    )


def run_preprocess(config: PreprocessConfig, redo_slides: Sequence[str] = ()) -> list[CenterReport]:
    """The preprocess flow on ``config``'s runner (:func:`task_runner`).

    Another run building one of the same stores makes this one fail at once
    (:class:`~plumbing.locks.Busy`). The flow and all its workers report to one Prefect
    API: the configured one, else a server started for this run
    (:func:`flows.server.shared_prefect_api`); with a remote Dask scheduler, that server
    listens on the address the scheduler's network reaches.
    """
    host = address_towards(config.scheduler_address) if config.scheduler_address else "127.0.0.1"
    stores = [store_path(config.out, center) for center in config.centers]
    with exclusive(stores, "building"), shared_prefect_api(host):  # one run per store
        flow_run = preprocess.with_options(task_runner=task_runner(config))
        return flow_run(config, redo_slides=tuple(redo_slides))


def parse_config(argv: list[str] | None) -> tuple[PreprocessConfig, tuple[str, ...]]:
    """The ``preprocess:`` section (and ``data.root``) of the parameters file with the flags
    given laid over it, and the slides to redo."""
    command = ParamsCommand(
        PreprocessParams, "python -m flows.preprocess", __doc__.split("\n")[0], argv
    )
    command.add_section(PreprocessSection, ("preprocess",))
    command.add_key("--data-root", ("data", "root"))
    command.parser.add_argument(
        "--redo-slides",
        nargs="+",
        metavar="ID",
        default=[],
        help="drop these slides' cached candidates, recompute them and rebuild the stores "
        "of --centers (an action, not a parameter: not in params.yaml)",
    )
    args, params = command.parse()
    return params.config(), tuple(args.redo_slides)


@exit_on_bad_parameters
def main(argv: list[str] | None = None) -> int:
    config, redo_slides = parse_config(argv)
    if refuse_unwritable(config.unwritable_folders()):
        return 2
    try:  # checked before any flow starts; the flow checks again for other callers
        require_dataset(config.data_root)
        catalogue = scan_camelyon(config.data_root)
        if redo_slides:
            check_slides_known(redo_slides, catalogue.slides, config.centers)
    except (DatasetRootError, UnknownSlidesError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    unknown = [reason for center in config.centers
               if (reason := catalogue.unlabelled_centre_reason(center)) is not None]  # fmt: skip
    for reason in unknown:  # as `pipeline --check` says it, before any work or file
        print(f"error: preprocess.centers: {reason}", file=sys.stderr)
    if unknown:
        return 2
    scheduler = config.scheduler_address
    return run_flow_command(
        lambda: run_preprocess(config, redo_slides=redo_slides),
        failures=(PreprocessFailed, DatasetRootError, Busy),
        host=address_towards(scheduler) if scheduler else "127.0.0.1",
    )


if __name__ == "__main__":
    start_command()
    sys.exit(main())
