"""Preprocessing flow: Camelyon-17 slides -> balanced, patient-disjoint HDF5 stores per centre.

    slide catalogue -> slide candidates (one task per slide, in parallel)
                    -> centre store (one task per centre) -> patch summary

    python -m flows.preprocess --data-root ROOT --out OUT --centers 0 1 2 3
    python -m flows.preprocess --patch-size 256 --patches-per-class 12 --seed 3 --workers 2

Defaults come from ``params.yaml`` (section ``preprocess:``); every flag overrides one.
Exits 1 when a centre cannot supply the requested patches (or, with ``--strict``, on any
slide failure), 2 on a bad parameter.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import defaultdict
from pathlib import Path

from prefect import flow
from prefect.futures import as_completed
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner
from prefect.utilities.annotations import unmapped
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from flows.config import DEFAULT_PARAMS, PreprocessConfig, ValidationError, add_model_flags, resolve
from tasks.preprocess import centre_store, patch_summary, slide_candidates, slide_catalogue
from wsi.center import InsufficientPatchesError
from wsi.preprocess import CenterReport, SlideFailure, read_center_reports
from wsi.sampling import SlidePatches

log = logging.getLogger(__name__)


class PreprocessFailed(RuntimeError):
    """Raised at the end of the flow when a centre fell short (or --strict and a slide failed)."""


def _with_progress(futures: list, description: str) -> list:
    """Results of ``futures`` in submission order, with a progress bar while they finish."""
    results: dict[int, object] = {}
    index = {id(future): i for i, future in enumerate(futures)}
    columns = (*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, transient=False) as progress:
        bar = progress.add_task(description, total=len(futures))
        for future in as_completed(futures):
            results[index[id(future)]] = future
            progress.advance(bar)
    return [results[i] for i in range(len(futures))]


@flow(name="preprocess", log_prints=True)
def preprocess(config: PreprocessConfig) -> list[CenterReport]:
    """Build ``config.out/center_{c}.h5`` for every requested centre, with the summary."""
    records = slide_catalogue(config.data_root, config.centers)
    candidate_futures = slide_candidates.map(
        records, unmapped(config.patch), unmapped(config.cache_dir), unmapped(config.backend)
    )
    outcomes = [f.result() for f in _with_progress(list(candidate_futures), "slides")]

    slide_failures: dict[int, list[SlideFailure]] = defaultdict(list)
    by_center: dict[int, list[SlidePatches]] = defaultdict(list)
    for record, outcome in zip(records, outcomes, strict=True):
        if isinstance(outcome, SlidePatches):
            by_center[record.center].append(outcome)
        else:
            slide_failures[record.center].append(outcome)

    store_futures = [
        centre_store.submit(
            center,
            by_center[center],
            config.patch,
            config.sampling,
            config.out,
            config.backend,
            slide_failures[center],
        )
        for center in config.centers
    ]
    short: list[str] = []
    unplaced: list[SlideFailure] = []  # failures of centres that got no store
    for center, future in zip(
        config.centers, _with_progress(store_futures, "centre stores"), strict=True
    ):
        try:
            future.result()
        except InsufficientPatchesError as error:
            short.append(str(error))
            unplaced.extend(slide_failures[center])

    rows = patch_summary(config.out, unplaced)
    reports = read_center_reports(config.out)
    failures = [f for r in reports if r.center in config.centers for f in r.failures] + unplaced
    print_summary(rows, failures)
    if short:
        raise PreprocessFailed("; ".join(short))
    if config.strict and failures:
        raise PreprocessFailed(f"{len(failures)} slide(s) failed and --strict is set")
    return [report for report in reports if report.center in config.centers]


def print_summary(rows: list[dict[str, object]], failures: list[SlideFailure]) -> None:
    """Table 1 (patches per centre, split and label) and the failures, on the terminal."""
    table = Table(title="Patches per centre (Table 1)")
    for column in ("centre", "split", "healthy", "tumour", "total", "patients"):
        table.add_column(column, justify="left" if column in ("split", "patients") else "right")
    for row in rows:
        table.add_row(*(str(row[key]) for key in
                        ("center", "split", "healthy", "tumor", "total", "patients")))
    console = Console()
    console.print(table)
    for failure in failures:
        console.print(f"[red]failed[/red] {failure.slide} at {failure.stage}: {failure.error}")


def task_runner(workers: int) -> TaskRunner:
    """Per-slide work runs in ``workers`` processes; swap in e.g. prefect-dask's
    ``DaskTaskRunner(address=...)`` here to spread slides over a cluster."""
    return ProcessPoolTaskRunner(max_workers=workers)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Path]:
    parser = argparse.ArgumentParser(
        prog="python -m flows.preprocess",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_PARAMS,
                        help="parameters file whose 'preprocess:' section gives the defaults")
    add_model_flags(parser, PreprocessConfig)
    args = parser.parse_args(argv)
    return args, args.config


def main(argv: list[str] | None = None) -> int:
    args, params_file = parse_args(argv)
    try:
        config = resolve(PreprocessConfig, args, params_file, "preprocess")
    except (ValidationError, ValueError) as error:
        print(f"error: invalid preprocessing parameters: {error}", file=sys.stderr)
        return 2
    if not config.data_root.is_dir():
        print(f"error: data root {config.data_root} is not a directory", file=sys.stderr)
        return 2
    runner = task_runner(config.workers)
    try:
        preprocess.with_options(task_runner=runner)(config)
    except PreprocessFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
