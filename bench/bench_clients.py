"""Many clients on few ranks, its cost and its results: ``python -m bench clients
[--clients 4 8 20] [--ranks 2] [--algorithm ProxyFL] [--rounds 3] [--same-bytes 8]
[--model mlp] [--input-size N] [--device auto] [--json F]``.

For each number of clients C: scikit-learn's digits as C non-IID clients
(:mod:`bench.digits`, Dirichlet α = 0.5), one job of ``--rounds`` rounds through the
product's launch (:func:`proxyfl.launch.job.run_job`) with ``--ranks`` ranks hosting the
clients in turn, and one with a rank per client (C processes on this machine's cores: a
placement that oversubscribes them, as one client per rank must here). Printed per C and
placement:

- ``job s``: the whole job, launch to exit;
- ``round s``: the median wall between two rounds' ends (the first round, with its
  start-up, left out);
- ``CPU s/client-round``: the CPU time of the job's whole process tree (its ranks, their
  warm server) over C × rounds: what a client's round costs wherever it runs;
- ``peak RSS/rank GB``: the largest rank's resident peak; ``RSS GB``: summed over ranks;
- ``peak GPU/rank GB`` (on a GPU): the largest rank's peak of allocated device memory; a
  rank that hosts several clients holds one client's models on the device at a time
  (:mod:`proxyfl.engine.residency`), so it is meant to stay near one client's whatever
  their number (not yet shown: that module says what a device showed);
- ``same bytes``: whether the two placements' metrics, kept models, ε and send logs are
  byte-identical (they must be).

Then (``--same-bytes C``, default 8; 0 skips it) every method but Joint (one rank by
definition) trains C digits clients on 1, 2, 4, ..., C ranks, and a table says per method
whether every placement wrote the bytes of a rank per client, with each job's seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

IN_DEFAULT_RUN = False  # minutes of training, named only

OPTIONS: dict[str, Any] = {
    "proxy_model": "mlp", "private_model": ["mlp"], "batch_size": 32, "eval_batch_size": 256,
    "lr": 0.01, "torch_threads": None, "keep_final_checkpoints": False,
}  # fmt: skip


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _peaks(run_dir: Path, key: str) -> tuple[float, float]:
    """``(largest rank's peak of memory ``key``, their sum)`` in GB; a hosting rank's
    clients report its one process."""
    records = json.loads((run_dir / "machine.json").read_text())["ranks"]
    by_rank: dict[Any, float] = {}
    for record in records:
        rank = record["host_rank"] if record.get("host_rank") is not None else record["rank"]
        by_rank[rank] = max(by_rank.get(rank, 0.0), record["memory"].get(key) or 0.0)
    return max(by_rank.values()), sum(by_rank.values())


def measure(
    clients: int, ranks: int, algorithm: str, rounds: int, work: Path,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    from bench.digits import write_digit_stores
    from proxyfl.config import TrainConfig
    from proxyfl.launch.job import TrainingJob, run_job
    from proxyfl.launch.progress import RoundProgress

    stores = work / f"stores_{clients}"
    if not (stores / f"center_{clients - 1}.h5").is_file():
        write_digit_stores(stores, clients=clients, alpha=0.5, seed=0)
    figures: dict[str, Any] = {}
    runs = {}
    for placement, job_ranks in (("hosted", ranks), ("a rank per client", clients)):
        run_dir = work / f"clients_{clients}" / placement.replace(" ", "_")
        config = TrainConfig(**(options or OPTIONS), algorithm=algorithm, seed=0, data=stores,
                             run_dir=run_dir, centers=list(range(clients)), rounds=rounds,
                             ranks=job_ranks)  # fmt: skip
        ends: list[float] = []

        def on_round(_: RoundProgress, ends: list[float] = ends) -> None:
            ends.append(time.perf_counter())

        cpu, started = _children_cpu_s(), time.perf_counter()
        run_job(TrainingJob(config), on_line=lambda _: None, on_round=on_round)
        wall, cpu = time.perf_counter() - started, _children_cpu_s() - cpu
        peak, total = _peaks(run_dir, "peak_rss_gb")
        gpu_peak, _ = _peaks(run_dir, "peak_gpu_allocated_gb")
        gaps = [b - a for a, b in itertools.pairwise(ends)]
        figures[placement] = {
            "ranks": job_ranks, "job_s": wall,
            "round_s": statistics.median(gaps) if gaps else float("nan"),
            "cpu_s_per_client_round": cpu / (clients * rounds),
            "peak_rss_per_rank_gb": peak, "rss_gb": total, "peak_gpu_per_rank_gb": gpu_peak,
        }  # fmt: skip
        runs[placement] = run_dir
    figures["same_bytes"] = _same_results(*runs.values())
    return {"clients": clients, "algorithm": algorithm, "rounds": rounds, "figures": figures}


SAME_BYTES_METHODS = ("ProxyFL", "FML", "FedAvg", "AvgPush", "CWT", "Regular", "PrivateKT")


def same_bytes(clients: int, rounds: int, work: Path, options: dict[str, Any] | None = None) -> str:
    """Every method of :data:`SAME_BYTES_METHODS` on ``clients`` digits clients, on each
    power of two of ranks up to ``clients``: a table of whether each placement wrote the
    bytes of a rank per client, and its job's seconds."""
    from bench.digits import write_digit_stores
    from proxyfl.config import TrainConfig
    from proxyfl.launch.job import TrainingJob, run_job

    stores = work / f"stores_{clients}"
    if not (stores / f"center_{clients - 1}.h5").is_file():
        write_digit_stores(stores, clients=clients, alpha=0.5, seed=0)
    placements = [2**k for k in range(clients.bit_length()) if 2**k < clients]
    lines = [f"| method | {' | '.join(f'{r} rank(s)' for r in placements)} "
             f"| {clients} ranks (reference) |",
             "|---|" + "---|" * (len(placements) + 1)]  # fmt: skip
    for algorithm in SAME_BYTES_METHODS:
        cells, reference = [], None
        for ranks in [clients, *placements]:
            run_dir = work / f"same_bytes_{clients}" / algorithm / f"ranks_{ranks}"
            settings = {**(options or OPTIONS), "batch_size": 8}
            config = TrainConfig(**settings, algorithm=algorithm, seed=0,
                                 data=stores, run_dir=run_dir, centers=list(range(clients)),
                                 rounds=rounds, ranks=ranks, kt_samples=2)  # fmt: skip
            started = time.perf_counter()
            run_job(TrainingJob(config), on_line=lambda _: None)
            seconds = time.perf_counter() - started
            if reference is None:
                reference, ref_seconds = run_dir, seconds
                continue
            same = _same_results(reference, run_dir)
            cells.append(f"{'same' if same else 'DIFFERENT'} ({seconds:.1f} s)")
        lines.append(f"| {algorithm} | {' | '.join(cells)} | {ref_seconds:.1f} s |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


def _same_results(first: Path, second: Path) -> bool:
    """Whether two runs wrote the same metrics, kept models, records (ε, send logs) and
    predictions; a file missing from the second is a difference."""
    names = ["metrics.jsonl", *(str(p.relative_to(first)) for p in sorted(first.rglob("*"))
                                if p.is_file() and p.parts[len(first.parts)] in
                                ("models", "ranks", "predictions")
                                and not p.name.endswith(".machine.json"))]  # fmt: skip
    return all((second / name).is_file()
               and (first / name).read_bytes() == (second / name).read_bytes()
               for name in names)  # fmt: skip


def report(results: list[dict[str, Any]]) -> str:
    lines = ["| clients | placement | ranks | job s | round s | CPU s/client-round | "
             "peak RSS/rank GB | RSS GB | peak GPU/rank GB | same bytes |",
             "|--:|---|--:|--:|--:|--:|--:|--:|--:|---|"]  # fmt: skip
    for result in results:
        figures = result["figures"]
        for placement in ("hosted", "a rank per client"):
            f = figures[placement]
            lines.append(
                f"| {result['clients']} | {placement} | {f['ranks']} | {f['job_s']:.1f} "
                f"| {f['round_s']:.2f} | {f['cpu_s_per_client_round']:.2f} "
                f"| {f['peak_rss_per_rank_gb']:.2f} | {f['rss_gb']:.2f} "
                f"| {f.get('peak_gpu_per_rank_gb') or 0.0:.2f} "
                f"| {'yes' if figures['same_bytes'] else 'NO'} |"
            )
        hosted, alone = figures["hosted"], figures["a rank per client"]
        lines.append(
            f"| {result['clients']} | hosted / a rank each | | "
            f"{hosted['job_s'] / alone['job_s']:.2f} | {hosted['round_s'] / alone['round_s']:.2f} "
            f"| {hosted['cpu_s_per_client_round'] / alone['cpu_s_per_client_round']:.2f} "
            f"| | {hosted['rss_gb'] / alone['rss_gb']:.2f} | | |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench clients",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("--clients", type=int, nargs="*", default=[4, 8, 20])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--algorithm", default="ProxyFL")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("build/bench-clients"))
    parser.add_argument("--same-bytes", type=int, default=8, metavar="C")
    parser.add_argument(
        "--model",
        default=OPTIONS["proxy_model"],
        help="every client's proxy and private model (resnet18_gn: the paper's)",
    )
    parser.add_argument(
        "--input-size",
        type=int,
        default=None,
        help="the digits resized to this on the device (default: 8 px)",
    )
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--json", type=Path, default=None)
    options = parser.parse_args(argv)
    training = {**OPTIONS, "proxy_model": options.model, "private_model": [options.model],
                "input_size": options.input_size, "device": options.device,
                # a figure of the placement, not of torch.compile's minutes on a GPU
                "compile": "off"}  # fmt: skip
    results = []
    for clients in options.clients:
        results.append(measure(clients, min(options.ranks, clients), options.algorithm,
                               options.rounds, options.work.resolve(), training))  # fmt: skip
        print(report(results[-1:]), flush=True)
    if results:
        print(report(results), flush=True)
    if options.same_bytes:
        print(f"\nThe same bytes on every placement, {options.same_bytes} clients:", flush=True)
        print(same_bytes(options.same_bytes, 2, options.work.resolve(), training), flush=True)
    if options.json is not None:
        options.json.write_text(json.dumps(results, indent=1))
    return 0
