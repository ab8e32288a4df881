"""What a training job spends outside training, each change measured side by side.

(a) A rank's imports: ``python -c`` of everything ``proxyfl.run`` imports before its first
    round, as it is (torchvision deferred to ResNet-18) against the same with torchvision
    imported eagerly (as before). Fresh interpreters, interleaved, median wall seconds.
(b) ε over a 10-round run, asked three times a round (metrics, log line, rank record):
    Opacus' accountant every time, once a round (the history's answer cached), and one
    step's RDP computed once per (σ, q) and scaled by the steps (as now; the same bits).
(c) Evaluation of a cnn2 private + cnn1 proxy pair (the demo's) on a merged test set of
    ``--test`` 32×32 patches: the models' inference path (conv → pool → ReLU, channels-last
    on a CPU) at the demo's eval batch (16) against the same path channels-first (as before)
    and against the training path (conv → ReLU → pool, as two changes ago), eval batch sizes,
    and 1 against 2 intra-op threads; each variant's probabilities compared with the
    default's: the largest difference, and whether every prediction is the same.

(d) A 4-rank job that only starts and ends (``bench.noop_rank``: a training rank's
    imports, MPI's initialisation, a barrier, its exit) under MPICH's fork launcher, every
    rank its own interpreter (cold, as before) against ranks forked from one warm server
    (:mod:`plumbing.warm`, as :func:`proxyfl.launch.job.run_job` starts them now); the
    launcher's wall from its start to its exit, the server's start included. Interleaved,
    medians.
(e) ``--jobs`` such jobs in a row, as ``flows.train`` runs a flow's jobs: each with a warm
    server of its own (before) against one server kept for them all
    (:func:`proxyfl.launch.job.warm_ranks`, as the flows do now). Interleaved, medians.
(f) A rank's end: a process forked from one that imported the ranks' modules (as a warm
    server has) runs a step of torch, then the C library's ``exit``: with the destructors of
    everything imported (before) against ending after the handlers registered since
    (:func:`plumbing.exit_early.exit_here`, as ``proxyfl.run`` does now); the forked
    process's CPU seconds (user + system), interleaved, median.
(g) A command's start and end with the cyclic collector walking its imports (before)
    against paused while it imports and its imports frozen after (:mod:`plumbing.collector`,
    as now): ``python -m flows.report --help`` (Prefect's imports, the interpreter's exit)
    run as a module (now) and through ``runpy`` from ``-c`` (as before: nothing pauses); a
    warm server's imports (``RANK_IMPORTS``, collected and frozen as the server does). Each
    process's CPU seconds (user + system), fresh interpreters, interleaved, median.
(h) A Prefect server's start, to its first healthy answer: ``prefect server start``
    (before) against ``python -m flows.prefect_api`` (:func:`flows.server.prefect_server`
    now), each on its own copy of one Prefect home whose database is migrated (as every
    start after a home's first). The server's CPU seconds (user + system) when it first
    answers, and the wall to it; interleaved, medians. 2026-12-03, Zen 4, quiet, 7
    repeats: 6.12 s of CPU and 6.07 s of wall before, 5.11 s and 5.06 s now (1.20x).

    python -m bench.bench_startup [--repeats N] [--test N] [--ranks N] [--jobs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RANK_IMPORTS = (
    "import proxyfl.run; from mpi4py import MPI; "
    "import proxyfl.algorithms.strategies, proxyfl.engine.runtime, proxyfl.loop, "
    "proxyfl.records, proxyfl.trainer, proxyfl.engine.data"
)


def _imports_seconds(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
    return time.perf_counter() - started


def bench_imports(repeats: int) -> dict[str, float]:
    eager = "import torchvision.models.resnet; " + RANK_IMPORTS
    before, after = [], []
    for _ in range(repeats):  # interleaved: the machine's load hits both alike
        before.append(_imports_seconds(eager))
        after.append(_imports_seconds(RANK_IMPORTS))
    return {"before": statistics.median(before), "after": statistics.median(after)}


def bench_epsilon(repeats: int) -> dict[str, float]:
    """Seconds of ε over one run's rounds (each round a longer history, asked 3 times)."""
    from opacus.accountants import RDPAccountant

    from proxyfl.privacy import accounting

    def accountant(steps: tuple[tuple[float, float, int], ...]) -> float:
        opacus = RDPAccountant()
        opacus.history = list(steps)
        return opacus.get_epsilon(1e-5)

    variants: dict[str, list[float]] = {"asked": [], "history": [], "step": []}
    for r in range(repeats):  # interleaved; σ differs per repeat, so no cache is warm
        sigma = 1.4 + r / 1000
        histories = [((sigma, 32 / 480, 15 * round_number),) for round_number in range(1, 11)]
        started = time.perf_counter()
        for steps in histories:
            for _ in range(3):
                accountant(steps)
        variants["asked"].append(time.perf_counter() - started)
        started = time.perf_counter()
        for steps in histories:
            accountant(steps)  # once a round, the answer kept for the other two
        variants["history"].append(time.perf_counter() - started)
        started = time.perf_counter()
        for steps in histories:
            for _ in range(3):
                accounting.epsilon_from_history(steps, 1e-5)
        variants["step"].append(time.perf_counter() - started)
    return {name: statistics.median(seconds) for name, seconds in variants.items()}


