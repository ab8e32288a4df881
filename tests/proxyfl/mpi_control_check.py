"""Run under mpiexec: control messages through proxyfl.comm.control, written per rank as JSON.

Usage: ``mpiexec -n K python -m mpi4py mpi_control_check.py OUT_DIR``. Each rank sends a
value of its own (strings, NaN, inf, NumPy scalars, nesting, a tuple, a size that differs
by rank) with both calls and writes what it received to ``OUT_DIR/rank_{k}.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from proxyfl.comm.control import allgather_json, gather_json

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
value = {
    "rank": rank,
    "text": "é" * rank,
    "nan": float("nan"),
    "inf": float("inf"),
    "numpy": np.float32(0.5) * rank,
    "pair": (rank, None),
    "rounds": list(range(rank)),
}
everyone = allgather_json(comm, value)
at_root = gather_json(comm, value, root=0)
Path(sys.argv[1], f"rank_{rank}.json").write_text(
    json.dumps({"allgather": everyone, "gather": at_root})
)
