"""Fidelity to the paper: the histopathology protocol on the demo's stores, beside Table 2.

Runs all seven methods for several seeds (``--seeds``, default 0 1 2) and enough rounds for
the curves to flatten (``--rounds``, default 15), with every other training option from
``params.yaml`` (``train.options``), on the stores of ``train.data`` (``make fidelity``
builds them first with ``dvc repro preprocess``; ``make demo`` leaves them there). Then it
prints our final-round accuracy and macro-accuracy (mean ± std over clients × seeds) beside
the paper's Table 2, the rank of every method in both, and Kendall's τ between our mean
accuracies and the paper's (τ = 1: the same ordering of the seven methods), and writes the
report (tables and Figure 8, ``plots/curves.png``) under ``--out``.

    python -m bench.bench_fidelity [--rounds R] [--seeds S ...] [--out DIR]

A finished run of the same configuration is reused, so an interrupted benchmark continues
where it stopped. About 30 minutes on 2 CPU cores with the defaults.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scipy.stats import kendalltau

from analysis.report import PAPER_ORDER, AccuracyRow, accuracy_table, load_runs, write_report
from camelyon_proxyfl.params.whole import load_params
from proxyfl.config import TrainConfig
from proxyfl.launch.job import TrainingJob, run_job
from proxyfl.results import RUN_FILE
from wsi.store.schema import store_path

REPO = Path(__file__).resolve().parents[1]
IN_DEFAULT_RUN = False  # half an hour: `make fidelity`, not part of `make bench`

# Table 2 of the ProxyFL paper (Nature Communications 2023; ../shared/papers/001_*):
# Camelyon-17, 4 clients, 30 rounds, 15 seeds; mean ± std over clients × seeds.
PAPER_TABLE_2: dict[str, tuple[float, float, float, float]] = {
    "Regular": (0.734, 0.105, 0.703, 0.132),
    "AvgPush": (0.776, 0.080, 0.790, 0.076),
    "CWT": (0.769, 0.087, 0.783, 0.087),
    "FedAvg": (0.786, 0.086, 0.767, 0.109),
    "FML": (0.774, 0.085, 0.770, 0.010),
    "ProxyFL": (0.808, 0.075, 0.811, 0.081),
    "Joint": (0.905, 0.030, 0.913, 0.026),
}

log = logging.getLogger("bench.fidelity")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_fidelity", description=__doc__)
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algorithms", nargs="+", default=list(PAPER_ORDER))
    parser.add_argument("--out", type=Path, default=REPO / "results" / "fidelity")
    return parser


def _finished_with(run_dir: Path, options: dict[str, Any]) -> bool:
    """Has ``run_dir`` a finished run trained with exactly these option values?"""
    try:
        run = json.loads((run_dir / RUN_FILE).read_text())
    except (OSError, ValueError):
        return False
    config = run.get("config", {})
    same = all(config.get(key) == value for key, value in options.items())
    return run.get("status") == "finished" and same


def train_all(
    data: Path,
    runs: Path,
    centers: Sequence[int],
    options: dict[str, Any],
    algorithms: Sequence[str],
    seeds: Sequence[int],
) -> None:
    """One MPI job per (method, seed), skipping those already finished the same way."""
    jobs = [
        TrainingJob(TrainConfig(**options, algorithm=algorithm, seed=seed, data=data,
                                run_dir=runs / algorithm / f"seed_{seed}", centers=list(centers)))
        for seed in seeds
        for algorithm in algorithms
    ]  # fmt: skip
    started = time.perf_counter()
    for number, job in enumerate(jobs, 1):
        if _finished_with(job.run_dir, options):
            print(f"[{number}/{len(jobs)}] {job.algorithm} seed {job.seed}: done before")
            continue
        job_started = time.perf_counter()
        run_job(job, on_line=lambda line: log.debug("%s", line))
        elapsed = time.perf_counter() - started
        print(
            f"[{number}/{len(jobs)}] {job.algorithm} seed {job.seed}: "
            f"{time.perf_counter() - job_started:.0f} s (total {elapsed / 60:.1f} min)",
            flush=True,
        )


def ranks(values: dict[str, float]) -> dict[str, int]:
    """1 for the largest value."""
    order = sorted(values, key=lambda name: -values[name])
    return {name: order.index(name) + 1 for name in values}


def comparison(rows: Sequence[AccuracyRow]) -> tuple[str, float, float]:
    """The side-by-side table (markdown) and Kendall's τ for accuracy and macro-accuracy."""
    ours = {row.algorithm: row for row in rows if row.algorithm in PAPER_TABLE_2}
    names = [name for name in PAPER_ORDER if name in ours]
    our_acc = {n: ours[n].accuracy_mean for n in names}
    paper_acc = {n: PAPER_TABLE_2[n][0] for n in names}
    our_rank, paper_rank = ranks(our_acc), ranks(paper_acc)
    lines = [
        "| Method | Ours: accuracy | Paper | Ours: macro-accuracy | Paper | Rank ours / paper |",
        "| :-- | --: | --: | --: | --: | --: |",
    ]
    for n in names:
        row, paper = ours[n], PAPER_TABLE_2[n]
        lines.append(
            f"| {n} | {row.accuracy_mean:.3f} ± {row.accuracy_std:.3f} "
            f"| {paper[0]:.3f} ± {paper[1]:.3f} "
            f"| {row.macro_accuracy_mean:.3f} ± {row.macro_accuracy_std:.3f} "
            f"| {paper[2]:.3f} ± {paper[3]:.3f} | {our_rank[n]} / {paper_rank[n]} |"
        )
    tau_accuracy = float(kendalltau([our_acc[n] for n in names], [paper_acc[n] for n in names])[0])
    tau_macro = float(
        kendalltau(
            [ours[n].macro_accuracy_mean for n in names], [PAPER_TABLE_2[n][2] for n in names]
        )[0]
    )
    return "\n".join(lines), tau_accuracy, tau_macro


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    train = load_params(args.params).train
    data = REPO / train.data
    centers = list(train.centers)
    missing = [c for c in centers if not store_path(data, c).is_file()]
    if missing:
        print(
            f"error: no stores for centres {missing} in {data}: run `make fidelity` "
            "(or `dvc repro preprocess`) first",
            file=sys.stderr,
        )
        return 2
    options = {**train.options.model_dump(mode="json"), "rounds": args.rounds}
    runs_dir, report_dir = args.out / "runs", args.out / "report"
    print(
        f"fidelity: {len(args.algorithms)} methods x {len(args.seeds)} seeds x "
        f"{args.rounds} rounds on {data} (centres {centers}); runs in {runs_dir}",
        flush=True,
    )
    train_all(data, runs_dir, centers, options, args.algorithms, args.seeds)
    runs = load_runs(runs_dir, args.algorithms, args.seeds)
    paths = write_report(runs, report_dir)
    table, tau_accuracy, tau_macro = comparison(accuracy_table(runs))
    print(f"\nFinal round {args.rounds}, mean ± std over clients × seeds {args.seeds}:\n")
    print(table)
    print(f"\nKendall τ with the paper's ordering: accuracy {tau_accuracy:+.2f}, "
          f"macro-accuracy {tau_macro:+.2f} (7 methods; 1 = same order)")  # fmt: skip
    print(f"report: {paths.accuracy_md}, figure: {paths.curves_png}")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(main())
