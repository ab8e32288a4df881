"""Every GPU figure in one command, without internet, Prefect or DVC.

    python -m bench gpu [--smoke] [--work DIR] [--json PATH] [--skip-determinism]
                        [--all-variants]

On a machine with one or more GPUs and the project's Python dependencies (Prefect and DVC
may be absent: only ``wsi`` and ``proxyfl`` are imported), it

0. prints the GPU, driver and library versions;
1. builds 512x512 level-0 patch stores from ``wsi.synth`` slides (16384 x 12288 px,
   4 centres x 3 patients: ~300-390 tumour candidates a centre) through the ``wsi``
   functions the preprocess flow calls, slides in a process pool;
2. (a) times one training step of the paper's model (GN-ResNet-18, 512 px, batch 32): the
   plain step (eager and compiled), and the DML step (private + DP proxy) as a run takes
   it, a client's own :meth:`~proxyfl.trainer.ClientTrainer._step` on the store's patches,
   eager and (on a GPU) compiled: ms, samples/s, peak memory, compile seconds, graphs
   compiled after the pre-run check. ``--all-variants`` adds the DP step per engine,
   precision and compilation;
3. (b) runs a 3-round ProxyFL job of 4 ranks through the launcher ``flows.train`` uses
   (:func:`proxyfl.launch.job.run_job`, its ranks forked from the warm server that every
   job of (b)-(e) shares, as a flow's jobs do): wall, per-phase seconds, peak memory per
   rank, GPU utilisation (nvidia-smi, when present); on a GPU the same job compiled, and
   with a roomier memory budget than a shared card's default (:func:`roomy_budget_gb`);
4. (c) determinism: the same job again, and one stopped after round 2 and resumed:
   identical metrics or not;
5. (d) projects one ProxyFL run and Table 2 (7 methods x 15 seeds x 30 rounds) at Table 1's
   size on this card, from (a) and (b);
6. (e) the message a batch that does not fit gets.

Its figures go to ``WORK/gpu.json``, written again after each part, so that a bench cut
short keeps what it measured. Compiled graphs go to the project's persistent cache
(``train.options.compile_cache``): (a)'s compiled DML step compiles the graphs that (b)'s
compiled job then finds there, and a second bench compiles nothing. One H100 should take
at most 6 minutes in all (docs/gpu.md). ``--smoke`` runs the same code on a CPU in tiny
sizes (2 centres of 2 patients, 32 px patches, the demo's cnn models, 2 ranks), every part
included: ``make test`` runs it, so that it cannot rot.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from plumbing.atomic import write_text

IN_DEFAULT_RUN = False  # a GPU's figures (its --smoke is in make test)

# Table 1 of the paper (001_*): each client's training and the merged test set
TABLE1_TRAIN = (2338, 2726, 2937, 2841)
TABLE1_TEST = 2984
TABLE2_METHODS = 7
TABLE2_SEEDS = 15
PAPER_ROUNDS = 30
DP_ONLY_METHODS = 4  # Regular, AvgPush, CWT, FedAvg: one DP model, no private one
DML_METHODS = 2  # FML, ProxyFL


@dataclass(frozen=True)
class Sizes:
    """What the bench builds and runs."""

    centers: int = 4
    patients: int = 3
    width: int = 16384
    height: int = 12288
    patch_size: int = 512
    level: int = 0
    per_class: int = 450
    private_model: str = "resnet18_gn"
    proxy_model: str = "resnet18_gn"
    batch: int = 32
    rounds: int = 3
    step_repeats: int = 10
    # (e): the paper's batch of patches resized to 8192 px: one step needs ~1 TB, so it
    # fails on any card (a batch larger than a client's data is refused before, as input)
    oom_batch: int = 32
    oom_input: int = 8192
    device: str = "cuda"
    # the step table's variants by default: the plain step, eager and compiled (the DML
    # step as a run takes it always follows); ALL_VARIANTS with --all-variants
    step_variants: tuple[str, ...] = ("plain", "plain compiled")
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)


FULL = Sizes()
SMOKE = Sizes(
    centers=2, patients=2, width=4096, height=3072, patch_size=32, level=2, per_class=60,
    private_model="cnn2", proxy_model="cnn1", rounds=2, step_repeats=3, device="cpu",
    oom_batch=32, oom_input=1_000_000,  # on a CPU: 12 TB for one 1,000,000² px image
    step_variants=("plain", "opacus fp32", "func fp32"), workers=2,
)  # fmt: skip
ALL_VARIANTS = (
    "plain", "plain compiled", "opacus fp32", "func fp32", "func bf16", "func bf16 compiled",
    "func fp32 compiled",
)  # fmt: skip


def say(text: str) -> None:
    print(text, flush=True)


# -- 0. the machine --------------------------------------------------------------------
def environment() -> dict[str, Any]:
    import numpy
    import opacus
    import torch

    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "opacus": opacus.__version__,
        "numpy": numpy.__version__,
        "cpus": os.cpu_count(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available() else [],
    }  # fmt: skip
    smi = shutil.which("nvidia-smi")
    if smi:
        query = [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        facts["nvidia_smi"] = subprocess.run(query, capture_output=True, text=True).stdout.strip()
    try:
        from mpi4py import MPI

        facts["mpi"] = MPI.Get_library_version().splitlines()[0]
    except Exception as error:  # the bench says what is missing, and goes on where it can
        facts["mpi"] = f"unavailable: {error}"
    return facts


# -- 1. stores -------------------------------------------------------------------------
def _candidates(args: tuple[Any, Any]) -> Any:
    from wsi.preprocess import SlideStepError, slide_patches

    record, params = args
    try:
        return slide_patches(record, params, None, "auto")
    except SlideStepError as error:
        return error.failure


def _center_store(args: tuple[Any, ...]) -> tuple[int, dict[str, Any]]:
    from wsi.preprocess import center_store

    center, slides, params, sampling, out, records, failures = args
    report = center_store(center, slides, params, sampling, out, "auto", failures, records)
    return center, report.counts


def build_stores(work: Path, sizes: Sizes) -> dict[str, Any]:
    """Synthetic slides, then one patch store per centre, through ``wsi``'s functions."""
    from wsi.catalogue import scan_camelyon
    from wsi.params import PatchParams, SamplingParams
    from wsi.preprocess import SlidePatches
    from wsi.synth.config import SynthConfig
    from wsi.synth.dataset import generate_dataset

    started = time.perf_counter()
    root, stores = work / "slides", work / "stores"
    centers = tuple(range(sizes.centers))
    config = SynthConfig(centers=centers, patients_per_center=sizes.patients,
                         width=sizes.width, height=sizes.height)  # fmt: skip
    generate_dataset(root, config, workers=sizes.workers)
    slides_seconds = time.perf_counter() - started
    params = PatchParams(patch_size=sizes.patch_size, level=sizes.level)
    records = [r for r in scan_camelyon(root).for_centers(centers) if r.node_label is not None]
    with ProcessPoolExecutor(sizes.workers) as pool:
        outcomes = list(pool.map(_candidates, [(r, params) for r in records]))
    per_center: dict[int, list[Any]] = {c: [] for c in centers}
    failures: dict[int, list[Any]] = {c: [] for c in centers}
    for record, outcome in zip(records, outcomes, strict=True):
        (per_center if isinstance(outcome, SlidePatches) else failures)[record.center].append(
            outcome
        )
    sampling = SamplingParams(patches_per_class=sizes.per_class, shortfall="take_available")
    jobs = [(c, per_center[c], params, sampling, stores,
             [r for r in records if r.center == c], failures[c]) for c in centers]  # fmt: skip
    with ProcessPoolExecutor(min(sizes.workers, len(jobs))) as pool:
        counts = dict(pool.map(_center_store, jobs))
    return {
        "directory": str(stores),
        "slides_seconds": round(slides_seconds, 1),
        "seconds": round(time.perf_counter() - started, 1),
        "slides_failed": sum(len(f) for f in failures.values()),
        "counts": {str(c): counts[c] for c in centers},
    }


