"""A rank's memory (proxyfl/engine/memory.py): budgets, sizes taken from them, real
allocation failures recognised and told with what to lower."""

from __future__ import annotations

import pytest
import torch

from proxyfl.engine.memory import (
    GB,
    MemoryContext,
    batch_within,
    is_out_of_memory,
    memory_peaks,
    out_of_memory_message,
    rank_budget_bytes,
    requested_bytes,
)
from proxyfl.engine.models import build_model
from proxyfl.privacy.per_sample import (
    activation_bytes_per_example,
    chunk_size_for,
    estimated_bytes_per_example,
)


def _cpu_allocation_failure() -> RuntimeError:
    """torch's CPU allocator refusing 1.2 PB (no machine has it: refused at once)."""
    with pytest.raises(RuntimeError) as caught:
        torch.empty(10**11, 3, 32, 32)
    return caught.value


def test_a_real_allocation_failure_is_recognised_with_its_size() -> None:
    error = _cpu_allocation_failure()
    assert is_out_of_memory(error)
    assert requested_bytes(error) == 10**11 * 3 * 32 * 32 * 4
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("can't allocate memory"))


def test_cuda_messages_give_their_size() -> None:
    """CUDA's wording (torch.OutOfMemoryError's message), read without a GPU."""
    message = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
               "of 79.19 GiB of which 1.2 GiB is free.")  # fmt: skip
    assert requested_bytes(RuntimeError(message)) == 2 * 2**30
    assert is_out_of_memory(torch.OutOfMemoryError(message))
    assert requested_bytes(RuntimeError("no size said")) is None


def test_the_message_names_device_batch_need_and_what_to_lower() -> None:
    context = MemoryContext(device=torch.device("cuda", 0), what="a training step", batch=53,
                            expected_batch=32, budget_bytes=20 * GB, device_bytes=80 * 10**9,
                            ranks_on_device=4)  # fmt: skip
    error = RuntimeError("CUDA out of memory. Tried to allocate 3.00 GiB.")
    text = out_of_memory_message(error, context)
    for part in ("cuda:0", "a training step at batch 53", "mean 32", "3.22 GB more",
                 "80.0 GB, shared by 4 ranks", "budget is 20.0 GB", "lower train.options."
                 "batch_size"):  # fmt: skip
        assert part in text, (part, text)
    evaluation = out_of_memory_message(error, MemoryContext(
        device=torch.device("cpu"), what="an evaluation batch", batch=512, expected_batch=None,
        budget_bytes=GB, device_bytes=2 * 10**9, ranks_on_device=1))  # fmt: skip
    assert "eval_batch_size" in evaluation and "shared by" not in evaluation
    assert "\n" not in text


def test_budgets_and_sizes() -> None:
    cpu = torch.device("cpu")
    assert rank_budget_bytes(cpu, 4, 6.0) == 6 * GB
    assert rank_budget_bytes(cpu, 2, None) == pytest.approx(rank_budget_bytes(cpu, 1, None) / 2)
    assert batch_within(10 * GB, 1 * GB, 64) == 5  # half the budget: 5 examples of 1 GB
    assert batch_within(10 * GB, 1.0, 64) == 64
    assert batch_within(1.0, 1 * GB, 64) == 1  # never below one
    assert chunk_size_for(10 * GB, 1 * GB, 53) == 10
    assert chunk_size_for(1000 * GB, 1 * GB, 53) == 53
    assert chunk_size_for(0.1 * GB, 1 * GB, 53) == 1


def test_estimates_grow_with_the_input_and_count_the_parameters() -> None:
    torch.manual_seed(0)
    model = build_model("resnet18_gn", 2, 64)
    small = activation_bytes_per_example(model, torch.zeros(1, 3, 32, 32))
    large = activation_bytes_per_example(model, torch.zeros(1, 3, 64, 64))
    assert 3.5 < large / small < 4.5  # activations scale with the pixels
    parameters = sum(p.numel() for p in model.parameters()) * 4
    estimate = estimated_bytes_per_example(model, torch.zeros(1, 3, 64, 64))
    assert estimate == 3 * parameters + 2 * large
    assert not any(h for m in model.modules() for h in m._forward_hooks.values())  # removed


def test_peaks_report_this_process() -> None:
    peaks = memory_peaks(torch.device("cpu"))
    assert 0.01 < peaks["peak_rss_gb"] < 100
    assert "peak_gpu_allocated_gb" not in peaks


def test_a_rank_takes_the_lean_allocator_and_deterministic_mode_before_cuda() -> None:
    """configure_torch (in a process of its own for each case: it sets process-wide state):
    the allocator's expandable segments unless the user chose, cuBLAS's deterministic
    workspace and torch's deterministic mode when asked; the launcher gives a job's ranks
    the allocator too. Each case is a child forked from one interpreter that imported
    torch, as a warm server forks its ranks (one import of torch, not one a case)."""
    import json
    import subprocess
    import sys

    from proxyfl.launch.job import rank_environment
    from proxyfl.launch.placement import Placement

    probe = (
        "import json, os, sys, torch\n"
        "from proxyfl.engine.runtime import configure_torch\n"
        "for mode, extra in json.loads(sys.argv[1]):\n"
        "    child = os.fork()\n"
        "    if child == 0:\n"
        "        os.environ.update(extra)\n"
        "        configure_torch(mode == 'on')\n"
        "        print(os.environ.get('PYTORCH_CUDA_ALLOC_CONF'),"
        " os.environ.get('CUBLAS_WORKSPACE_CONFIG'),"
        " torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,"
        " torch.utils.deterministic.fill_uninitialized_memory, flush=True)\n"
        "        os._exit(0)\n"
        "    assert os.waitpid(child, 0)[1] == 0\n"
    )
    clean = {k: v for k, v in __import__("os").environ.items()
             if k not in ("PYTORCH_CUDA_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG")}  # fmt: skip
    cases = [("on", {}), ("off", {}), ("on", {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"})]
    done = subprocess.run([sys.executable, "-c", probe, json.dumps(cases)], capture_output=True,
                          text=True, check=True, env=clean)  # fmt: skip
    on, off, chosen = done.stdout.strip().splitlines()

    # deterministic, without torch's fill of fresh memory (proxyfl.engine.runtime)
    assert on == "expandable_segments:True :4096:8 True False False"
    assert off == "expandable_segments:True None False False False"
    assert chosen.startswith("max_split_size_mb:128 ")
    assert rank_environment(Placement())["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert (
        rank_environment(Placement(), {"PYTORCH_CUDA_ALLOC_CONF": "x"})["PYTORCH_CUDA_ALLOC_CONF"]
        == "x"
    )
