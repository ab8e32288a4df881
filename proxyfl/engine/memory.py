"""A rank's memory: its budget, the sizes taken from it, its peaks, and what an
out-of-memory error tells the user.

Budget: ``gpu_memory_gb`` when set, else the device's memory over the ranks that share it,
at most :data:`SHARED_GPU_RANK_GB` on a GPU that several ranks share (four ranks on one
80 GB card: 6 GB each, not 20: ranks that time-slice one card go no faster for holding
more; on a CPU the node's memory over its ranks). The
func engine's chunks of per-example gradients and the evaluation batch are sized so that
their estimated need (:func:`proxyfl.privacy.per_sample.estimated_bytes_per_example`) stays
within :data:`BUDGET_SHARE` of it, leaving the rest to the models, the optimizers' state,
the loader's batches and the allocator's slack.
"""

from __future__ import annotations

import re
import resource
import sys
from dataclasses import dataclass

import torch

from plumbing.errors import PipelineError

GB = 1e9
# a rank's budget on a GPU it shares with other ranks (the GPU bench's target, docs/gpu.md)
SHARED_GPU_RANK_GB = 6.0
# of a rank's budget, what its chunk of per-example gradients (or an evaluation batch) may take
BUDGET_SHARE = 0.5
# what an allocator's message says it tried to allocate (CUDA: "Tried to allocate 2.00 GiB";
# torch's CPU allocator: "you tried to allocate 1228800000 bytes")
_TRIED = re.compile(r"[Tt]ried to allocate ([0-9.]+) ?(bytes|[KMGT]i?B)")
_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
          "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}  # fmt: skip


class OutOfMemoryError(PipelineError):
    """A step or an evaluation batch did not fit in its device's memory (the message
    says where, at which batch, what it needed and what to lower)."""

    def __init__(self, reason: str) -> None:
        super().__init__(None, reason)


def device_memory_bytes(device: torch.device) -> int:
    """All the memory of ``device``: a GPU's, or this machine's for the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)


def rank_budget_bytes(
    device: torch.device, ranks_on_device: int, gpu_memory_gb: float | None
) -> float:
    """One rank's memory budget: ``gpu_memory_gb``, or its share of the device's memory
    (at most :data:`SHARED_GPU_RANK_GB` on a shared GPU)."""
    if gpu_memory_gb is not None:
        return gpu_memory_gb * GB
    share = device_memory_bytes(device) / max(1, ranks_on_device)
    if device.type == "cuda" and ranks_on_device > 1:
        return min(share, SHARED_GPU_RANK_GB * GB)
    return share


def batch_within(budget_bytes: float, bytes_per_example: float, wanted: int) -> int:
    """``wanted``, or fewer where that many examples would take more than the budget's share
    (at least 1)."""
    if bytes_per_example <= 0:
        return wanted
    return int(max(1, min(wanted, BUDGET_SHARE * budget_bytes // bytes_per_example)))


def reset_peaks(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def memory_peaks(device: torch.device) -> dict[str, float]:
    """Peak memory of this rank in GB: allocated and reserved on its GPU (torch's caching
    allocator), and the process's resident set (every device)."""
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss = maxrss * (1 if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB on Linux
    peaks = {"peak_rss_gb": round(rss / GB, 3)}
    if device.type == "cuda":
        peaks["peak_gpu_allocated_gb"] = round(torch.cuda.max_memory_allocated(device) / GB, 3)
        peaks["peak_gpu_reserved_gb"] = round(torch.cuda.max_memory_reserved(device) / GB, 3)
    return peaks


def is_out_of_memory(error: BaseException) -> bool:
    """Is ``error`` an allocation that failed: CUDA's ``torch.OutOfMemoryError``, or
    torch's CPU allocator's ("DefaultCPUAllocator: can't allocate memory")?"""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def requested_bytes(error: BaseException) -> float | None:
    """The allocation the allocator's message says failed, in bytes (``None``: not said)."""
    match = _TRIED.search(str(error))
    if match is None:
        return None
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class MemoryContext:
    """What a message about an out-of-memory error names."""

    device: torch.device
    what: str  # "a training step", "an evaluation batch"
    batch: int
    expected_batch: int | None
    budget_bytes: float
    device_bytes: int
    ranks_on_device: int


def out_of_memory_message(error: BaseException, context: MemoryContext) -> str:
    """One line: where it ran out, at which batch, what it needed against what the device
    has, and what to lower."""
    requested = requested_bytes(error)
    need = (f"an allocation of {requested / GB:.2f} GB more failed"
            if requested is not None else "an allocation failed")  # fmt: skip
    batch = f"batch {context.batch}"
    if context.expected_batch is not None:
        batch += f" (Poisson batches of mean {context.expected_batch}; {context.batch} is the "
        batch += "largest a run plausibly draws)"
    shared = (f", shared by {context.ranks_on_device} ranks"
              if context.ranks_on_device > 1 else "")  # fmt: skip
    if context.what == "an evaluation batch":
        lower = "lower train.options.eval_batch_size (or gpu_memory_gb)"
    else:
        lower = ("lower train.options.batch_size or input_size, or dp_chunk_size (func "
                 "engine), or run fewer ranks per device")  # fmt: skip
    return (
        f"out of memory on {context.device} in {context.what} at {batch}: {need}; the "
        f"device has {context.device_bytes / GB:.1f} GB{shared}, this rank's budget is "
        f"{context.budget_bytes / GB:.1f} GB; {lower}"
    )