# -- 2. (a) one step -------------------------------------------------------------------
def _synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(step: Callable[[], None], device: Any, repeats: int) -> tuple[float, float]:
    """``(first call's seconds, median seconds of the next ``repeats``)``."""
    _synchronize(device)
    started = time.perf_counter()
    step()
    _synchronize(device)
    first = time.perf_counter() - started
    step()  # a second warm-up: the allocator's and autotuners' first passes
    times = []
    for _ in range(repeats):
        _synchronize(device)
        started = time.perf_counter()
        step()
        _synchronize(device)
        times.append(time.perf_counter() - started)
    return first, statistics.median(times)


def step_table(sizes: Sizes) -> list[dict[str, Any]]:
    """One step of the proxy model per variant, side by side in this process."""
    import torch
    from torch.utils.data import TensorDataset

    from proxyfl.engine.memory import memory_peaks, reset_peaks
    from proxyfl.engine.models import build_model
    from proxyfl.privacy.dp import make_private
    from proxyfl.privacy.per_sample import cross_entropy

    device = torch.device(sizes.device)
    size, batch = sizes.patch_size, sizes.batch
    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.rand(batch, 3, size, size, device=device, generator=generator) * 2 - 1
    y = torch.randint(0, 2, (batch,), device=device, generator=generator)
    dataset = TensorDataset(torch.zeros(batch * 8, 1), torch.zeros(batch * 8, dtype=torch.long))
    rows = []

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return build_model(sizes.proxy_model, 2, size).to(device)

    def dp(engine: str, compiled: bool, autocast: bool) -> Any:
        proxy = model()
        return make_private(
            proxy, torch.optim.Adam(proxy.parameters(), lr=1e-3), dataset, batch_size=batch,
            sigma=1.4, clip=0.7, sampler_generator=torch.Generator().manual_seed(0),
            noise_generator=torch.Generator(device=device).manual_seed(1), engine=engine,
            chunk_size=batch, compiled=compiled, autocast=autocast,
        )  # fmt: skip

    for variant in sizes.step_variants:
        parts = variant.split()
        compiled = "compiled" in parts
        if parts[0] == "plain":
            plain = model()
            optimizer = torch.optim.Adam(plain.parameters(), lr=1e-3)
            forward = torch.compile(plain) if compiled else plain

            def step(forward: Any = forward, optimizer: Any = optimizer) -> None:
                optimizer.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(forward(x), y).backward()
                optimizer.step()
        else:
            training = dp(parts[0], compiled, parts[1] == "bf16")

            def step(training: Any = training) -> None:
                training.step(x, y, cross_entropy)

        reset_peaks(device)
        try:
            first, median = _timed(step, device, sizes.step_repeats)
        except Exception as error:  # a variant this machine cannot run is a row that says so
            rows.append({"variant": variant, "error": f"{type(error).__name__}: {error}"[:300]})
            continue
        rows.append({
            "variant": variant, "ms": round(median * 1e3, 2),
            "samples_per_s": round(batch / median, 1),
            "compile_s": round(first - median, 1) if compiled else None,
            **memory_peaks(device),
        })  # fmt: skip
    return rows


