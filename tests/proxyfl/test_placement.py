"""Where a job's ranks run: each placement's command line and environment, and the
combinations refused.

No Slurm runs here: ``srun``'s command line is checked as the launcher would run it, never
run (a stand-in that only pretended to start tasks would prove nothing). The jobs that
really run are in test_launch_mpi.py (this machine, hydra by host name) and
test_hosts_netns.py (two hosts).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plumbing import warm_shim
from plumbing.warm import WarmRanks
from proxyfl.config import TrainConfig
from proxyfl.launch.hosts import LAUNCH_EXTRA_ARGS_ENV
from proxyfl.launch.job import RANK_IMPORTS, TrainingJob
from proxyfl.launch.placement import FORK_LAUNCHER, SHARED_MEMORY_ONLY, Placement, mpiexec_path

REPO = Path(__file__).resolve().parents[2]


def _job(tmp_path: Path, placement: Placement, algorithm: str = "ProxyFL") -> TrainingJob:
    config = TrainConfig(algorithm=algorithm, seed=0, data=tmp_path / "stores",
                         run_dir=tmp_path / "run", centers=[0, 1, 2, 3])  # fmt: skip
    return TrainingJob(config, placement)


def test_one_machine_is_the_fork_launcher_over_shared_memory() -> None:
    placement = Placement()
    assert placement.single_machine and placement.launcher == "mpiexec"
    fork_launcher = mpiexec_path().with_name(FORK_LAUNCHER)
    assert placement.fork_launcher() == fork_launcher
    assert placement.command_prefix(4) == [str(fork_launcher), "-n", "4"]
    assert placement.environment() == SHARED_MEMORY_ONLY


def test_hosts_and_a_hostfile_are_hydras(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Named hosts go to hydra's ``-hosts``, a hostfile to its ``-f``; the ranks then talk
    over the network, so neither keeps the shared-memory-only environment. Hydra's ssh is
    bounded (:func:`~proxyfl.launch.hosts.ssh_launch_options`), after the user's own
    options when they set some."""
    monkeypatch.delenv(LAUNCH_EXTRA_ARGS_ENV, raising=False)
    by_name = Placement(hosts=("node-a", "node-b:2"))
    assert by_name.command_prefix(3) == [str(mpiexec_path()), "-hosts", "node-a,node-b:2",
                                         "-n", "3"]  # fmt: skip
    hostfile = tmp_path / "hosts.txt"
    by_file = Placement(hostfile=hostfile)
    assert by_file.command_prefix(4) == [str(mpiexec_path()), "-f", str(hostfile), "-n", "4"]
    for placement in (by_name, by_file):
        assert not placement.single_machine and placement.fork_launcher() is None
        assert placement.environment() == {
            "HYDRA_LAUNCHER_EXTRA_ARGS": "-o BatchMode=yes -o ConnectTimeout=10 "
            "-o ServerAliveInterval=5 -o ServerAliveCountMax=3"
        }
    monkeypatch.setenv(LAUNCH_EXTRA_ARGS_ENV, "-p 2222")
    assert by_name.environment()[LAUNCH_EXTRA_ARGS_ENV] == (
        "-p 2222 -o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=5 "
        "-o ServerAliveCountMax=3"
    )


def test_srun_starts_one_task_per_rank_with_slurms_pmi(tmp_path: Path) -> None:
    """The whole command of a four-client job under Slurm: one task per rank, Slurm's
    PMI-2 plugin (which serves the PMI-1 protocol pip's MPICH speaks), the step ended
    when any task fails; the program is the same as under mpiexec."""
    placement = Placement(launcher="srun")
    job = _job(tmp_path, placement)
    assert job.command() == [
        "srun", "--ntasks=4", "--mpi=pmi2", "--kill-on-bad-exit=1",
        sys.executable, "-m", "mpi4py", "-m", "proxyfl.run",
        "--config", str(tmp_path / "run" / "config.json"),
    ]  # fmt: skip
    assert _job(tmp_path, placement, "Joint").command()[:2] == ["srun", "--ntasks=1"]
    assert not placement.single_machine and placement.fork_launcher() is None
    assert placement.environment() == {}  # Slurm's nodes: MPICH's own network module


@pytest.mark.parametrize(
    ("placement", "refused"),
    [
        (dict(hosts=("a",), hostfile=Path("hosts.txt")), "hosts and a hostfile"),
        (dict(launcher="srun", hosts=("a",)), "srun places the ranks"),
        (dict(launcher="srun", hostfile=Path("hosts.txt")), "srun places the ranks"),
        (dict(launcher="slurm"), "unknown launcher 'slurm'"),
    ],
)
def test_a_placement_of_two_minds_is_refused(placement: dict, refused: str) -> None:
    with pytest.raises(ValueError, match=refused):
        Placement(**placement)


