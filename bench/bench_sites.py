"""FLARE sites against mpiexec, side by side at the demo's size:
``python -m bench sites [--algorithms ProxyFL ...] [--rounds 2] [--repeats 2] [--json F]``.

Each method trains ``--rounds`` rounds from params.yaml's ``train:`` section (its centres,
its stores: run ``make demo`` first, its options) under each launcher in turn, ``--repeats``
times, through the product's launch (:func:`proxyfl.launch.job.run_job`). Printed per
method and launcher, medians over the repeats:

- ``job s``: the whole job, from its launch until its launcher has exited (FLARE's: the
  project provisioned, the server and a site per centre started and connected, the job
  deployed, run and stopped);
- ``round s``: rank 0's seconds in its rounds (training, exchange, evaluation, records,
  checkpoints, waiting for its peers) over the rounds;
- ``comm s/round``: rank 0's seconds in the exchange's calls per round;
- ``start+stop s``: the job less rank 0's rounds;
- ``sent kB/site/round``: what each site sent a round (the send logs' payload bytes, the
  same under both launchers: FLARE's framing and TLS come on top).

The ratios FLARE/mpiexec are of the same run's medians. The goals of docs/sites.md: round
overhead ≤ 0.5 s, start-up ≤ 15 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

IN_DEFAULT_RUN = False  # minutes of training on the demo's stores (make demo first)
LAUNCHERS = ("mpiexec", "flare")


def _figures(run_dir: Path, rounds: int, wall: float) -> dict[str, float]:
    timings = json.loads((run_dir / "machine.json").read_text())["timings"]["per_rank"][0]
    in_rounds = sum(timings[key] for key in ("train_seconds", "eval_seconds", "comm_seconds",
                                             "checkpoint_seconds", "records_seconds",
                                             "wait_seconds"))  # fmt: skip
    sent = []
    for record in sorted((run_dir / "ranks").glob("rank_*[0-9].json")):
        entries = json.loads(record.read_text())["sent"]
        sent.append(sum(e["values"] * np.dtype(e["dtype"]).itemsize for e in entries) / rounds)
    return {"job_s": wall, "round_s": in_rounds / rounds,
            "comm_s_per_round": timings["comm_seconds"] / rounds,
            "start_stop_s": wall - in_rounds,
            "sent_kb_per_site_round": statistics.median(sent) / 1e3 if sent else 0.0}  # fmt: skip


def measure(algorithm: str, rounds: int, repeats: int, work: Path) -> dict[str, Any]:
    from camelyon_proxyfl.params.base import load_sections
    from camelyon_proxyfl.params.train import TrainParams
    from proxyfl.launch.job import TrainingJob, run_job
    from proxyfl.launch.placement import Placement

    train = load_sections(TrainParams).train
    samples: dict[str, list[dict[str, float]]] = {launcher: [] for launcher in LAUNCHERS}
    for repeat in range(repeats):
        for launcher in LAUNCHERS:  # alternately, so that a slow spell hits both
            run_dir = work / launcher / algorithm / f"repeat_{repeat}"
            config = train.job_config(algorithm, train.seeds[0]).model_copy(
                update={"rounds": rounds, "run_dir": run_dir, "resume": False})  # fmt: skip
            started = time.perf_counter()
            run_job(TrainingJob(config, Placement(launcher=launcher)), on_line=lambda _: None)
            samples[launcher].append(_figures(run_dir, rounds, time.perf_counter() - started))
    medians = {launcher: {key: statistics.median(s[key] for s in runs) for key in runs[0]}
               for launcher, runs in samples.items()}  # fmt: skip
    return {"algorithm": algorithm, "rounds": rounds, "repeats": repeats,
            "centers": list(train.centers), "medians": medians}  # fmt: skip


def report(results: list[dict[str, Any]]) -> str:
    keys = ("job_s", "round_s", "comm_s_per_round", "start_stop_s", "sent_kb_per_site_round")
    lines = ["| method | launcher | job s | round s | comm s/round | start+stop s | "
             "sent kB/site/round |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for result in results:
        medians = result["medians"]
        for launcher in LAUNCHERS:
            values = " | ".join(f"{medians[launcher][key]:.2f}" for key in keys)
            lines.append(f"| {result['algorithm']} | {launcher} | {values} |")
        flare, mpi = medians["flare"], medians["mpiexec"]
        lines.append(
            f"| {result['algorithm']} | flare − mpiexec | {flare['job_s'] - mpi['job_s']:+.2f} "
            f"| {flare['round_s'] - mpi['round_s']:+.2f} "
            f"| {flare['comm_s_per_round'] - mpi['comm_s_per_round']:+.3f} "
            f"| {flare['start_stop_s'] - mpi['start_stop_s']:+.2f} | |")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench sites",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("--algorithms", nargs="+", default=["ProxyFL", "FedAvg"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("build/bench-sites"))
    parser.add_argument("--json", type=Path, default=None)
    options = parser.parse_args(argv)
    results = [measure(algorithm, options.rounds, options.repeats, options.work.resolve())
               for algorithm in options.algorithms]  # fmt: skip
    print(report(results), flush=True)
    if options.json is not None:
        options.json.write_text(json.dumps(results, indent=1))
    return 0