def dml_step_rows(sizes: Sizes, stores: Path) -> list[dict[str, Any]]:
    """The DML step as a run takes it: a ProxyFL client of centre 0 built in this process
    as a rank builds it, its pre-run check (which compiles, where it compiles), then its
    own step on a batch of the store's patches; eager, and compiled on a GPU."""
    import torch
    from mpi4py import MPI

    from proxyfl.algorithms.strategies import strategy_for
    from proxyfl.comm.graphs import parse_schedule_spec
    from proxyfl.config import TrainConfig
    from proxyfl.engine.data import PatchDataset, open_split, prepare_images
    from proxyfl.engine.memory import SHARED_GPU_RANK_GB, memory_peaks, reset_peaks
    from proxyfl.engine.runtime import make_runtime
    from proxyfl.trainer import ClientData, ClientTrainer

    device = torch.device(sizes.device)
    runtime = make_runtime(MPI.COMM_WORLD, sizes.device)
    train = PatchDataset([open_split(stores, 0, "train")])
    data = ClientData(client=0, center=0, train=train,
                      test_splits=[open_split(stores, 0, "test")], n_classes=2,
                      patch_size=train.patch_size)  # fmt: skip
    images, labels = zip(*train.__getitems__(list(range(sizes.batch))), strict=True)
    x = prepare_images(torch.stack(images), device)
    y = torch.stack(labels).to(device)
    # the budget a rank of (b) has, so that the chunks, and the compiled graphs (b) then
    # finds in the cache, are that rank's
    shared = device.type == "cuda" and sizes.centers > torch.cuda.device_count()
    rows = []
    for compiled in (False, True) if device.type == "cuda" else (False,):
        config = TrainConfig(
            algorithm="ProxyFL", data=stores, run_dir=stores.parent / "step", centers=[0],
            batch_size=sizes.batch, private_model=[sizes.private_model],
            proxy_model=sizes.proxy_model, device=sizes.device,
            compile="on" if compiled else "off",
            gpu_memory_gb=SHARED_GPU_RANK_GB if shared else None,
        )  # fmt: skip
        trainer = ClientTrainer(config=config, runtime=runtime, strategy=strategy_for("ProxyFL"),
                                data=data, schedule=parse_schedule_spec("exponential"),
                                run_dir=stores.parent / "step")  # fmt: skip
        reset_peaks(device)
        compile_seconds = trainer.preflight()
        _, median = _timed(lambda trainer=trainer: trainer._step(x, y), device,
                           sizes.step_repeats)  # fmt: skip
        rows.append({
            "variant": f"DML step as a run takes it, {'compiled' if compiled else 'eager'}",
            "ms": round(median * 1e3, 2), "samples_per_s": round(sizes.batch / median, 1),
            "compile_s": round(compile_seconds, 1) if compiled else None,
            "chunk": trainer.chunk_size, "recompiles": trainer.recompiles,
            **memory_peaks(device),
        })  # fmt: skip
    return rows


