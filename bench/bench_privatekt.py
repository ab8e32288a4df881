"""PrivateKT in its own paper's setting, then beside ProxyFL, FedAvg and Regular on the
demo's stores, with each one's ε.

**The paper's setting** (``--digits-rounds``, default 30; ``--digits-only`` stops after it):
scikit-learn's digits (:mod:`bench.digits`: 10 classes, 16×16) over 4 clients and over 20
(``--digits-clients``; the paper's results come from tens of clients), non-IID by
Dirichlet(α = 0.5) as the authors split them, their jobs on ``--digits-ranks`` ranks (2:
each rank hosts half the clients in turn, :mod:`proxyfl.hosted`, the same bytes as a rank
per client); the public pool is 20 % of each client's
training split (labels dropped), half the clients are sampled per round, ε = 5 per round,
K = 2: PrivateKT with its defaults (the authors'), the three ablations of the paper's
Fig. 3 (no buffer, uniform sampling, no self-training), central training (Joint on the
clients' pooled training data with σ = 0: no noise, clipping only) and FedAvg (DP-SGD,
σ = 1.4: a sample-level guarantee, not comparable to PrivateKT's label-level one), and the
authors' code ported to one process (:mod:`bench.privatekt_port`) on the same stores, pool
rows and first model, with the check that ours reaches its mean minus one std. Every
run uses ``mlp`` (200-200 hidden units), our model closest to the authors' (two small
convolutions under three 512-unit dense layers); ``--digits-model`` picks another.

**The demo's stores**, two protocols, one table each:

1. *equal rounds* (``--rounds``, default 15, as ``make fidelity``): every method for
   ``--seeds`` (default 0 1 2) with the training options of ``params.yaml``;
2. *PrivateKT's own pace* (``--long-rounds``, default 150; the authors' notebook runs 500):
   PrivateKT alone, seed 0, its accuracy every ``--every`` rounds — it transfers K labels
   per round, so it needs many more rounds than the methods that exchange models.

Each method's ε is the largest over its clients at the final round, with its notion:
sample-level (ε, δ)-DP of DP-SGD for the three, label-level ε-LDP (per round ε, and T·ε
by basic composition) for PrivateKT. They are different guarantees, never one scale.

    python -m bench.bench_privatekt [--digits-rounds R] [--digits-seeds S ...]
        [--digits-clients C ...] [--digits-ranks R] [--digits-only] [--rounds R]
        [--seeds S ...] [--long-rounds T] [--out DIR]

The digits part (seeds 0 1 2) needs nothing but the package (about 8 minutes on 2 CPU
cores); the demo
part needs the stores of ``train.data`` (``make demo`` or ``dvc repro preprocess``) and
about 25 minutes. Finished runs of the same configuration are reused.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from analysis.report import accuracy_table, curves, load_runs, write_report
from analysis.report.load import RunResult
from bench.bench_fidelity import train_all
from bench.digits import write_digit_stores
from bench.privatekt_port import PortSettings, port_curves
from camelyon_proxyfl.params.whole import load_params
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
    parser.add_argument("--digits-rounds", type=int, default=30)
    parser.add_argument("--digits-model", default="mlp")
    parser.add_argument("--digits-only", action="store_true")
    parser.add_argument("--digits-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--digits-clients", type=int, nargs="+", default=list(DIGITS_CLIENTS))
    parser.add_argument("--digits-ranks", type=int, default=2)
    return parser


PORT_ROW = "Authors' code, ported (bench/privatekt_port.py)"
DIGITS_CLIENTS = (4, 20)  # the demo's number of clients, and the paper's scale
# (row name, method, options over the digits setting's)
DIGITS_VARIANTS: tuple[tuple[str, str, dict[str, object]], ...] = (
    ("PrivateKT (authors' defaults)", "PrivateKT", {}),
    ("PrivateKT, no buffer (Fig. 3)", "PrivateKT", {"buffer": False}),
    ("PrivateKT, uniform sampling (Fig. 3)", "PrivateKT", {"uniform_sampling": True}),
    ("PrivateKT, no self-training (Fig. 3)", "PrivateKT", {"self_training": False}),
    ("PrivateKT, another centre's pool", "PrivateKT", {"public_pool": "center"}),  # the last
    ("Central (Joint, σ = 0)", "Joint", {"sigma": 0.0, "clip": 100.0}),
    ("FedAvg (DP-SGD, σ = 1.4)", "FedAvg", {}),
)  # fmt: skip


def plateau_round(accuracies: Sequence[float], share: float = 0.95) -> int:
    """The first round whose accuracy reaches ``share`` of the mean of the last five."""
    tail = accuracies[-5:]
    level = share * sum(tail) / len(tail)
    return next(t for t, value in enumerate(accuracies, 1) if value >= level)


def digits_table(directory: Path, rounds: int, model: str, seeds: Sequence[int],
                 clients: int = 4, ranks: int = 2) -> str:  # fmt: skip
    """Train every variant of :data:`DIGITS_VARIANTS` on ``clients`` digits stores for
    ``seeds``, each job on ``ranks`` ranks; their table (the last round's accuracy: mean ±
    std over the seeds of each seed's mean over clients; the best round and the plateau: of
    the mean curve). ``another centre's pool`` makes the last client the public centre."""
    stores = directory / "stores"
    if not all(store_path(stores, c).is_file() for c in range(clients)):
        write_digit_stores(stores, clients=clients, alpha=0.5, seed=0)
    base = {"rounds": rounds, "proxy_model": model, "private_model": [model],
            "eval_batch_size": 256, "ldp_epsilon": 5.0, "kt_samples": 2}  # fmt: skip
    lines = [f"| Run | Accuracy at round {rounds} | Best (round) | Rounds to plateau | "
             "ε | Notion |", "| :-- | --: | --: | --: | --: | :-- |"]  # fmt: skip
    curves_by_name, finals_by_name, shown_by_name = {}, {}, {}
    for number, (name, method, changes) in enumerate(DIGITS_VARIANTS):
        options = {**base, **changes}
        centers = list(range(clients))
        if options.get("public_pool") == "center":
            centers, options["public_center"] = centers[:-1], centers[-1]
        options["ranks"] = min(ranks, len(centers))
        runs_dir = directory / "runs" / f"variant_{number}"
        print(f"digits: {name}", flush=True)
        train_all(stores, runs_dir, centers, options, [method], seeds)
        runs = load_runs(runs_dir, [method], seeds)
        points = curves(runs)[method]
        accuracies = [point.accuracy_mean for point in points]
        finals = np.array([curves([run])[method][-1].accuracy_mean for run in runs])
        privacy = final_epsilon(runs).get(method)
        if privacy is None:  # σ = 0: no guarantee, no ε
            shown, notion_text = "∞", "none (no noise)"
        else:
            epsilon, per_round, notion = privacy
            shown = f"{epsilon:.1f}" + (f" ({per_round:g}/round)" if per_round else "")
            notion_text = PRIVACY_NOTIONS[notion]
        lines.append(_digits_row(name, finals, accuracies, shown, notion_text))
        curves_by_name[name] = accuracies
        finals_by_name[name] = finals
        shown_by_name[name] = shown, notion_text
    # the authors' code, ported, on the same stores, pool rows and first model (the issue's
    # yardstick: our mean at least the port's mean minus one standard deviation)
    name, ours = PORT_ROW, DIGITS_VARIANTS[0][0]
    print(f"digits: {name}", flush=True)
    port = np.array(port_curves(stores, clients, seeds, rounds, PortSettings(model=model)))
    accuracies, finals = port.mean(axis=0).tolist(), port[:, -1]
    lines.append(_digits_row(name, finals, accuracies, *shown_by_name[ours]))
    floor = finals.mean() - finals.std()
    held = finals_by_name[ours].mean() >= floor
    lines += ["", f"{ours}: {finals_by_name[ours].mean():.3f} against the port's "
              f"{finals.mean():.3f} − {finals.std():.3f} = {floor:.3f}: "
              f"{'at least' if held else 'BELOW'} the port's mean minus one std"]  # fmt: skip
    every = max(1, rounds // 10)
    curves_by_name[PORT_ROW] = accuracies
    header = ours, PORT_ROW, "Central (Joint, σ = 0)"
    lines += ["", f"| Round | {' | '.join(header)} |", "| --: | --: | --: | --: |"]
    for t in range(every, rounds + 1, every):
        lines.append(f"| {t} | " + " | ".join(f"{curves_by_name[n][t - 1]:.3f}" for n in header)
                     + " |")  # fmt: skip
    return "\n".join(lines)


def _digits_row(name: str, finals: np.ndarray, accuracies: list[float], epsilon: str,
                notion: str) -> str:  # fmt: skip
    """One row of :func:`digits_table`: the seeds' last-round accuracy (mean ± std), the
    mean curve's best round and plateau, the ε and its notion as shown."""
    best = max(range(len(accuracies)), key=accuracies.__getitem__)
    return (f"| {name} | {finals.mean():.3f} ± {finals.std():.3f} "
            f"| {accuracies[best]:.3f} ({best + 1}) "
            f"| {plateau_round(accuracies)} | {epsilon} | {notion} |")  # fmt: skip


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
    print(f"privatekt: the paper's setting on digits, {args.digits_rounds} rounds, "
          f"model {args.digits_model}", flush=True)  # fmt: skip
    for clients in args.digits_clients:
        folder = args.out / "digits" / ("" if clients == 4 else f"clients_{clients}")
        table = digits_table(folder, args.digits_rounds, args.digits_model, args.digits_seeds,
                             clients, args.digits_ranks)  # fmt: skip
        print(f"\nDigits, {clients} clients on {min(args.digits_ranks, clients)} rank(s), "
              f"Dirichlet α = 0.5, seeds {args.digits_seeds} (accuracy: each seed's mean "
              "over clients):\n")  # fmt: skip
        print(table, flush=True)
    if args.digits_only:
        return 0
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
