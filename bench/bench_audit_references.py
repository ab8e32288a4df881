"""The audit's LiRA reference models trained one after the other (as before) against side
by side in ``audit.workers`` processes, on the demo's stores.

For one centre and architecture: ``--count`` reference models trained serially in this
process, then in a pool of ``--workers`` processes with this process's thread count (the
audit's way: the same bits, checked), and, for comparison only, in a pool whose workers
run one thread each (other bits: see proxyfl.audit.workers). The pool is started inside
the timing, as the audit starts it. Interleaved, median wall seconds and the ratio.

    python -m bench.bench_audit_references [--data data/patches] [--center 0]
        [--architecture cnn2] [--count 2] [--workers 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from proxyfl.audit.population import client_population
from proxyfl.audit.references import ReferenceRecipe, References, train_references
from proxyfl.audit.workers import reference_workers

IN_DEFAULT_RUN = False  # needs the demo's stores (make demo)

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_audit_references")
    parser.add_argument("--data", default="data/patches")
    parser.add_argument("--center", type=int, default=0)
    parser.add_argument("--architecture", default="cnn2")
    parser.add_argument("--count", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    population = client_population(args.data, (args.center,))
    # the demo's recipe: 10 rounds of 1 local epoch, B = 32, the private learning rate
    recipe = ReferenceRecipe(args.architecture, 2, population.images.shape[1], epochs=10,
                             batch_size=32, lr=1e-3, weight_decay=1e-4)  # fmt: skip

    def pooled(threads: int | None) -> Callable[[], References]:
        def train() -> References:
            with reference_workers(args.workers, threads) as pool:
                return train_references(recipe, population.images, population.labels,
                                        args.count, 0, pool=pool)  # fmt: skip
        return train

    variants: dict[str, Callable[[], References]] = {
        f"serial ({torch.get_num_threads()} threads)": lambda: train_references(
            recipe, population.images, population.labels, args.count, 0),
        f"{args.workers} workers x {torch.get_num_threads()} threads": pooled(None),
        f"{args.workers} workers x 1 thread": pooled(1),
    }  # fmt: skip
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    logits: dict[str, np.ndarray] = {}
    for _ in range(args.repeats):
        for name, train in variants.items():
            started = time.perf_counter()
            logits[name] = train().logits
            seconds[name].append(time.perf_counter() - started)
    serial = next(iter(variants))
    base = statistics.median(seconds[serial])
    log.info("%d %s reference models on centre %d (%d patches), %d repeats:", args.count,
             args.architecture, args.center, len(population.images), args.repeats)  # fmt: skip
    for name, times in seconds.items():
        median = statistics.median(times)
        same = logits[name].tobytes() == logits[serial].tobytes()
        log.info("  %-24s median %6.2f s  (x%.2f of serial)  logits %s", name, median,
                 base / median, "identical" if same else
                 f"differ (max |Δ| {np.abs(logits[name] - logits[serial]).max():.2e})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