# -- 3-6. jobs through the launcher ------------------------------------------------------
@dataclass
class JobOutcome:
    name: str
    wall_s: float
    ok: bool
    message: str = ""
    ranks: list[dict[str, Any]] = field(default_factory=list)
    gpu_utilisation: dict[str, float] | None = None


class _Utilisation:
    """nvidia-smi's utilisation and memory every half second while a job runs."""

    def __init__(self, path: Path) -> None:
        self.path, self.process = path, None
        smi = shutil.which("nvidia-smi")
        if smi:
            self.file = open(path, "w")  # noqa: SIM115 (closed in stop)
            self.process = subprocess.Popen(
                [smi, "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
                 "-lms", "500"], stdout=self.file, stderr=subprocess.DEVNULL,
            )  # fmt: skip

    def stop(self) -> dict[str, float] | None:
        if self.process is None:
            return None
        self.process.terminate()
        self.process.wait()
        self.file.close()
        samples = []
        for line in self.path.read_text().splitlines():
            try:
                samples.append([float(v) for v in line.split(",")[:2]])
            except ValueError:
                continue
        if not samples:
            return None
        busy = [s[0] for s in samples]
        return {"median_percent": statistics.median(busy), "max_percent": max(busy),
                "max_memory_used_mib": max(s[1] for s in samples)}  # fmt: skip


def run_training(name: str, work: Path, stores: Path, sizes: Sizes, **options: Any) -> JobOutcome:
    """A ProxyFL job of one rank per centre through :func:`proxyfl.launch.job.run_job`."""
    from proxyfl.config import TrainConfig
    from proxyfl.launch.job import TrainingJob, TrainingJobFailed, run_job

    settings: dict[str, Any] = {
        "algorithm": "ProxyFL", "data": stores, "run_dir": work / "runs" / name,
        "centers": list(range(sizes.centers)), "rounds": sizes.rounds,
        "batch_size": sizes.batch, "private_model": [sizes.private_model],
        "proxy_model": sizes.proxy_model, "device": sizes.device,
        "eval_batch_size": 64, "keep_final_checkpoints": True,
    }  # fmt: skip
    settings.update(options)
    config = TrainConfig(**settings)
    lines: list[str] = []
    monitor = _Utilisation(work / f"{name}.smi.csv")
    started = time.perf_counter()
    try:
        run_job(TrainingJob(config), on_line=lines.append)
        ok, message = True, ""
    except TrainingJobFailed as failure:
        ok, message = False, str(failure).splitlines()[0]
        errors = [line for line in lines if ": error: " in line]
        message = "\n".join(errors) or message
    wall = time.perf_counter() - started
    utilisation = monitor.stop()
    ranks = []
    for path in sorted((config.run_dir / "ranks").glob("rank_*.machine.json")):  # type: ignore[union-attr]
        record = json.loads(path.read_text())
        ranks.append({"rank": record["rank"], "memory": record.get("memory"),
                      "timings": record.get("timings"),
                      "dp_chunk_size": record.get("dp_chunk_size"),
                      "eval_batch_size": record.get("eval_batch_size"),
                      **{key: record.get(key) for key in RANK_FACTS}})  # fmt: skip
    return JobOutcome(name, round(wall, 1), ok, message, ranks, utilisation)


