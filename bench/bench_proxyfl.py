"""Benchmarks of ProxyFL's two costs: the DP mutual-learning step and the proxy exchange.

(a) One DML step of a GroupNorm ResNet-18 pair (or ``--models PRIVATE PROXY``) — private
    model (Adam) and proxy (DP-Adam: per-example gradients, clipping, noise, through each
    DP engine: torch.func and Opacus' hooks) — against the same step with both models on
    plain Adam. Reports samples/s (medians, the variants interleaved) and the slowdowns.
(b) One round's proxy exchange among 4 MPI ranks: the project's single float32 buffer
    through ``Sendrecv`` against a pickled state dict through ``sendrecv`` (what the
    reference implementation does); then PushSum (exponential graph) against the server
    average (``Reduce`` + ``Bcast`` on rank 0) from 2 to 8 ranks. Medians over repeats,
    timed between barriers.

    python -m bench.bench_proxyfl [--device auto|cpu|cuda] [--input-size S] [--batch-size B]
                                  [--models PRIVATE PROXY] [--threads N] [--skip-exchange]

Part (b) launches ``mpiexec -n K python -m mpi4py -m bench.bench_proxyfl --exchange-worker``
itself. On a CPU-only machine ranks oversubscribe the cores, so (b) measures shared-memory
copies and scheduling rather than a network; on a GPU server run it as is.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


# -- (a) the DML step ---------------------------------------------------------------------
def _synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_dml_step(
    device_name: str,
    input_size: int,
    batch: int,
    repeats: int,
    models: tuple[str, str] = ("resnet18_gn", "resnet18_gn"),
    threads: int | None = None,
) -> dict:
    """Median seconds of one DML step (private model with Adam, proxy) without DP and with
    DP-SGD on the proxy through each engine (``opacus``: hooks; ``func``: torch.func, as a
    run takes it on this device), the variants interleaved step by step so that a noisy
    machine slows them alike."""
    import torch
    from torch.utils.data import TensorDataset

    from proxyfl.algorithms.dml import dml_losses, mutual_learning_loss
    from proxyfl.engine.models import build_model
    from proxyfl.engine.runtime import choose_device
    from proxyfl.privacy.dp import make_private

    device = choose_device(device_name, 0)
    if device.type == "cpu":
        torch.set_num_threads(threads or os.cpu_count() or 1)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    x = torch.randn(batch, 3, input_size, input_size, device=device)
    y = torch.randint(0, 2, (batch,), device=device)
    dataset = TensorDataset(torch.zeros(batch * 4, 3, 1, 1), torch.zeros(batch * 4).long())

    def pair() -> tuple[Any, Any, Any]:
        torch.manual_seed(0)
        private = build_model(models[0], 2, input_size).to(device)
        proxy = build_model(models[1], 2, input_size).to(device)
        return private, torch.optim.Adam(private.parameters(), lr=1e-3), proxy

    private, private_opt, proxy = pair()
    proxy_opt = torch.optim.Adam(proxy.parameters(), lr=1e-3)

    def plain_step() -> None:
        private_opt.zero_grad(set_to_none=True)
        proxy_opt.zero_grad(set_to_none=True)
        private_loss, proxy_loss = dml_losses(private(x), proxy(x), y, 0.3, 0.3)
        private_loss.backward()
        proxy_loss.backward()
        private_opt.step()
        proxy_opt.step()

    def objective(logits: Any, targets: Any, partner: Any) -> Any:
        return mutual_learning_loss(logits, partner, targets, 0.3)

    def dp_step_of(engine: str) -> Any:
        dp_private, dp_private_opt, dp_proxy = pair()
        dp = make_private(
            dp_proxy, torch.optim.Adam(dp_proxy.parameters(), lr=1e-3), dataset,
            batch_size=batch, sigma=1.4, clip=0.7,
            sampler_generator=torch.Generator().manual_seed(0),
            noise_generator=torch.Generator(device=device).manual_seed(1), engine=engine,
            compiled=cuda and engine == "func", autocast=cuda and engine == "func",
        )  # fmt: skip

        def step() -> None:
            dp_private_opt.zero_grad(set_to_none=True)
            private_logits = dp_private(x)
            _, proxy_logits = dp.step(x, y, objective, private_logits.detach())
            mutual_learning_loss(private_logits, proxy_logits, y, 0.3).backward()
            dp_private_opt.step()

        return step

    variants = {"plain": plain_step, "opacus": dp_step_of("opacus"), "func": dp_step_of("func")}
    times: dict[str, list[float]] = {name: [] for name in variants}
    peaks: dict[str, float | None] = {}
    for name, step in variants.items():  # warm-up (allocations, autotuning, compilation)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        step()
        step()
        peaks[name] = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    for _ in range(repeats):
        for name, step in variants.items():
            _synchronize(device)
            start = time.perf_counter()
            step()
            _synchronize(device)
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in times.items()}
    return {
        "device": str(device),
        "models": list(models),
        "input_size": input_size,
        "batch_size": batch,
        "repeats": repeats,
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "plain_step_s": median["plain"],
        "dp_step_s": median["func"],
        "opacus_step_s": median["opacus"],
        "plain_samples_per_s": batch / median["plain"],
        "dp_samples_per_s": batch / median["func"],
        "opacus_samples_per_s": batch / median["opacus"],
        "dp_slowdown": median["func"] / median["plain"],
        "opacus_slowdown": median["opacus"] / median["plain"],
        "cuda_peak_gib": peaks,
    }


# -- (b) the exchange, run inside mpiexec -------------------------------------------------
def _numpy_state(model: Any) -> dict[str, Any]:
    """The reference code's message: the state dict as a dict of numpy arrays (pickled)."""
    return {key: value.detach().cpu().numpy() for key, value in model.state_dict().items()}


