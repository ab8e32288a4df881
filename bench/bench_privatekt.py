"""PrivateKT beside ProxyFL, FedAvg and Regular on the demo's stores, with each one's ε.

Two protocols, one table each:

1. *equal rounds* (``--rounds``, default 15, as ``make fidelity``): every method for
   ``--seeds`` (default 0 1 2) with the training options of ``params.yaml``;
2. *PrivateKT's own pace* (``--long-rounds``, default 150; the authors' notebook runs 500):
   PrivateKT alone, seed 0, its accuracy every ``--every`` rounds — it transfers K labels
   per round, so it needs many more rounds than the methods that exchange models.

Each method's ε is the largest over its clients at the final round, with its notion:
sample-level (ε, δ)-DP of DP-SGD for the three, label-level ε-LDP (per round ε, and T·ε
by basic composition) for PrivateKT. They are different guarantees, never one scale.

    python -m bench.bench_privatekt [--rounds R] [--seeds S ...] [--long-rounds T] [--out DIR]

Needs the stores of ``train.data`` with PrivateKT's public centre (``make demo`` or
``dvc repro preprocess``); finished runs of the same configuration are reused.
About 25 minutes on 2 CPU cores with the defaults.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from bench.bench_fidelity import train_all
from camelyon_proxyfl.params.whole import load_params
from proxyfl.report import accuracy_table, curves, load_runs, write_report
from proxyfl.report.load import RunResult
from proxyfl.results import PRIVACY_NOTIONS
from wsi.store.schema import store_path

REPO = Path(__file__).resolve().parents[1]
IN_DEFAULT_RUN = False  # training for half an hour: named only
METHODS = ("Regular", "FedAvg", "ProxyFL", "PrivateKT")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_privatekt", description=__doc__)
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--long-rounds", type=int, default=150)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--out", type=Path, default=REPO / "results" / "privatekt")
    return parser


def final_epsilon(runs: Sequence[RunResult]) -> dict[str, tuple[float, float | None, str]]:
    """Per method: the largest final-round ε of any client, the per-round ε, the notion."""
    found: dict[str, list[tuple[float, float | None, str]]] = defaultdict(list)
    for run in runs:
        for row in run.primary_rows(run.final_round):
            if row.epsilon is not None:
                found[run.algorithm].append(
                    (row.epsilon, row.epsilon_per_round, row.privacy_notion)
                )  # fmt: skip
    return {method: max(values, key=lambda value: value[0]) for method, values in found.items()}


def equal_rounds_table(runs: Sequence[RunResult]) -> str:
    epsilons = final_epsilon(runs)
    lines = ["| Method | Accuracy | Macro-accuracy | n | max ε | ε per round | Notion |",
             "| :-- | --: | --: | --: | --: | --: | :-- |"]  # fmt: skip
    for row in accuracy_table(runs):
        epsilon, per_round, notion = epsilons[row.algorithm]
        lines.append(
            f"| {row.algorithm} | {row.accuracy_mean:.3f} ± {row.accuracy_std:.3f} "
            f"| {row.macro_accuracy_mean:.3f} ± {row.macro_accuracy_std:.3f} | {row.n} "
            f"| {epsilon:.2f} | {'—' if per_round is None else f'{per_round:g}'} "
            f"| {PRIVACY_NOTIONS[notion]} |"
        )
    return "\n".join(lines)


def pace_table(runs: Sequence[RunResult], every: int) -> str:
    points = curves(runs)["PrivateKT"]
    last = points[-1].round
    lines = ["| Round | Accuracy | Macro-accuracy | ε (label-level LDP, T·ε) |",
             "| --: | --: | --: | --: |"]  # fmt: skip
    epsilon = {row.round: row.epsilon for row in runs[0].primary_rows()}
    for point in points:
        if point.round % every == 0 or point.round in (1, 10, last):
            lines.append(
                f"| {point.round} | {point.accuracy_mean:.3f} ± {point.accuracy_std:.3f} "
                f"| {point.macro_accuracy_mean:.3f} | {epsilon[point.round]:.0f} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    train = load_params(args.params).train
    data = REPO / train.data
    centers = list(train.centers)
    needed = [*centers, train.options.public_center]
    missing = [c for c in needed if not store_path(data, c).is_file()]
    if missing:
        print(f"error: no stores for centres {missing} in {data}: run `make demo` (or "
              "`dvc repro preprocess`) first", file=sys.stderr)  # fmt: skip
        return 2
    options = {**train.options.model_dump(mode="json"), "rounds": args.rounds}
    equal = args.out / "equal_rounds"
    print(f"privatekt: {', '.join(METHODS)} x seeds {args.seeds} x {args.rounds} rounds; "
          f"then PrivateKT alone for {args.long_rounds} rounds", flush=True)  # fmt: skip
    train_all(data, equal / "runs", centers, options, METHODS, args.seeds)
    runs = load_runs(equal / "runs", METHODS, args.seeds)
    write_report(runs, equal / "report", data)
    print(f"\nEqual rounds ({args.rounds}), mean ± std over clients × seeds {args.seeds}:\n")
    print(equal_rounds_table(runs))

    long = args.out / "long"
    long_options = {**options, "rounds": args.long_rounds}
    train_all(data, long / "runs", centers, long_options, ["PrivateKT"], [0])
    long_runs = load_runs(long / "runs", ["PrivateKT"], [0])
    print(f"\nPrivateKT alone, seed 0, {args.long_rounds} rounds (mean ± std over clients):\n")
    print(pace_table(long_runs, args.every))
    print(f"\nreports: {equal / 'report' / 'report.html'}")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(main())