# what each rank of a job says of its set-up, beside its timings and memory
RANK_FACTS = ("torch_threads", "compiled", "compile_cache_served", "recompiles",
              "fill_uninitialized_memory", "prefetch")  # fmt: skip


def roomy_budget_gb(ranks: int) -> float:
    """Half of GPU 0's share for each of ``ranks`` ranks on it, in GB (one decimal)."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory / 1e9
    return round(0.5 * total / ranks, 1)


def metrics_of(work: Path, name: str) -> list[dict[str, Any]]:
    path = work / "runs" / name / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare_runs(work: Path, a: str, b: str) -> dict[str, Any]:
    """Rows of metrics.jsonl that differ between runs ``a`` and ``b`` (timings aside)."""

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return row["round"], row["client"], row["evaluated_model"]

    rows_a = {key(r): r for r in metrics_of(work, a)}
    rows_b = {key(r): r for r in metrics_of(work, b)}
    differ = [k for k in rows_a if k in rows_b and {f: v for f, v in rows_a[k].items()
              if f != "comm_seconds"} != {f: v for f, v in rows_b[k].items()
                                          if f != "comm_seconds"}]  # fmt: skip
    loss = max((abs((rows_a[k].get("train_loss") or 0) - (rows_b[k].get("train_loss") or 0))
                for k in rows_a if k in rows_b), default=0.0)  # fmt: skip
    return {"runs": [a, b], "rows": len(rows_a), "rows_differing": len(differ),
            "identical": not differ and rows_a.keys() == rows_b.keys(),
            "max_train_loss_difference": loss}  # fmt: skip


def _total(split: dict[str, int]) -> int:
    """Patches of a split in a centre report's counts (per label)."""
    return sum(value for label, value in split.items() if label != "total")


def project(job: JobOutcome, steps: list[dict[str, Any]], counts: dict[str, Any],
            sizes: Sizes) -> dict[str, Any]:  # fmt: skip
    """One ProxyFL run and Table 2 at Table 1's size, 30 rounds, on this machine: each
    rank's measured seconds per round of training (per training patch) and evaluation (per
    test patch), scaled to Table 1's clients; the DP-only methods' training by the step
    table's DP step against its DML step; Joint as one rank's DP steps over the pooled
    10,842 patches."""
    timings = [rank["timings"] for rank in job.ranks]
    train_counts = [_total(counts[str(c)]["train"]) for c in range(sizes.centers)]
    test_total = sum(_total(counts[str(c)]["test"]) for c in range(sizes.centers))
    per_patch = max(t["train_seconds"] / sizes.rounds / n
                    for t, n in zip(timings, train_counts, strict=True))  # fmt: skip
    eval_per_patch = max(t["eval_seconds"] for t in timings) / sizes.rounds / test_total
    other = max(t["comm_seconds"] + t["records_seconds"] + t["checkpoint_seconds"]
                for t in timings) / sizes.rounds  # fmt: skip
    fixed = max(t["setup_seconds"] + t["compile_seconds"] + t["startup_seconds"] for t in timings)
    round_s = per_patch * max(TABLE1_TRAIN) + eval_per_patch * TABLE1_TEST + other
    proxyfl_run = fixed + PAPER_ROUNDS * round_s
    by_variant = {row["variant"]: row for row in steps if "ms" in row}
    dml = next(row for name, row in by_variant.items() if name.startswith("DML"))
    dp_name = "func bf16 compiled" if sizes.device == "cuda" else "func fp32"
    if dp_name in by_variant:
        dp_share = by_variant[dp_name]["ms"] / dml["ms"]
    else:  # the DML step less its private model's (a step and a forward pass: 4/3 of one)
        dp_name = "DML step less 4/3 of the plain step"
        dp_share = max(0.25, 1 - 4 / 3 * by_variant["plain"]["ms"] / dml["ms"])
    dp = {"ms": dml["ms"] * dp_share}
    dp_only_run = fixed + PAPER_ROUNDS * (per_patch * max(TABLE1_TRAIN) * dp_share
                                          + eval_per_patch * TABLE1_TEST + other)  # fmt: skip
    joint_run = fixed + PAPER_ROUNDS * (sum(TABLE1_TRAIN) / sizes.batch * dp["ms"] / 1e3
                                        + eval_per_patch * TABLE1_TEST)  # fmt: skip
    table2 = TABLE2_SEEDS * (DML_METHODS * proxyfl_run + DP_ONLY_METHODS * dp_only_run
                             + joint_run)  # fmt: skip
    return {
        "round_seconds": round(round_s, 2),
        "proxyfl_run_minutes": round(proxyfl_run / 60, 1),
        "dp_only_run_minutes": round(dp_only_run / 60, 1),
        "joint_run_minutes": round(joint_run / 60, 1),
        "table2_device_hours": round(table2 / 3600, 1),
        "method": "per-patch seconds of the busiest rank of (b), scaled to Table 1; "
                  f"DP-only methods at {dp_name} / DML step = {dp_share:.2f} of its training",
    }  # fmt: skip