def exchange_worker(repeats: int, modes: list[str]) -> None:
    """Time each exchange mode on every rank; rank 0 prints one JSON line of medians."""
    import numpy as np
    import torch
    from mpi4py import MPI

    from proxyfl.comm.exchange import (
        Communicator,
        SendLog,
        assign_flat_parameters,
        flatten_parameters,
    )
    from proxyfl.comm.graphs import parse_schedule_spec
    from proxyfl.engine.models import build_model

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    torch.manual_seed(rank)
    model = build_model("resnet18_gn", 2, 64)
    communicator = Communicator(comm, SendLog(with_digests=False))
    members = list(range(size))
    schedule = parse_schedule_spec("exponential")

    def buffer_push_sum(t: int) -> float:
        theta = flatten_parameters(model)
        matrix = schedule.matrix(t, members, size)
        new, _, seconds = communicator.push_sum(theta, 1.0, matrix, members, t + 1)
        assign_flat_parameters(model, new)
        return seconds

    def pickled_sendrecv(t: int) -> float:
        shift = 2 ** (t % ((size - 1).bit_length()))
        start = time.perf_counter()
        received = comm.sendrecv(
            _numpy_state(model), dest=(rank + shift) % size, source=(rank - shift) % size
        )
        seconds = time.perf_counter() - start
        model.load_state_dict({k: torch.from_numpy(v) for k, v in received.items()})
        return seconds

    def server_average(t: int) -> float:
        theta = flatten_parameters(model)
        average, seconds = communicator.server_average(theta, members, t + 1)
        assert average is not None
        assign_flat_parameters(model, average)
        return seconds

    actions = {"buffer": buffer_push_sum, "pickle": pickled_sendrecv, "server": server_average}
    results: dict[str, float] = {}
    for mode in modes:
        action = actions[mode]
        action(0)  # warm-up
        times, in_mpi = [], []
        for t in range(repeats):
            comm.Barrier()
            start = time.perf_counter()
            in_mpi.append(action(t))
            comm.Barrier()
            times.append(time.perf_counter() - start)
        results[mode] = float(np.median(times))  # whole exchange, rank 0
        results[f"{mode}_mpi"] = float(np.median(in_mpi))  # inside the MPI call(s)
    if rank == 0:
        n_values = sum(p.numel() for p in model.parameters())
        print(json.dumps({"ranks": size, "values": n_values, **results}), flush=True)


def _launch_exchange(ranks: int, repeats: int, modes: list[str], timeout: float) -> dict:
    from proxyfl.launch.address_exchange import relaunched_on_unequal_addresses
    from proxyfl.launch.placement import Placement

    placement = Placement()  # the training jobs' own: this machine, ranks over shared memory
    command = [
        *placement.command_prefix(ranks), sys.executable, "-m", "mpi4py", "-m",
        "bench.bench_proxyfl", "--exchange-worker", "--repeats", str(repeats),
        "--modes", *modes,
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(placement.environment())
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONWARNINGS"] = "ignore"
    result = relaunched_on_unequal_addresses(lambda: subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    ))  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"exchange benchmark with {ranks} ranks failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- driver -------------------------------------------------------------------------------