def bench_eval(repeats: int, n_test: int) -> dict[str, dict[str, float | bool]]:
    import numpy as np
    import torch

    from proxyfl.engine.data import open_split
    from proxyfl.engine.evaluate import evaluate_with_probabilities
    from proxyfl.engine.models import build_model, max_pool_2x2
    from tests.proxyfl.conftest import write_stores

    with tempfile.TemporaryDirectory() as folder:
        data = write_stores(Path(folder), centers=(0, 1, 2, 3), n_train=8,
                            n_test=n_test // 4, size=32)  # fmt: skip
        splits = [open_split(data, c, "test") for c in range(4)]
        torch.manual_seed(0)
        models = {"private": build_model("cnn2", 2, 32), "proxy": build_model("cnn1", 2, 32)}
        cpu = torch.device("cpu")

        class TrainingPath(torch.nn.Module):
            """A conv net evaluated as training runs it (conv → ReLU → pool)."""

            def __init__(self, model: torch.nn.Module) -> None:
                super().__init__()
                self.model = model

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.model.classifier(self.model.features(x))

        class ChannelsFirst(TrainingPath):
            """The inference path as it was before channels-last: conv → pool → ReLU on
            channels-first activations."""

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                conv_1, _, _, conv_2, _, _, flatten = self.model.features
                x = max_pool_2x2(conv_1(x)).relu_()
                x = max_pool_2x2(conv_2(x)).relu_()
                return self.model.classifier(flatten(x))

        paths = {
            "channels-last": models,
            "channels-first": {name: ChannelsFirst(m) for name, m in models.items()},
            "training": {name: TrainingPath(m) for name, m in models.items()},
        }

        def run(batch: int, threads: int, path: str) -> tuple[float, dict[str, np.ndarray]]:
            torch.set_num_threads(threads)
            chosen = paths[path]
            evaluate_with_probabilities(chosen, splits, 2, cpu, None, batch)  # warm-up
            times, probabilities = [], {}
            for _ in range(repeats):
                started = time.perf_counter()
                _, probabilities = evaluate_with_probabilities(chosen, splits, 2, cpu, None, batch)
                times.append(time.perf_counter() - started)
            return statistics.median(times), probabilities

        variants = {"batch 16 (now)": (16, 1, "channels-last"),
                    "channels-first, 128 (before)": (128, 1, "channels-first"),
                    "training path, 128": (128, 1, "training"),
                    "channels-first, 16": (16, 1, "channels-first"),
                    "batch 8": (8, 1, "channels-last"),
                    "batch 32": (32, 1, "channels-last"),
                    "batch 128": (128, 1, "channels-last"),
                    "batch 16, 2 threads": (16, 2, "channels-last")}  # fmt: skip
        results: dict[str, dict[str, float | bool]] = {}
        reference = None
        for name, (batch, threads, path) in variants.items():
            seconds, probabilities = run(batch, threads, path)
            reference = reference or probabilities
            results[name] = {
                "seconds": seconds,
                "max_difference": max(
                    float(np.abs(probabilities[k] - reference[k]).max()) for k in reference
                ),
                "same_predictions": all(
                    np.array_equal(probabilities[k].argmax(1), reference[k].argmax(1))
                    for k in reference
                ),
            }
        torch.set_num_threads(1)
        return results


def _job_seconds(ranks: int, warm: bool) -> float:
    import os

    from plumbing.warm import warm_server
    from proxyfl.launch.job import RANK_IMPORTS
    from proxyfl.launch.placement import SHARED_MEMORY_ONLY, mpiexec_path

    launcher = mpiexec_path().with_name("mpiexec.gforker")
    env = {**os.environ, **SHARED_MEMORY_ONLY, "PYTHONPATH": str(REPO)}
    program = [sys.executable, "-m", "mpi4py", "-m", "bench.noop_rank"]
    started = time.perf_counter()
    with warm_server(env, RANK_IMPORTS if warm else ()) as server:
        if warm:
            assert server is not None, "no warm server here (Linux only)"
            env.update(server.environment())
            program = server.program(program)
        subprocess.run([str(launcher), "-n", str(ranks), *program], cwd=REPO, env=env,
                       check=True)  # fmt: skip
        seconds = time.perf_counter() - started
    return seconds


def _flow_seconds(ranks: int, jobs: int, kept: bool) -> float:
    """``jobs`` no-op jobs in a row, as a flow runs them: each with a warm server of its own
    (before), or all inside one kept server (now). The flow's wall, servers included."""
    import contextlib
    import os

    from plumbing.warm import kept_warm_server
    from proxyfl.launch.job import RANK_IMPORTS
    from proxyfl.launch.placement import SHARED_MEMORY_ONLY

    env = {**os.environ, **SHARED_MEMORY_ONLY, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    block = kept_warm_server(env, RANK_IMPORTS) if kept else contextlib.nullcontext()
    with block:
        for _ in range(jobs):
            _job_seconds(ranks, warm=True)
    return time.perf_counter() - started


def bench_flow(repeats: int, ranks: int, jobs: int) -> dict[str, float]:
    own, kept = [], []
    for _ in range(repeats):  # interleaved
        own.append(_flow_seconds(ranks, jobs, kept=False))
        kept.append(_flow_seconds(ranks, jobs, kept=True))
    return {"own": statistics.median(own), "kept": statistics.median(kept)}


def bench_job(repeats: int, ranks: int) -> dict[str, float]:
    cold, warm = [], []
    for _ in range(repeats):  # interleaved
        cold.append(_job_seconds(ranks, warm=False))
        warm.append(_job_seconds(ranks, warm=True))
    return {"cold": statistics.median(cold), "warm": statistics.median(warm),
            "cold_max": max(cold), "warm_max": max(warm)}  # fmt: skip


_RANK_END = """\
import ctypes, importlib, json, os, sys
from plumbing.exit_early import exit_here
from proxyfl.launch.job import RANK_IMPORTS
for name in RANK_IMPORTS:
    importlib.import_module(name)
seconds = {"exit": [], "exit_here": []}
for _ in range(int(sys.argv[1])):
    for mode in seconds:  # interleaved
        pid = os.fork()
        if pid == 0:
            if mode == "exit_here":
                exit_here()
            import torch
            x = torch.randn(64, 64, requires_grad=True)
            (x @ x).sum().backward()
            ctypes.PyDLL(None).exit(0)
        _, status, usage = os.wait4(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        seconds[mode].append(usage.ru_utime + usage.ru_stime)
print(json.dumps(seconds))
"""


def bench_rank_end(repeats: int) -> dict[str, float]:
    """(f): the forked rank's CPU seconds at its end, median, each way."""
    import json

    done = subprocess.run([sys.executable, "-c", _RANK_END, str(repeats)], cwd=REPO,
                          capture_output=True, text=True, check=True)  # fmt: skip
    seconds = json.loads(done.stdout)
    return {mode: statistics.median(values) for mode, values in seconds.items()}


_SERVER_IMPORTS = """\
import gc, importlib, sys
from plumbing.collector import imports_done, pause
from proxyfl.launch.job import RANK_IMPORTS
if sys.argv[1] == "paused":
    pause()
for name in RANK_IMPORTS:
    importlib.import_module(name)
gc.collect()
imports_done() if sys.argv[1] == "paused" else gc.freeze()
"""
_FLOW_HELP_BEFORE = (
    "import runpy, sys; sys.argv = ['flows.report', '--help']; "
    "runpy.run_module('flows.report', run_name='__main__', alter_sys=True)"
)


def _cpu_seconds(command: list[str]) -> float:
    """The CPU seconds (user + system) of ``command``'s process and what it waited for."""
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, command)
    return usage.ru_utime + usage.ru_stime


def bench_collector(repeats: int) -> dict[str, float]:
    """(g): median CPU seconds of each process, each way."""
    commands = {
        "flow before": [sys.executable, "-c", _FLOW_HELP_BEFORE],
        "flow now": [sys.executable, "-m", "flows.report", "--help"],
        "server before": [sys.executable, "-c", _SERVER_IMPORTS, "collected"],
        "server now": [sys.executable, "-c", _SERVER_IMPORTS, "paused"],
    }
    seconds: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, command in commands.items():  # interleaved
            seconds[name].append(_cpu_seconds(command))
    return {name: statistics.median(values) for name, values in seconds.items()}


def _server_start(command: Sequence[str], home: Path) -> tuple[float, float]:
    """(h): ``command`` serving Prefect's API on a free port with ``home``: its CPU seconds
    when it first answers, and the wall seconds to that answer."""
    import psutil

    from flows.server import prefect_server
    from plumbing.environment import environment_variable

    started = time.perf_counter()
    with environment_variable("PREFECT_HOME", str(home)), prefect_server(command=command):
        wall = time.perf_counter() - started
        (server,) = psutil.Process().children()  # the server, exec'd by its bound command
        times = server.cpu_times()
    return times.user + times.system, wall


def bench_prefect_server(repeats: int) -> dict[str, dict[str, float]]:
    """(h): median CPU and wall seconds of a server's start, each way."""
    import shutil

    from flows.server import PREFECT_API_COMMAND, prefect_server
    from plumbing.environment import environment_variable

    prefect = str(Path(sys.executable).parent / "prefect")
    commands: dict[str, Sequence[str]] = {"prefect server start": [prefect, "server", "start"],
                "flows.prefect_api": PREFECT_API_COMMAND}  # fmt: skip
    measured: dict[str, dict[str, list[float]]] = {
        name: {"cpu": [], "wall": []} for name in commands
    }
    with tempfile.TemporaryDirectory() as work:
        template = Path(work) / "migrated"
        with environment_variable("PREFECT_HOME", str(template)), prefect_server():
            pass  # the database migrated, the block types registered
        for repeat in range(repeats):
            for name, command in commands.items():  # interleaved
                home = Path(work) / f"{name}-{repeat}"
                shutil.copytree(template, home)
                cpu, wall = _server_start(command, home)
                measured[name]["cpu"].append(cpu)
                measured[name]["wall"].append(wall)
    return {name: {kind: statistics.median(values) for kind, values in figures.items()}
            for name, figures in measured.items()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_startup", description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--test", type=int, default=480, help="merged test patches")
    parser.add_argument("--ranks", type=int, default=4, help="ranks of the job in (d)")
    parser.add_argument("--jobs", type=int, default=3, help="jobs of the flow in (e)")
    args = parser.parse_args([] if argv is None else argv)
    imports = bench_imports(args.repeats)
    print(f"(a) a rank's imports, median of {args.repeats} fresh interpreters")
    print(f"    torchvision eager (before) {imports['before']:6.2f} s")
    print(f"    torchvision deferred       {imports['after']:6.2f} s")
    epsilon = bench_epsilon(args.repeats)
    print(f"(b) ε of a 10-round run, asked 3 times a round, median of {args.repeats} runs")
    print(f"    Opacus' accountant every time        {epsilon['asked']:7.3f} s")
    print(f"    once a round (history cached)        {epsilon['history']:7.3f} s")
    print(
        f"    one step's RDP once per (σ, q) (now) {epsilon['step']:7.3f} s   ratio "
        f"{epsilon['history'] / epsilon['step']:.0f}x"
    )
    print(
        f"(c) evaluation, cnn2 + cnn1 on {args.test} patches, median of {args.repeats}; "
        "probabilities against batch 16's"
    )
    evaluation = bench_eval(args.repeats, args.test)
    now = evaluation["batch 16 (now)"]["seconds"]
    for name, result in evaluation.items():
        print(f"    {name:28s} {result['seconds']:6.3f} s  {result['seconds'] / now:5.2f}x  "
              f"max |Δp| {result['max_difference']:.1e}  same predictions: "
              f"{result['same_predictions']}")  # fmt: skip
    job = bench_job(args.repeats, args.ranks)
    print(
        f"(d) a {args.ranks}-rank job that only starts and ends, launcher wall, median (max) "
        f"of {args.repeats}"
    )
    print(
        f"    every rank its own interpreter (before) {job['cold']:6.2f} s ({job['cold_max']:.2f})"
    )
    print(
        f"    forked from one warm server             {job['warm']:6.2f} s "
        f"({job['warm_max']:.2f})   ratio {job['cold'] / job['warm']:.2f}x"
    )
    flow = bench_flow(args.repeats, args.ranks, args.jobs)
    print(f"(e) {args.jobs} such jobs in a row (a flow's), wall, median of {args.repeats}")
    print(f"    a warm server per job (before)   {flow['own']:6.2f} s")
    print(
        f"    one server kept for the flow     {flow['kept']:6.2f} s   ratio "
        f"{flow['own'] / flow['kept']:.2f}x"
    )
    end = bench_rank_end(args.repeats)
    print(f"(f) a forked rank's end, its CPU (user + system), median of {args.repeats}")
    print(f"    exit with every destructor (before)  {end['exit']:6.3f} s")
    print(
        f"    ended after MPI's handlers (now)     {end['exit_here']:6.3f} s   ratio "
        f"{end['exit'] / end['exit_here']:.1f}x"
    )
    collector = bench_collector(args.repeats)
    print(f"(g) a process's CPU (user + system) with the collector over its imports, median of "
          f"{args.repeats}")  # fmt: skip
    for what, label in (("flow", "python -m flows.report --help"),
                        ("server", "a warm server's imports")):  # fmt: skip
        before, now = collector[f"{what} before"], collector[f"{what} now"]
        print(f"    {label:30s} collected (before) {before:6.2f} s   paused, frozen (now) "
              f"{now:6.2f} s   ratio {before / now:.2f}x")  # fmt: skip
    server = bench_prefect_server(args.repeats)
    print(f"(h) a Prefect server's start to its first answer (a migrated home), median of "
          f"{args.repeats}")  # fmt: skip
    before, now = server["prefect server start"], server["flows.prefect_api"]
    for name, figures in server.items():
        print(f"    {name:22s} CPU {figures['cpu']:6.2f} s   wall {figures['wall']:6.2f} s")
    print(f"    ratio (before / now)   CPU {before['cpu'] / now['cpu']:5.2f}x    wall "
          f"{before['wall'] / now['wall']:5.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
