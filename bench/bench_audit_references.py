"""The audit's LiRA reference models trained one after the other (as before) against side
by side in ``audit.workers`` processes, on the demo's stores.

For one centre and architecture: ``--count`` reference models trained serially in this
process at torch's default thread count (the machine's cores: the audit before), serially
at one thread (the audit's count, analysis.audit.workers), and in a pool of ``--workers``
one-thread processes (the audit now: the same bits as one thread serially, checked). The
pool is started inside the timing, as the audit starts it. Interleaved, median wall
seconds and the ratio.

    python -m bench.bench_audit_references [--data data/patches] [--center 0]
        [--architecture cnn2] [--count 2] [--workers 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from analysis.audit.population import client_population
from analysis.audit.references import ReferenceRecipe, References, train_references
from analysis.audit.workers import AUDIT_THREADS, audit_processes

IN_DEFAULT_RUN = False  # needs the demo's stores (make demo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_audit_references")
    parser.add_argument("--data", default="data/patches")
    parser.add_argument("--center", type=int, default=0)
    parser.add_argument("--architecture", default="cnn2")
    parser.add_argument("--count", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    population = client_population(args.data, (args.center,))
    # the demo's recipe: 10 rounds of 1 local epoch, B = 32, the private learning rate
    recipe = ReferenceRecipe(args.architecture, 2, population.images.shape[1], epochs=10,
                             batch_size=32, lr=1e-3, weight_decay=1e-4)  # fmt: skip

    default_threads = torch.get_num_threads()

    def in_audit_processes(workers: int) -> Callable[[], References]:
        def train() -> References:
            with audit_processes(workers) as pool:
                return train_references(recipe, population.images, population.labels,
                                        args.count, 0, pool=pool)  # fmt: skip

        return train

    variants: dict[str, Callable[[], References]] = {
        f"serial, {default_threads} threads (before)": lambda: train_references(
            recipe, population.images, population.labels, args.count, 0),
        f"serial, {AUDIT_THREADS} thread": in_audit_processes(1),
        f"{args.workers} workers x {AUDIT_THREADS} thread": in_audit_processes(args.workers),
    }  # fmt: skip
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    logits: dict[str, np.ndarray] = {}
    for _ in range(args.repeats):
        for name, train in variants.items():
            started = time.perf_counter()
            logits[name] = train().logits
            seconds[name].append(time.perf_counter() - started)
    before, serial = list(variants)[:2]
    base = statistics.median(seconds[before])
    print(
        f"{args.count} {args.architecture} reference models on centre {args.center} "
        f"({len(population.images)} patches), median of {args.repeats}:"
    )
    for name, times in seconds.items():
        median = statistics.median(times)
        same = logits[name].tobytes() == logits[serial].tobytes()  # the audit's bits
        bits = (
            "identical"
            if same
            else (f"differ (max |Δ| {np.abs(logits[name] - logits[serial]).max():.2e})")
        )
        print(
            f"  {name:28s} {median:6.2f} s  (x{base / median:.2f} of before)  "
            f"logits against the audit's: {bits}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