# -- the report ------------------------------------------------------------------------
def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def _job_lines(job: JobOutcome) -> list[str]:
    lines = [f"{job.name}: {'ok' if job.ok else 'FAILED'}, wall {job.wall_s} s"
             + (f", GPU busy median {job.gpu_utilisation['median_percent']:.0f} %"
                if job.gpu_utilisation else "")]  # fmt: skip
    for rank in job.ranks:
        t, m = rank["timings"] or {}, rank["memory"] or {}
        lines.append(
            f"  rank {rank['rank']}: setup {t.get('setup_seconds', 0):.1f} s, compile "
            f"{t.get('compile_seconds', 0):.1f} s, train {t.get('train_seconds', 0):.1f} s, "
            f"eval {t.get('eval_seconds', 0):.1f} s, comm {t.get('comm_seconds', 0):.2f} s, "
            f"wait {t.get('wait_seconds', 0):.1f} s, waiting for data "
            f"{t.get('data_wait_seconds', 0):.2f} s; peak "
            + ", ".join(f"{k.removeprefix('peak_')} {v} GB" for k, v in m.items())
            + f"; chunk {rank['dp_chunk_size']}, eval batch {rank['eval_batch_size']}, "
            + ", ".join(f"{key} {rank.get(key)}" for key in RANK_FACTS)
        )
    if job.message:
        lines.append(f"  {job.message}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench gpu", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on a CPU (make test)")
    parser.add_argument("--work", type=Path, help="working directory (default: a temporary one)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--skip-determinism", action="store_true", help="no (c)")
    parser.add_argument(
        "--all-variants",
        action="store_true",
        help="(a) times the DP step per engine, precision and compilation too",
    )
    args = parser.parse_args(argv)
    sizes = SMOKE if args.smoke else FULL
    if args.all_variants:
        sizes = replace(sizes, step_variants=ALL_VARIANTS)
    import torch

    from proxyfl.config import TrainOptions
    from proxyfl.engine.compilation import use_compile_cache
    from proxyfl.launch.job import warm_ranks
    from proxyfl.launch.placement import Placement

    if not args.smoke and not torch.cuda.is_available():
        say("bench gpu: no CUDA GPU visible; `python -m bench gpu --smoke` runs it on a CPU")
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {"sizes": asdict(sizes)}
    started = time.perf_counter()

    def save(part: str) -> None:
        """gpu.json as measured so far, after each part: a bench cut short keeps it."""
        figures["seconds"] = round(time.perf_counter() - started, 1)
        figures["parts_done"] = [*figures.get("parts_done", []), part]
        text = json.dumps(figures, indent=1, default=str) + "\n"
        for path in (work / "gpu.json", args.json):
            if path is not None:
                write_text(path, text)
        say(f"-- {part} done at {figures['seconds']} s; figures in {work / 'gpu.json'}")

    # the compiled graphs of (a) and (b) in the project's persistent cache (a run's default)
    figures["compile_cache"] = str(use_compile_cache(TrainOptions().compile_cache))
    figures["environment"] = environment()
    say("== environment ==\n" + json.dumps(figures["environment"], indent=1))

    say("== stores ==")
    stores = build_stores(work, sizes)
    figures["stores"] = stores
    say(f"slides {stores['slides_seconds']} s, stores {stores['seconds']} s in all; "
        f"{stores['slides_failed']} slides failed")  # fmt: skip
    for center, counts in stores["counts"].items():
        say(f"  center_{center}: train {counts['train']}, test {counts['test']}")
    save("stores")
    stores_dir = Path(stores["directory"])

    say(f"== (a) one step, batch {sizes.batch}, {sizes.patch_size} px, {sizes.proxy_model} ==")
    steps = step_table(sizes) + dml_step_rows(sizes, stores_dir)
    figures["steps"] = steps
    plain = next((row["ms"] for row in steps if row.get("variant") == "plain compiled"
                  and "ms" in row), None) or next(row["ms"] for row in steps
                                                  if row.get("variant") == "plain")  # fmt: skip
    for row in steps:
        if "ms" in row:
            row["x_plain"] = round(row["ms"] / plain, 2)
    say(_table(steps, ["variant", "ms", "x_plain", "samples_per_s", "compile_s", "chunk",
                       "recompiles", "peak_gpu_allocated_gb", "peak_rss_gb", "error"]))  # fmt: skip
    save("(a)")

    # the jobs of (b)-(e) fork their ranks from one warm server, as the jobs of a flow do:
    # torch and Opacus imported once, not once a job (started after (a), which it would time)
    with warm_ranks(Placement()):
        say(f"== (b) ProxyFL, {sizes.centers} ranks, {sizes.rounds} rounds ==")
        base = run_training("base", work, stores_dir, sizes)
        figures["job"] = asdict(base)
        say("\n".join(_job_lines(base)))
        if sizes.device == "cuda":  # the paper's runs compile: the same job, graphs cached by (a)
            compiled = run_training("compiled", work, stores_dir, sizes, compile="on")
            figures["job_compiled"] = asdict(compiled)
            say("\n".join(_job_lines(compiled)))
            # the default job again with a roomier budget than a shared card's 6 GB a rank
            # (on the H200 that cap sized eager chunks of 6: a 258 ms DML step, 66 compiled)
            roomy_gb = roomy_budget_gb(sizes.centers)
            roomy = run_training("roomy", work, stores_dir, sizes, gpu_memory_gb=roomy_gb)
            figures["job_roomy"] = {**asdict(roomy), "gpu_memory_gb": roomy_gb}
            say(f"(the budget: gpu_memory_gb {roomy_gb} a rank)\n" + "\n".join(_job_lines(roomy)))
        save("(b)")

        if not args.skip_determinism and base.ok:
            say("== (c) determinism ==")
            again = run_training("again", work, stores_dir, sizes)
            stopped = run_training("resumed", work, stores_dir, sizes,
                                   stop_after_round=sizes.rounds - 1)  # fmt: skip
            resumed = run_training("resumed", work, stores_dir, sizes, resume=True)
            figures["determinism"] = {
                "two_runs": compare_runs(work, "base", "again"),
                "stop_and_resume": compare_runs(work, "base", "resumed"),
                "jobs": [asdict(j) for j in (again, stopped, resumed)],
            }
            for name in ("two_runs", "stop_and_resume"):
                say(f"{name}: {json.dumps(figures['determinism'][name])}")
            save("(c)")

        if base.ok:
            say("== (d) projected at Table 1's size, 30 rounds ==")
            figures["projection"] = project(base, steps, stores["counts"], sizes)
            say(json.dumps(figures["projection"], indent=1))
            save("(d)")

        say("== (e) a batch that does not fit ==")
        options: dict[str, Any] = {"batch_size": sizes.oom_batch, "rounds": 1,
                                   "input_size": sizes.oom_input, "proxy_model": "resnet18_gn",
                                   "private_model": ["resnet18_gn"]}  # fmt: skip
        oom = run_training("too_large", work, stores_dir, sizes, **options)
        figures["out_of_memory"] = asdict(oom)
        say(f"exit ok={oom.ok} after {oom.wall_s} s:\n{oom.message}")
        save("(e)")
    say(f"== bench gpu: {figures['seconds']} s; figures in {work / 'gpu.json'} ==")
    failed = not base.ok or oom.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
