"""Where a training job's ranks run, and what starts them: the one place that knows
launchers (:class:`Placement`): MPICH's fork launcher on this machine (no socket at all),
hydra's ``mpiexec`` across hosts over ssh, or ``srun`` inside a Slurm allocation; the
environment each needs, and ``mpiexec`` itself (:func:`mpiexec_path`).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from proxyfl.launch.hosts import LAUNCH_EXTRA_ARGS_ENV, ssh_launch_options
from proxyfl.launch.slurm import srun_cpus_per_task
from proxyfl.names import LAUNCHERS, Launcher

logger = logging.getLogger(__name__)


def mpiexec_path() -> Path:
    """``mpiexec`` beside this interpreter (the venv's), else the first one on ``PATH``."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file():
        return beside
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError(
            f"no mpiexec next to {sys.executable} or on PATH: `pip install mpich` provides one"
        )
    return Path(found)


# MPICH's launcher without a control port: it forks the ranks and talks to them through
# pipes (hydra's ``mpiexec`` binds its control port to 0.0.0.0 whatever -iface says)
FORK_LAUNCHER = "mpiexec.gforker"
# the ranks' network module: libfabric with only its shared-memory provider, so a rank
# opens no TCP listener (MPICH's default, UCX, listens on the external interface even
# when every rank is on this machine; ranks on one machine talk through shared memory
# either way)
SHARED_MEMORY_ONLY = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "shm"}
# srun's options for a job of K ranks (K = --ntasks). --mpi=pmi2: Slurm's own PMI server,
# which every Slurm build has (pmix needs Slurm built against OpenPMIx; none gives the
# tasks no PMI at all, and each would run as a world of one). pip's MPICH links no Slurm
# library: its built-in PMI client speaks the PMI-1 wire protocol over the socket Slurm
# names in PMI_FD, and Slurm's pmi2 plugin serves PMI-1 as well as PMI-2 requests.
# --kill-on-bad-exit=1: a task that exits non-zero or is killed ends the whole step, as
# mpi4py's abort does under mpiexec, instead of leaving the others waiting for it.
SRUN_OPTIONS = ("--mpi=pmi2", "--kill-on-bad-exit=1")


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where a job's ranks run, and what starts them: the one place that knows launchers.

    - ``mpiexec``, no hosts (the default): every rank on this machine, and nothing of the
      job listens on a network socket, loopback or other (MPICH's fork launcher, ranks
      over shared memory).
    - ``mpiexec`` with ``hosts`` (``-hosts a,b:2``; ``name:N`` puts N ranks on one) or a
      ``hostfile`` (``-f FILE``, one ``host[:N]`` a line): hydra's ``mpiexec`` starts the
      ranks across them, in turn, over ssh; the ranks then talk over the network, and the
      hosts must see the run directory and the stores at the same paths.
    - ``srun``: inside a Slurm allocation (``sbatch``, ``salloc``), Slurm starts one task
      per rank where the allocation has room and gives each its GPUs; hosts and a
      hostfile are refused, since Slurm decides the placement; each task gets the
      allocation's ``--cpus-per-task`` (:func:`~proxyfl.launch.slurm.srun_cpus_per_task`).
      ``tests/slurm/`` runs it on a Slurm cluster of this machine.
    - ``flare``: each rank a NVIDIA FLARE site of this machine, with its own certificate,
      its messages relayed by a FLARE server over mutual TLS on 127.0.0.1
      (:mod:`proxyfl.launch.flare` starts and stops them; :meth:`command_prefix` is not
      used).
    """

    launcher: Launcher = "mpiexec"
    hosts: tuple[str, ...] = ()
    hostfile: Path | None = None
    ssh_timeout_s: float = 10.0  # hydra's ssh to other hosts (hosts.ssh_launch_options)

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"unknown launcher {self.launcher!r}; one of {LAUNCHERS}")
        if self.hosts and self.hostfile is not None:
            raise ValueError("hosts and a hostfile both given: name the hosts one way")
        if self.launcher != "mpiexec" and (self.hosts or self.hostfile is not None):
            raise ValueError(f"{self.launcher} places the ranks itself: give it no hosts or "
                             "hostfile")  # fmt: skip

    @property
    def single_machine(self) -> bool:
        """Every rank on this machine, started by ``mpiexec`` with no hosts."""
        return self.launcher == "mpiexec" and not self.hosts and self.hostfile is None

    @property
    def ranks_fork_warm(self) -> bool:
        """Whether a job's ranks can be forked from one warm server of this machine
        (:mod:`plumbing.warm`): every rank is here, under mpiexec without hosts or in a
        FLARE site the local launcher started (:mod:`proxyfl.sites.warm_launcher`)."""
        return self.single_machine or self.launcher == "flare"

    def fork_launcher(self) -> Path | None:
        """MPICH's fork launcher, when this placement starts the ranks with it: on one
        machine, where pip's ``mpich`` installed it beside ``mpiexec``."""
        if not self.single_machine:
            return None
        fork_launcher = mpiexec_path().with_name(FORK_LAUNCHER)
        return fork_launcher if fork_launcher.is_file() else None

    def command_prefix(self, ranks: int) -> list[str]:
        """The launcher's part of a job's command line, up to the program."""
        if self.launcher == "srun":
            return ["srun", f"--ntasks={ranks}", *srun_cpus_per_task(os.environ),
                    *SRUN_OPTIONS]  # fmt: skip
        if self.hosts:
            return [str(mpiexec_path()), "-hosts", ",".join(self.hosts), "-n", str(ranks)]
        if self.hostfile is not None:
            return [str(mpiexec_path()), "-f", str(self.hostfile), "-n", str(ranks)]
        fork_launcher = self.fork_launcher()
        if fork_launcher is None:
            logger.warning(
                "no %s beside %s: its launcher may listen beyond this machine (pip's "
                "mpich provides one)", FORK_LAUNCHER, mpiexec_path(),
            )  # fmt: skip
            return [str(mpiexec_path()), "-n", str(ranks)]
        return [str(fork_launcher), "-n", str(ranks)]

    def environment(self) -> dict[str, str]:
        """What the launcher's environment must hold for this placement: on one machine,
        shared memory only; across hosts, the ssh options that bound hydra's connections
        (:func:`~proxyfl.launch.hosts.ssh_launch_options`), after the user's own."""
        if self.single_machine:
            return dict(SHARED_MEMORY_ONLY)
        if self.launcher != "mpiexec":
            return {}
        own = os.environ.get(LAUNCH_EXTRA_ARGS_ENV, "").strip()
        ours = ssh_launch_options(self.ssh_timeout_s)
        return {LAUNCH_EXTRA_ARGS_ENV: f"{own} {ours}".strip()}
