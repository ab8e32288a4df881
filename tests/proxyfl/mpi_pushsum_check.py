"""Run under mpiexec: PushSum exchanges without training, the results saved per rank.

Usage: ``mpiexec -n K python -m mpi4py mpi_pushsum_check.py OUT_DIR NAME=SCHEDULE@ROUNDS ...``.
For each case, each rank starts from its own random vector θ_k (seeded by its rank) and
weight 1, runs ROUNDS PushSum rounds of SCHEDULE through
:class:`proxyfl.algorithms.strategies.PushSumExchange` (the same object training uses) and saves
``NAME/rank_{k}.npz`` with the initial vector, the de-biased vector and weight after every
round, and the sizes of the model buffers it sent.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from proxyfl.algorithms.strategies import PushSumExchange
from proxyfl.comm.exchange import Communicator
from proxyfl.comm.graphs import parse_schedule_spec

DIMENSION = 1000


def run_case(out: Path, spec: str, rounds: int) -> None:
    comm = MPI.COMM_WORLD
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


def main() -> None:
    out = Path(sys.argv[1])
    for case in sys.argv[2:]:
        name, _, rest = case.partition("=")
        spec, _, rounds = rest.rpartition("@")
        run_case(out / name, spec, int(rounds))


if __name__ == "__main__":
    main()
