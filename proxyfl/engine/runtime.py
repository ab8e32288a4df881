"""Where a rank runs: its MPI communicator, its device, its random seeds.

Device mapping: with GPUs, rank r uses ``cuda:(local rank mod #GPUs)`` (the local rank is
r's index among the ranks on its node; #GPUs those this process sees), so four GPUs give one
client each and one GPU is shared; without GPUs every rank uses the CPU. Under ``srun
--gpus-per-task=1`` Slurm binds each task to its own GPU (``CUDA_VISIBLE_DEVICES`` names
that one only), so every rank sees one GPU and takes ``cuda:0``, its own, whatever its
local rank (0..n-1 on each node); where every rank of a node sees all its GPUs, local ranks
spread them.

Threads by placement (:func:`threads_by_placement`): every rank, CUDA or CPU, runs
``max(1, cores of its node // ranks on that node)`` intra-op threads, whatever launched it
(hydra's ``mpiexec`` sets ``MPI_LOCALNRANKS`` and torch then takes one thread; the fork
launcher sets nothing and torch takes every core: four CUDA ranks on 16 cores ran 64
threads, and a batch's collate went from 3-15 ms to 28-490 ms at its 90th percentile).
A rank whose launcher bound it to fewer cores than the node has (Slurm's
``--cpus-per-task``, hydra's ``-bind-to``) takes the cores it was given. ``torch_threads``
overrides the rule. On a CPU the count is part of the result's last bits (a reduction split
T ways rounds differently), so it is recorded with the kernels (:func:`kernel_set`).

Seeds are derived with NumPy's ``SeedSequence`` from the run seed and a purpose (and the
client's centre where clients must differ): :func:`derived_seed`.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from proxyfl.names import CUDA_ALLOCATOR_SETTING

logger = logging.getLogger(__name__)


@dataclass
class Runtime:
    """This process's place in the MPI job."""

    comm: Any
    rank: int
    size: int
    local_rank: int
    device: torch.device
    hostname: str
    local_size: int = 1  # ranks on this node
    host_rank: int | None = None  # the MPI rank running this client, where it hosts several

    @property
    def ranks_on_device(self) -> int:
        """Ranks sharing this rank's device: its GPU (local ranks are spread over the
        node's GPUs in turn), or the node's memory for the CPU."""
        if self.device.type != "cuda":
            return self.local_size
        gpus = torch.cuda.device_count()
        return len([r for r in range(self.local_size) if r % gpus == self.local_rank % gpus])

    @property
    def is_root(self) -> bool:
        return self.rank == 0


