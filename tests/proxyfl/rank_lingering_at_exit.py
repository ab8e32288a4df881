"""A rank of ``python -m mpi4py -m proxyfl.run``, except that rank 0 is still running its exit
handlers (3 s) when another rank's end stops the job: what the launcher's SIGINT finds on
rank 0 is then certain, not a matter of timing (CI once caught a rank there)."""

import atexit
import runpy
import time

from mpi4py import MPI


def _linger() -> None:
    time.sleep(3)


if MPI.COMM_WORLD.Get_rank() == 0:
    atexit.register(_linger)
runpy.run_module("proxyfl.run", run_name="__main__", alter_sys=True)
