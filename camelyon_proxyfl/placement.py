"""Where the jobs of ``train:`` run: the one :class:`~proxyfl.launch.placement.Placement` built from
``train.launcher``, ``train.hosts`` and ``train.hostfile``, and what can be checked of it
before any launch (a hostfile that is not there, a host that does not answer ssh, no
``srun`` to call, a Slurm allocation too small for a job's ranks).

Kept apart from :mod:`camelyon_proxyfl.params.train`, which the report and the audit read
too: they launch nothing, so the launcher's code is not among what they depend on.
"""

from __future__ import annotations

import os
import shutil

from camelyon_proxyfl.findings import Finding
from camelyon_proxyfl.params.train import TrainSection
from proxyfl.launch.hosts import hostfile_hosts, named_hosts, unreachable_hosts
from proxyfl.launch.placement import Placement
from proxyfl.launch.slurm import Allocation


def placement(train: TrainSection) -> Placement:
    """Where every job of ``train`` runs, and what starts its ranks."""
    return Placement(launcher=train.launcher, hosts=tuple(train.hosts), hostfile=train.hostfile,
                     ssh_timeout_s=train.ssh_timeout_s)  # fmt: skip


def _hostfile_problem(train: TrainSection) -> str | None:
    """Why hydra could not read ``train.hostfile``'s hosts, or ``None``."""
    path = train.hostfile
    if path is None:
        return None
    if not path.exists():
        return f"{path}: no such file (hydra's mpiexec -f reads the hosts from it)"
    if not path.is_file():
        return f"{path}: not a file (hydra's mpiexec -f reads the hosts from it)"
    try:
        hosts = hostfile_hosts(path)
    except (OSError, UnicodeDecodeError) as error:
        return f"{path}: unreadable ({error})"
    if not hosts:
        return f"{path}: names no host (one NAME or NAME:N a line; # starts a comment)"
    return None


def largest_job_ranks(train: TrainSection) -> int:
    """The ranks of ``train``'s largest job: ``train.ranks`` or a rank per centre, Joint's
    one."""
    return max(train.job_config(algorithm, 0).job_ranks() for algorithm in train.algorithms)


def placement_findings(train: TrainSection) -> list[Finding]:
    """An error for a hostfile hydra could not read, for each host of ``train.hosts`` or
    the hostfile that does not answer ssh within ``train.ssh_timeout_s`` (checked all at
    once, this machine's names excepted: :mod:`proxyfl.launch.hosts`), and for ``srun``
    where none is on ``PATH`` or the Slurm allocation this runs in has no room for the
    largest job's ranks (:meth:`~proxyfl.launch.slurm.Allocation.refusal`; the keys' own
    combinations are validated with the section)."""
    findings = []
    problem = _hostfile_problem(train)
    if problem is not None:
        findings.append(Finding("error", "train.hostfile", problem))
    elif train.launcher == "mpiexec" and (train.hosts or train.hostfile is not None):
        hosts = named_hosts(train.hosts, train.hostfile)
        for host, why in unreachable_hosts(hosts, train.ssh_timeout_s).items():
            findings.append(Finding(
                "error", f"host {host}",
                f"{why}; hydra's mpiexec starts this host's ranks over ssh: make it "
                "reachable (ssh with a key, no prompt, its host key known), or leave it out of "
                f"{'train.hostfile' if train.hostfile is not None else 'train.hosts'}",
            ))  # fmt: skip
    if train.launcher == "srun" and shutil.which("srun") is None:
        findings.append(Finding(
            "error", "train.launcher",
            "srun is not on PATH: launcher srun runs inside a Slurm allocation (sbatch or "
            "salloc, on a node where Slurm's commands are installed); elsewhere use mpiexec",
        ))  # fmt: skip
    allocation = Allocation.of(os.environ) if train.launcher == "srun" else None
    refusal = allocation.refusal(largest_job_ranks(train)) if allocation is not None else None
    if refusal is not None:
        findings.append(Finding("error", "train.launcher", refusal))
    return findings