def mpi_world() -> Any:
    """``MPI.COMM_WORLD`` (size 1 when not launched by mpiexec)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


def local_placement(comm: Any) -> tuple[int, int]:
    """``(this rank's index among the ranks sharing its node, how many share it)``: MPI's
    shared-memory split, or what a world of messages was told
    (:meth:`proxyfl.comm.world.MessageWorld.local_placement`)."""
    told = getattr(comm, "local_placement", None)
    if told is not None:
        return told()
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return int(node.Get_rank()), int(node.Get_size())
    finally:
        node.Free()


class DeviceError(RuntimeError):
    """The requested device is not available."""


def choose_device(choice: str, local_rank: int) -> torch.device:
    """``cuda:(local_rank mod #GPUs)`` for ``auto``/``cuda`` when GPUs exist, else the CPU."""
    if choice not in ("auto", "cpu", "cuda"):
        raise DeviceError(f"unknown device {choice!r}; choose auto, cpu or cuda")
    has_cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if choice == "cuda" and not has_cuda:
        raise DeviceError("--device cuda was requested but no CUDA GPU is visible")
    if choice != "cpu" and has_cuda:
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def usable_cores() -> tuple[int, int]:
    """``(cores this process may run on, cores of the node)``: its CPU affinity, which a
    launcher's binding narrows, and the node's count."""
    node = os.cpu_count() or 1
    try:
        return len(os.sched_getaffinity(0)) or node, node
    except (AttributeError, OSError):  # no affinity on this platform
        return node, node


def threads_by_placement(local_size: int, cores: int, node_cores: int) -> int:
    """Intra-op threads of one of ``local_size`` ranks on a node of ``node_cores`` cores,
    this one allowed ``cores`` of them: all of those when a launcher bound it to fewer
    than the node has, else an equal share of the node, at least one."""
    if cores < node_cores:
        return max(1, cores)
    return max(1, node_cores // max(1, local_size))


def set_threads(threads: int) -> None:
    """``threads`` intra-op threads, and as many inter-op ones where torch still lets them
    be set (only before its inter-op pool first runs: a rank forked from a warm server
    inherits the server's, which never ran one)."""
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # already started in this process: the intra-op count is what counts
        logger.debug("inter-op threads already set (%d)", torch.get_num_interop_threads())


def make_runtime(comm: Any, device_choice: str, threads: int | None = None) -> Runtime:
    """Set up this rank: device selected (and made current), threads by its placement
    (:func:`threads_by_placement`) unless ``threads`` says how many."""
    rank, size = comm.Get_rank(), comm.Get_size()
    local_rank, local_size = local_placement(comm)
    device = choose_device(device_choice, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    set_threads(threads or threads_by_placement(local_size, *usable_cores()))
    return Runtime(
        comm=comm,
        rank=rank,
        size=size,
        local_rank=local_rank,
        device=device,
        hostname=socket.gethostname(),
        local_size=local_size,
        host_rank=getattr(comm, "host_rank", None),  # a ClientWorld's (proxyfl.hosted)
    )


# cuBLAS's deterministic workspace (torch's "Reproducibility" notes)
CUBLAS_DETERMINISTIC = ":4096:8"


def configure_torch(deterministic: bool) -> None:
    """Settings a rank takes before any CUDA work: the allocator's expandable segments
    (unless the user set ``PYTORCH_CUDA_ALLOC_CONF``), and, when ``deterministic``, torch's
    deterministic algorithms with cuBLAS's deterministic workspace and no cuDNN
    benchmarking, so that a GPU run and its resume reproduce bit for bit (+7.7 % of
    training time on an H100); without, GPU runs differ in late digits from run to run.

    Deterministic mode, without its fill: ``use_deterministic_algorithms(True)`` also turns
    on ``torch.utils.deterministic.fill_uninitialized_memory``, which writes NaN (or the
    integer maximum) into every tensor ``torch.empty`` and its kin return: 800-1,430 extra
    ``fill_`` kernels, each a full write, in one DML step at 128 px. The fill only makes a
    difference to a result that reads memory before anything wrote it: a bug of the op
    that does so, not an order of floating-point sums. Every op of these steps writes each
    element of its output before reading it, so with the fill off a deterministic run gives
    the same bits (``tests/proxyfl/test_runtime.py``: a run with the fill on and off) and
    stays deterministic; the rank record says ``fill_uninitialized_memory: false``."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", CUDA_ALLOCATOR_SETTING)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC)
    torch.use_deterministic_algorithms(deterministic)
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = deterministic


def derived_seed(seed: int, purpose: str, *keys: int) -> int:
    """A 63-bit seed from the run seed, a purpose name and integer keys (e.g. a centre)."""
    words = [int(seed) % 2**32, *purpose.encode(), *(int(k) % 2**32 for k in keys)]
    return int(
        np.random.SeedSequence(words).generate_state(2, dtype=np.uint32).view(np.uint64)[0]
        >> np.uint64(1)
    )


def seeded_generator(seed: int, device: torch.device) -> torch.Generator:
    """A torch generator on ``device`` seeded with ``seed``."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def kernel_set(device: torch.device) -> str:
    """The kernels whose arithmetic a run's bits depend on, recorded with each client in
    run.json: the same code, parameters and library versions give the same bytes with the
    same kernels (docs/reproducibility.md). On a CPU, torch's instruction set
    (``ATEN_CPU_CAPABILITY`` chooses another), oneDNN's cap (``ONEDNN_MAX_CPU_ISA``;
    "native": the CPU's own) and the intra-op threads (each splits a reduction's sums); on
    a GPU, its name and compute capability."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"cuda {torch.cuda.get_device_name(device)} sm_{major}{minor}"
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    threads = torch.get_num_threads()
    return (f"cpu {torch.backends.cpu.get_cpu_capability()}, onednn {onednn or 'native'}, "
            f"{threads} thread{'s' if threads > 1 else ''}")  # fmt: skip


def environment_summary() -> dict[str, Any]:
    """Launcher-visible facts about this process (for run.json)."""
    return {
        "pid": os.getpid(),
        "cuda_available": torch.cuda.is_available(),
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "fill_uninitialized_memory": bool(torch.utils.deterministic.fill_uninitialized_memory),  # type: ignore[attr-defined]
    }