# One process imports the warm server's modules as a server does, and says what that did:
# whether MPI and Prefect were imported, what of torch's CUDA bindings was called (every
# function of them wrapped to record its calls before the imports), and what the first
# optimizer a rank builds then imports. One probe for the three tests below: each import
# of them all costs a new interpreter 4-7 s of CPU.
WARM_IMPORTS_PROBE = f"""
import importlib, json, sys
import torch
called = []
def recorded(name, function):
    def call(*args, **kwargs):
        called.append(name)
        return function(*args, **kwargs)
    return call
for name in dir(torch._C):
    if name.startswith(("_cuda_", "_cuda")) and callable(getattr(torch._C, name)):
        setattr(torch._C, name, recorded(name, getattr(torch._C, name)))
for name in {list(RANK_IMPORTS)!r}:
    importlib.import_module(name)
mpi, prefect = "mpi4py.MPI" in sys.modules, "prefect" in sys.modules
cuda_initialized, cuda_called = torch.cuda.is_initialized(), sorted(set(called))
before = set(sys.modules)
torch.optim.Adam(torch.nn.Linear(2, 2).parameters())
print(json.dumps({{"mpi": mpi, "prefect": prefect, "cuda_initialized": cuda_initialized,
                  "cuda_called": cuda_called,
                  "imported_by_an_optimizer": sorted(set(sys.modules) - before)}}))
"""


@pytest.fixture(scope="module")
def warm_imports() -> dict[str, Any]:
    """What importing :data:`RANK_IMPORTS` did in a new interpreter (WARM_IMPORTS_PROBE)."""
    result = subprocess.run([sys.executable, "-c", WARM_IMPORTS_PROBE], capture_output=True,
                            text=True, cwd=REPO, check=True)  # fmt: skip
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_warm_servers_imports_are_what_a_rank_defers_and_leave_mpi_alone(
    warm_imports: dict[str, Any],
) -> None:
    """RANK_IMPORTS holds every module proxyfl.run's main imports once its input is checked
    (else each rank would still import it itself), and importing them all does not
    initialise MPI (the server forks the ranks: MPI must start in each) nor import
    Prefect (whose settings a kept server ignores)."""
    tree = ast.parse((REPO / "proxyfl" / "run.py").read_text())
    main = next(node for node in tree.body
                if isinstance(node, ast.FunctionDef) and node.name == "main")  # fmt: skip
    deferred = set()
    for node in ast.walk(main):
        if isinstance(node, ast.ImportFrom) and node.module and node.module != "mpi4py":
            package = importlib.util.find_spec(node.module)
            for alias in node.names:  # `from package import module` imports the module
                submodule = f"{node.module}.{alias.name}"
                is_module = (
                    package is not None
                    and package.submodule_search_locations
                    and (importlib.util.find_spec(submodule) is not None)
                )
                deferred.add(submodule if is_module else node.module)
    assert deferred <= set(RANK_IMPORTS), deferred - set(RANK_IMPORTS)
    assert {"torch", "opacus"} <= set(RANK_IMPORTS)
    assert warm_imports["mpi"] is False
    # nor Prefect: a warm server is matched to its jobs with Prefect's settings left out
    assert warm_imports["prefect"] is False


def test_the_warm_servers_imports_never_touch_cuda(warm_imports: dict[str, Any]) -> None:
    """The warm server imports torch and then forks every rank: CUDA initialised (or even
    its driver asked for devices) before a fork breaks CUDA in the ranks. Every function of
    torch's CUDA bindings is wrapped to record its calls before the server's imports."""
    assert warm_imports["cuda_initialized"] is False
    assert warm_imports["cuda_called"] == []


def test_a_ranks_first_optimizer_imports_nothing_the_server_did_not(
    warm_imports: dict[str, Any],
) -> None:
    """torch's optimizers import torch._dynamo when the first one is built (0.85 s of CPU
    in every rank): the warm server imports it, so a forked rank does not."""
    assert warm_imports["imported_by_an_optimizer"] == []


def test_a_warm_job_runs_each_rank_through_the_shim(tmp_path: Path) -> None:
    job = _job(tmp_path, Placement())
    warm = WarmRanks(tmp_path / "socket")
    command = job.command(warm)
    program = job.command()[3:]  # after gforker -n 4
    assert command[:3] == job.command()[:3]
    assert command[3:] == [sys.executable, "-I", "-S", warm_shim.__file__, *program]
