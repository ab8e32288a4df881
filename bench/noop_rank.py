"""A rank that does nothing but start and end as a training rank does: the imports of
``proxyfl.run``'s ranks, its early exit registered before MPI's initialisation
(:func:`plumbing.exit_early.exit_here`), a barrier, the same exit. For
``bench.bench_startup`` (d)::

    mpiexec -n 4 python -m mpi4py -m bench.noop_rank
"""

from __future__ import annotations

import importlib

from plumbing.exit_early import exit_here
from proxyfl.launch.job import RANK_IMPORTS
from proxyfl.run import leave

if __name__ == "__main__":
    for name in RANK_IMPORTS:
        importlib.import_module(name)
    exit_here()  # as proxyfl.run.main, before MPI_Init
    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()
    leave(0)  # as proxyfl.run's ranks end
