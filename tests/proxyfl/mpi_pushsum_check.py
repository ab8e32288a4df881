"""Run under mpiexec: PushSum exchanges without training, the results saved per rank.

Usage: ``mpiexec -n K python -m mpi4py mpi_pushsum_check.py OUT_DIR NAME=SCHEDULE@ROUNDS ...``.
For each case, each rank starts from its own random vector θ_k (seeded by its rank) and
weight 1, runs ROUNDS PushSum rounds of SCHEDULE through
:class:`proxyfl.algorithms.strategies.PushSumExchange` (the same object training uses) and saves
``NAME/rank_{k}.npz`` with the initial vector, the de-biased vector and weight after every
round, and the sizes of the model buffers it sent. A case ``NAME=server:M1,M2,...@1``
instead runs one server average (:meth:`Communicator.server_average`) over those members
and saves each caller's ``average``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from proxyfl.algorithms.strategies import PushSumExchange
from proxyfl.comm.exchange import Communicator
from proxyfl.comm.graphs import parse_schedule_spec

DIMENSION = 1000


def run_case(out: Path, spec: str, rounds: int, comm: Any = None) -> None:
    comm = comm or MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    theta = np.random.default_rng(1000 + rank).normal(size=DIMENSION).astype(np.float32)
    initial = theta.copy()
    exchange = PushSumExchange(parse_schedule_spec(spec))
    communicator = Communicator(comm)
    members = list(range(size))
    history, weights = [], []
    for round_number in range(1, rounds + 1):
        new, _ = exchange.exchange(communicator, theta, members, round_number)
        assert new is not None
        theta = new
        history.append(theta.copy())
        weights.append(exchange.weight)
    out.mkdir(parents=True, exist_ok=True)
    sent = [entry["values"] for entry in communicator.log.entries if entry["kind"] == "model"]
    np.savez(
        out / f"rank_{rank}.npz",
        initial=initial,
        history=np.stack(history),
        weights=np.array(weights),
        sent_values=np.array(sent),
    )


def run_server_average(out: Path, members: list[int], comm: Any = None) -> None:
    comm = comm or MPI.COMM_WORLD
    rank = comm.Get_rank()
    theta = np.random.default_rng(1000 + rank).normal(size=DIMENSION).astype(np.float32)
    average, _ = Communicator(comm).server_average(theta, members, 1)
    out.mkdir(parents=True, exist_ok=True)
    saved = {"initial": theta} if average is None else {"initial": theta, "average": average}
    np.savez(out / f"rank_{rank}.npz", **saved)


def run_cases(out: Path, cases: list[str], comm: Any = None) -> None:
    """Each ``NAME=SPEC@ROUNDS`` case, over ``comm`` (MPI's world by default)."""
    for case in cases:
        name, _, rest = case.partition("=")
        spec, _, rounds = rest.rpartition("@")
        if spec.startswith("server:"):
            run_server_average(out / name, [int(m) for m in spec[7:].split(",")], comm)
        else:
            run_case(out / name, spec, int(rounds), comm)


def main() -> None:
    run_cases(Path(sys.argv[1]), sys.argv[2:])


if __name__ == "__main__":
    main()
