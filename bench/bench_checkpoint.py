"""A round's checkpoint at the paper's scale, on a rank's critical path, side by side.

The state is a ProxyFL rank's at 512² (two GroupNorm ResNet-18s, private and proxy, each
with its Adam moments: ~270 MB). Each round "trains" for ``--round-seconds`` and then
checkpoints, as :func:`proxyfl.loop.run_training` does:

* **in line** (before): :func:`~proxyfl.engine.checkpoint.save_checkpoint`, serialised,
  written, fsynced and renamed while the round waits;
* **writer** (now): :class:`~proxyfl.engine.checkpoint.CheckpointWriter`, the round waits
  for the state's copy (``submit``) and, before the next round's barrier, for whatever of
  the write is left (``wait``).

The round's training is either idle for the CPU (``sleep``: a GPU rank, whose CPU waits
on its kernels) or one CPU thread busy (``busy``: a CPU rank on a machine with a core to
spare for the writer). Printed: the median seconds a round spends on its checkpoint, over
``--rounds`` rounds after one warm-up, and the ratio.

    python -m bench.bench_checkpoint [--rounds N] [--round-seconds S]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _paper_state() -> dict[str, Any]:
    import torch

    from proxyfl.engine.models import build_model

    state: dict[str, Any] = {"round": 1}
    for name in ("private", "proxy"):
        model = build_model("resnet18_gn", 2, 512)
        optimizer = torch.optim.Adam(model.parameters())
        for parameter in model.parameters():
            parameter.grad = torch.zeros_like(parameter)
        optimizer.step()  # the moments exist, as after a round
        state[f"{name}_model"] = model.state_dict()
        state[f"{name}_optimizer"] = optimizer.state_dict()
    return state


def _train(seconds: float, busy: bool) -> None:
    import torch

    if not busy:
        time.sleep(seconds)
        return
    a = torch.randn(256, 256)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a.T / 256)


def bench_checkpoint(rounds: int, round_seconds: float, busy: bool) -> dict[str, float]:
    import torch

    from proxyfl.engine.checkpoint import CheckpointWriter, checkpoint_path, save_checkpoint

    torch.set_num_threads(1)
    state = _paper_state()
    inline, writer_seconds, size = [], [], 0.0
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as folder:
        run_dir = Path(folder)
        for round_number in range(rounds + 1):
            _train(round_seconds, busy)
            started = time.perf_counter()
            save_checkpoint(run_dir / "inline", 0, round_number + 1, state)
            inline.append(time.perf_counter() - started)
        size = checkpoint_path(run_dir / "inline", 0, rounds + 1).stat().st_size / 1e6
        with CheckpointWriter(run_dir / "writer", 0, keep=2) as writer:
            for round_number in range(rounds + 1):
                _train(round_seconds, busy)
                started = time.perf_counter()
                writer.wait()  # before the barrier: what is left of the last round's write
                writer.submit(round_number + 1, state)
                writer_seconds.append(time.perf_counter() - started)
    return {"inline": statistics.median(inline[1:]),
            "writer": statistics.median(writer_seconds[1:]), "megabytes": size}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_checkpoint", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round-seconds", type=float, default=1.0,
                        help="each round's training before its checkpoint")  # fmt: skip
    args = parser.parse_args([] if argv is None else argv)
    for busy in (False, True):
        kind = "one CPU thread busy" if busy else "CPU idle (a GPU rank)"
        result = bench_checkpoint(args.rounds, args.round_seconds, busy)
        print(f"a ProxyFL rank's checkpoint at 512² ({result['megabytes']:.0f} MB), "
              f"{args.round_seconds:g} s rounds, {kind}: seconds a round waits, median of "
              f"{args.rounds}")  # fmt: skip
        print(f"    in line (before) {result['inline']:6.3f} s")
        print(
            f"    writer (now)     {result['writer']:6.3f} s   ratio "
            f"{result['inline'] / result['writer']:.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