def _defaults(device: str) -> tuple[int, int, int]:
    """(input size, batch, repeats): 512 px everywhere; on CPU a small batch and few repeats."""
    import torch

    if device != "cpu" and torch.cuda.is_available():
        return 512, 32, 10
    return 512, 4, 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_proxyfl", description=__doc__)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--input-size", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--models",
        nargs=2,
        default=["resnet18_gn", "resnet18_gn"],
        metavar=("PRIVATE", "PROXY"),
        help="the DML pair (the demo's: cnn2 cnn1)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads (a rank's: 1; default all cores)"
    )
    parser.add_argument("--exchange-repeats", type=int, default=7)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--skip-step", action="store_true")
    parser.add_argument("--skip-exchange", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--exchange-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--modes", nargs="+", default=["buffer"], help=argparse.SUPPRESS)
    args = parser.parse_args([] if argv is None else argv)

    if args.exchange_worker:
        exchange_worker(args.repeats or 7, args.modes)
        return 0

    report: dict[str, Any] = {}
    if not args.skip_step:
        size, batch, repeats = _defaults(args.device)
        step = bench_dml_step(
            args.device, args.input_size or size, args.batch_size or batch, args.repeats or repeats,
            models=tuple(args.models), threads=args.threads,
        )  # fmt: skip
        report["dml_step"] = step
        print(f"(a) one DML step, private {step['models'][0]} + proxy {step['models'][1]} "
              f"({step['device']}, {step['input_size']} px, batch {step['batch_size']}, "
              f"threads {step['threads']}, median of {step['repeats']}, interleaved)")  # fmt: skip
        print(f"    without DP      : {step['plain_step_s']:8.3f} s/step "
              f"{step['plain_samples_per_s']:8.2f} samples/s")  # fmt: skip
        print(
            f"    proxy DP, func  : {step['dp_step_s']:8.3f} s/step "
            f"{step['dp_samples_per_s']:8.2f} samples/s   {step['dp_slowdown']:5.2f}x no DP"
        )
        print(f"    proxy DP, opacus: {step['opacus_step_s']:8.3f} s/step "
              f"{step['opacus_samples_per_s']:8.2f} samples/s   "
              f"{step['opacus_slowdown']:5.2f}x no DP")  # fmt: skip
        print(f"    opacus / func   : {step['opacus_step_s'] / step['dp_step_s']:8.2f}x")
    if not args.skip_exchange:
        timeout = 600
        four = _launch_exchange(4, args.exchange_repeats, ["buffer", "pickle"], timeout)
        report["exchange_4_ranks"] = four
        print(f"(b) proxy exchange among 4 ranks ({four['values']:,} float32 values, "
              f"median of {args.exchange_repeats})")  # fmt: skip
        print("    per round (ms)                 whole exchange   in the MPI call")
        for key, name in (("buffer", "one float32 buffer, Sendrecv"),
                          ("pickle", "pickled state dict, sendrecv")):  # fmt: skip
            print(f"    {name:30s} {four[key] * 1e3:14.1f} {four[key + '_mpi'] * 1e3:17.1f}")
        print(f"    pickle / buffer                {four['pickle'] / four['buffer']:14.2f}x"
              f"{four['pickle_mpi'] / four['buffer_mpi']:16.2f}x")  # fmt: skip
        scaling = [
            _launch_exchange(n, args.exchange_repeats, ["buffer", "server"], timeout)
            for n in args.ranks
        ]
        report["exchange_scaling"] = scaling
        print("    ranks   PushSum ms (MPI)   server avg ms (MPI)   server / PushSum")
        for row in scaling:
            push, push_mpi = row["buffer"] * 1e3, row["buffer_mpi"] * 1e3
            server, server_mpi = row["server"] * 1e3, row["server_mpi"] * 1e3
            print(f"    {row['ranks']:5d} {push:8.1f} ({push_mpi:6.1f})"
                  f" {server:11.1f} ({server_mpi:6.1f}) {server / push:12.2f}x")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
