"""The preprocessing flow end to end on real-size slides: wall time and peak memory per worker.

``bench.bench_preprocess`` measures the mask step of one slide in one worker; this runs the
whole flow (``python -m flows.preprocess``) on a Camelyon-17-layout dataset of real-size
slides, as a user would, in a subprocess:

1. **Dataset.** ``--centers`` centres x ``--patients`` patients x 2 slides (node 0
   ``negative``, node 1 ``macro`` with its ASAP lesion), each a distinct slide of
   ``bench.slidegen`` (its own seed and number of tissue sections; 100,000 x 200,000 px at
   0.243 µm/px by default) cached under ``bench/.cache/``. The dataset root
   (``bench/.cache/flow_dataset_<key>/``: ``center_{c}/patient_{ppp}/patient_{ppp}_node_{n}.tif``,
   ``lesion_annotations/``, ``stage_labels.csv``) holds hard links to the cached slides
   (symbolic links when the cache is on another filesystem), never copies.
2. **Flow.** ``python -m flows.preprocess --data-root ROOT --out OUT --cache-dir CACHE
   --centers ... --workers 2 --patch-size 512 --level 0 --patches-per-class 50`` with fresh
   ``OUT`` and ``CACHE`` (so every slide's candidates are computed), a fresh
   ``PREFECT_HOME``, ``DO_NOT_TRACK=1``, ``PREFECT_SERVER_ANALYTICS_ENABLED=false`` and no
   ``PREFECT_API_URL`` (so the flow starts its own server, which is measured too). Every
   ``--interval`` s the resident set (RSS) of every process of the flow's tree is sampled
   (psutil), and its peak (``VmHWM``, which also catches peaks between samples). Processes
   are told apart by their command lines: the flow itself, the pool's workers
   (``multiprocessing`` spawn), the Prefect server (``prefect server start`` and its
   children) and the rest (multiprocessing's resource tracker).
3. **Figures.** Wall time and exit code, peak RSS per process, the per-slide
   ``usable candidates computed in X s (Y s CPU)`` lines the flow logs,
   ``OUT/summary.csv``, and PASS/FAIL for: peak <= 1 GB per worker, exit code 0, every
   centre's store published (readable, report ``complete``, no temporary left).

Run it with ``python -m bench preprocess_flow`` (not part of ``python -m bench``'s default
run) or ``python -m bench.bench_preprocess_flow [--centers 2 --patients 2 --keep]``. It needs
about 1.9 GB of disk per real-size slide, 15 GB for the default 8 (``--small`` slides:
0.08 GB each); writing a missing slide takes 20-40 s on 2 cores, the flow itself a few
minutes.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from bench.slidegen import CACHE, SlideSpec, WrittenSlide, cached_slide

log = logging.getLogger(__name__)

IN_DEFAULT_RUN = False  # ~15 GB of slides and several minutes: run it by name

REPO = Path(__file__).resolve().parents[1]
CENTERS = 2
PATIENTS = 2  # per centre; each has a negative (node 0) and a macro (node 1) slide
PATIENTS_PER_CENTER = 20  # wsi.catalogue: patient // 20 is the centre
FIRST_SEED = 17  # the first slide is bench_preprocess's own (already cached there)
PIECES = (4, 3, 5)  # tissue sections, cycled over the slides: distinct geometries
SMALL = {"width": 20_000, "height": 40_000}
WORKERS = 2
PATCH_SIZE = 512
LEVEL = 0
PATCHES_PER_CLASS = 50
INTERVAL = 0.2
TIMEOUT = 3600.0
TARGET_PEAK_BYTES = 1e9  # per worker
BYTES_PER_GIGAPIXEL = 0.095e9  # a written slide, about (1.89 GB for 20 gigapixels)

# tasks.preprocess.slide_candidates' line for a slide whose candidates were computed
MASK_LINE = re.compile(
    r"(?P<slide>patient_\d{3}_node_\d+):\s+\{[^}]*\}\s+usable\s+candidates\s+computed\s+"
    r"in\s+(?P<wall>[\d.]+)\s+s\s+\((?P<cpu>[\d.]+)\s+s\s+CPU\)"
)


# --------------------------------------------------------------------------------------
# The dataset
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetSlide:
    center: int
    patient: int
    node: int
    label: str  # negative | macro
    spec: SlideSpec

    @property
    def slide_id(self) -> str:
        return f"patient_{self.patient:03d}_node_{self.node}"


def dataset_slides(centers: int, patients: int, base: SlideSpec) -> list[DatasetSlide]:
    """Every slide of the dataset, each with its own seed and geometry."""
    if patients > PATIENTS_PER_CENTER:
        raise ValueError(f"at most {PATIENTS_PER_CENTER} patients per centre")
    slides = []
    for center in range(centers):
        for k in range(patients):
            patient = center * PATIENTS_PER_CENTER + k
            for node, label in enumerate(("negative", "macro")):
                i = len(slides)
                spec = replace(base, seed=FIRST_SEED + i, pieces=PIECES[i % len(PIECES)])
                slides.append(DatasetSlide(center, patient, node, label, spec))
    return slides


def _link(source: Path, target: Path) -> str:
    """``target`` as a hard link to ``source`` (a symbolic one across filesystems)."""
    if target.exists() or target.is_symlink():
        if target.exists() and os.path.samefile(source, target):
            return "link kept"
        target.unlink()
    try:
        os.link(source, target)
        return "hard link"
    except OSError:
        target.symlink_to(source.resolve())
        return "symlink"


def build_dataset(
    slides: Sequence[DatasetSlide], cache: Path
) -> tuple[Path, list[WrittenSlide], float, set[str]]:
    """The dataset root, its written slides, the seconds spent writing, how they are linked."""
    key = hashlib.sha256(
        json.dumps([(s.slide_id, s.center, s.label, s.spec.key) for s in slides]).encode()
    ).hexdigest()[:12]
    root = cache / f"flow_dataset_{key}"
    (root / "lesion_annotations").mkdir(parents=True, exist_ok=True)
    written: list[WrittenSlide] = []
    write_seconds = 0.0
    kinds: set[str] = set()
    rows: list[tuple[str, str]] = []
    for i, slide in enumerate(slides):
        start = time.perf_counter()
        made = cached_slide(slide.spec, cache)
        spent = time.perf_counter() - start
        if spent > 1:
            write_seconds += spent
            print(
                f"  wrote slide {i + 1}/{len(slides)} ({slide.slide_id}) in {spent:.0f} s",
                flush=True,
            )
        written.append(made)
        folder = root / f"center_{slide.center}" / f"patient_{slide.patient:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        kinds.add(_link(made.path, folder / f"{slide.slide_id}.tif"))
        annotation = root / "lesion_annotations" / f"{slide.slide_id}.xml"
        if slide.label == "negative":
            annotation.unlink(missing_ok=True)
        else:
            shutil.copyfile(made.annotation, annotation)
    for patient in sorted({s.patient for s in slides}):
        labels = [s.label for s in slides if s.patient == patient]
        rows.append((f"patient_{patient:03d}.zip", "pN1" if "macro" in labels else "pN0"))
        rows.extend((f"{s.slide_id}.tif", s.label) for s in slides if s.patient == patient)
    with (root / "stage_labels.csv").open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(("patient", "stage"))
        writer.writerows(rows)
    return root, written, write_seconds, kinds


def check_disk(slides: Sequence[DatasetSlide], cache: Path, scratch: Path) -> str | None:
    """Why there is not enough disk for the slides still to write, or None."""
    missing = [
        s for s in slides
        if not (cache / f"slide_{s.spec.width}x{s.spec.height}_{s.spec.key}.json").is_file()
    ]  # fmt: skip
    needed = sum(s.spec.gigapixels * BYTES_PER_GIGAPIXEL for s in missing) + 2e9
    cache.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache).free
    if free < needed:
        return (f"{len(missing)} slides to write need about {needed / 1e9:.1f} GB under "
                f"{cache}, {free / 1e9:.1f} GB free")  # fmt: skip
    if shutil.disk_usage(scratch).free < 2e9:
        return f"less than 2 GB free under {scratch} for the stores"
    return None


# --------------------------------------------------------------------------------------
# The flow and its processes
# --------------------------------------------------------------------------------------


@dataclass
class ProcessStats:
    pid: int
    ppid: int
    cmdline: list[str] = field(default_factory=list)
    peak_rss: int = 0  # largest sampled RSS
    hwm: int = 0  # largest VmHWM read (the kernel's own peak)
    first_seen: float = 0.0
    last_seen: float = 0.0
    role: str = "other"

    @property
    def peak(self) -> int:
        return max(self.peak_rss, self.hwm)

    @property
    def command(self) -> str:
        return " ".join(self.cmdline)


def _vm_hwm(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class TreeSampler:
    """Peak RSS of every process below (and including) ``root_pid``, by polling."""

    def __init__(self, root_pid: int) -> None:
        self.root = psutil.Process(root_pid)
        self.stats: dict[tuple[int, float], ProcessStats] = {}
        self.peak_total = 0
        self.samples = 0
        self.start = time.perf_counter()

    def sample(self) -> None:
        try:
            processes = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        now = time.perf_counter() - self.start
        total = 0
        for process in processes:
            try:
                with process.oneshot():
                    key = (process.pid, process.create_time())
                    rss = process.memory_info().rss
                    cmdline = process.cmdline()
                    ppid = process.ppid()
            except psutil.Error:
                continue
            stats = self.stats.get(key)
            if stats is None:
                stats = self.stats[key] = ProcessStats(process.pid, ppid, first_seen=now)
            stats.cmdline = cmdline or stats.cmdline  # the last one: after exec
            stats.peak_rss = max(stats.peak_rss, rss)
            stats.hwm = max(stats.hwm, _vm_hwm(process.pid))
            stats.last_seen = now
            total += rss
        self.peak_total = max(self.peak_total, total)
        self.samples += 1

    def classify(self) -> list[ProcessStats]:
        """Every process seen, with its role: flow, worker, server, tracker or other."""
        by_pid = {s.pid: s for s in self.stats.values()}

        def is_server(stats: ProcessStats) -> bool:
            text = stats.command
            return ("prefect" in text and "server" in text and "start" in text) or (
                "uvicorn" in text or "prefect.server" in text
            )

        for stats in self.stats.values():
            text = stats.command
            if stats.pid == self.root.pid:
                stats.role = "flow"
            elif is_server(stats):
                stats.role = "server"
            elif "resource_tracker" in text:
                stats.role = "tracker"
            elif "spawn_main" in text or "--multiprocessing-fork" in text:
                stats.role = "worker"
        for stats in self.stats.values():  # children of the server belong to it
            parent = by_pid.get(stats.ppid)
            while stats.role == "other" and parent is not None:
                if parent.role == "server":
                    stats.role = "server"
                parent = by_pid.get(parent.ppid) if parent.pid != parent.ppid else None
        order = {"flow": 0, "worker": 1, "server": 2, "tracker": 3, "other": 4}
        return sorted(self.stats.values(), key=lambda s: (order[s.role], s.first_seen))


@dataclass
class FlowRun:
    command: list[str]
    returncode: int
    wall: float
    output: str
    processes: list[ProcessStats]
    peak_total: int
    samples: int
    timed_out: bool


def run_flow(
    command: list[str], env: dict[str, str], log_path: Path, interval: float, timeout: float
) -> FlowRun:
    """Run ``command`` (the flow), sampling its process tree until it exits."""
    with log_path.open("wb") as output:
        start = time.perf_counter()
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT
        )
        timed_out = False
        try:
            sampler = TreeSampler(process.pid)
            while process.poll() is None:
                sampler.sample()
                if time.perf_counter() - start > timeout:
                    timed_out = True
                    process.kill()  # its workers and server die with it (PDEATHSIG)
                    break
                time.sleep(interval)
            returncode = process.wait()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        wall = time.perf_counter() - start
    return FlowRun(
        command=command,
        returncode=returncode,
        wall=wall,
        output=log_path.read_text(errors="replace"),
        processes=sampler.classify(),
        peak_total=sampler.peak_total,
        samples=sampler.samples,
        timed_out=timed_out,
    )


# --------------------------------------------------------------------------------------
# What the flow produced
# --------------------------------------------------------------------------------------


def mask_lines(output: str) -> list[dict[str, object]]:
    """The per-slide ``usable candidates computed in X s (Y s CPU)`` lines of the flow."""
    found: dict[str, dict[str, object]] = {}
    for match in MASK_LINE.finditer(output):
        found[match["slide"]] = {  # a retried slide: its last line
            "slide": match["slide"],
            "wall": float(match["wall"]),
            "cpu": float(match["cpu"]),
        }
    return [found[name] for name in sorted(found)]


def check_stores(out: Path, centers: Sequence[int]) -> list[tuple[str, bool]]:
    """Per centre: is its store published (readable, report complete, no temporary left)?"""
    from plumbing.atomic import parse_temporary
    from wsi.store.reader import read_store_info
    from wsi.store.schema import StoreError, store_path

    leftovers = [p.name for p in out.iterdir() if parse_temporary(p.name)] if out.is_dir() else []
    checks = []
    for center in centers:
        path = store_path(out, center)
        try:
            info = read_store_info(path)
            sizes = {split: len(s) for split, s in info.splits.items()}
            readable, detail = True, f"{sizes}, {path.stat().st_size / 1e6:.0f} MB"
        except StoreError as error:
            readable, detail = False, str(error)
        report_file = out / f"center_{center}.json"
        status = (
            json.loads(report_file.read_text()).get("status") if report_file.is_file() else None
        )
        ok = readable and status == "complete" and not leftovers
        checks.append(
            (f"center_{center}.h5 published: report {status}, {detail}"
             + (f", temporaries left {leftovers}" if leftovers else ""), ok)
        )  # fmt: skip
    return checks


def read_summary(out: Path) -> list[dict[str, str]]:
    path = out / "summary.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def print_table(rows: Sequence[dict[str, str]]) -> None:
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print("  ".join(f"{c:>{widths[c]}}" for c in columns))
    for row in rows:
        print("  ".join(f"{row[c]!s:>{widths[c]}}" for c in columns))


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    defaults = SlideSpec()
    parser = argparse.ArgumentParser(
        prog="python -m bench preprocess_flow", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--centers", type=int, default=CENTERS, help="number of centres")
    parser.add_argument("--patients", type=int, default=PATIENTS, help="per centre")
    parser.add_argument("--width", type=int, default=defaults.width, help="level-0 px")
    parser.add_argument("--height", type=int, default=defaults.height, help="level-0 px")
    parser.add_argument(
        "--small", action="store_true", help=f"{SMALL['width']}x{SMALL['height']} slides"
    )
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--patches-per-class", type=int, default=PATCHES_PER_CLASS)
    parser.add_argument("--interval", type=float, default=INTERVAL, help="sampling period, s")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="kill the flow after, s")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where slides are kept")
    parser.add_argument(
        "--scratch", type=Path, default=None, help="where OUT, CACHE and PREFECT_HOME go "
        "(default: a new folder under $TMPDIR)",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep OUT, CACHE and the log")
    return parser


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _mb(n: float) -> str:
    return f"{n / 1e6:.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    size = SMALL if args.small else {"width": args.width, "height": args.height}
    base = replace(SlideSpec(), **size)
    slides = dataset_slides(args.centers, args.patients, base)
    centers = list(range(args.centers))
    scratch_parent = Path(args.scratch or tempfile.gettempdir())
    scratch_parent.mkdir(parents=True, exist_ok=True)
    problem = check_disk(slides, args.cache, scratch_parent)
    if problem:
        print(f"FAIL not enough disk: {problem}")
        return 1

    print(
        f"dataset: {args.centers} centres x {args.patients} patients x 2 slides (negative, "
        f"macro) = {len(slides)} slides of {base.width}x{base.height} px "
        f"({base.gigapixels:.1f} gigapixels) at {base.mpp} µm/px, seeds "
        f"{slides[0].spec.seed}-{slides[-1].spec.seed}",
        flush=True,
    )
    root, written, write_seconds, kinds = build_dataset(slides, args.cache)
    total_bytes = sum(w.bytes for w in written)
    print(
        f"{root}\n{total_bytes / 1e9:.1f} GB of slides ({', '.join(sorted(kinds))} into the "
        f"layout), {write_seconds:.0f} s spent writing slides now"
    )

    scratch = Path(tempfile.mkdtemp(prefix="bench_preprocess_flow_", dir=scratch_parent))
    out, cache_dir, home = scratch / "out", scratch / "candidates", scratch / "prefect_home"
    home.mkdir()
    command = [
        sys.executable, "-m", "flows.preprocess", "--data-root", str(root), "--out", str(out),
        "--cache-dir", str(cache_dir), "--centers", *map(str, centers),
        "--workers", str(args.workers), "--patch-size", str(PATCH_SIZE), "--level", str(LEVEL),
        "--patches-per-class", str(args.patches_per_class),
    ]  # fmt: skip
    env = {
        **os.environ,
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_HOME": str(home),
        "COLUMNS": "200",  # rich wraps log lines at 80 columns when not on a terminal
    }
    env.pop("PREFECT_API_URL", None)  # the flow starts (and we measure) its own server
    shown_env = " ".join(
        f"{k}={env[k]}" for k in ("DO_NOT_TRACK", "PREFECT_SERVER_ANALYTICS_ENABLED",
                                  "PREFECT_HOME") if k in env
    )  # fmt: skip
    print(f"\n$ cd {REPO} && {shown_env} {' '.join(command)}", flush=True)

    try:
        run = run_flow(command, env, scratch / "flow.log", args.interval, args.timeout)
        cores = len(os.sched_getaffinity(0))
        print(
            f"exit code {run.returncode}{' (killed: timeout)' if run.timed_out else ''}, "
            f"wall {run.wall:.1f} s on {cores} cores; {run.samples} samples every "
            f"{args.interval:g} s"
        )

        # Peak memory per process.
        print("\npeak memory per process (MB; RSS sampled, VmHWM the kernel's peak)")
        print(f"{'role':<8} {'pid':>7} {'peak RSS':>8} {'VmHWM':>7} {'alive s':>9}  command")
        for p in run.processes:
            alive = f"{p.first_seen:.0f}-{p.last_seen:.0f}"
            command_text = p.command if len(p.command) <= 90 else p.command[:87] + "..."
            print(f"{p.role:<8} {p.pid:>7} {_mb(p.peak_rss):>8} {_mb(p.hwm):>7} {alive:>9}  "
                  f"{command_text}")  # fmt: skip
        workers = [p for p in run.processes if p.role == "worker"]
        server = [p for p in run.processes if p.role == "server"]
        flow_process = [p for p in run.processes if p.role == "flow"]
        print(
            f"workers: {len(workers)}, peak {', '.join(_mb(p.peak) for p in workers) or '-'} MB; "
            f"flow {', '.join(_mb(p.peak) for p in flow_process) or '-'} MB; server "
            f"{' + '.join(_mb(p.peak) for p in server) or '-'} MB; whole tree at once "
            f"{_mb(run.peak_total)} MB (sampled)"
        )

        # Masks and candidates per slide.
        masks = mask_lines(run.output)
        if masks:
            print("\nmasks + candidates per slide (the flow's per-slide log lines)")
            print(f"{'slide':<22} {'wall s':>7} {'CPU s':>7}")
            for m in masks:
                print(f"{m['slide']:<22} {m['wall']:>7.2f} {m['cpu']:>7.2f}")
            print(
                f"median of {len(masks)} slides: {statistics.median(m['wall'] for m in masks):.2f}"
                f" s wall, {statistics.median(m['cpu'] for m in masks):.2f} s CPU per "
                f"{base.gigapixels:.0f}-gigapixel slide"
            )
        else:
            print("\nmasks + candidates per slide: no per-slide line in the flow's output")

        # What the flow produced.
        rows = read_summary(out)
        print(f"\n{out / 'summary.csv'}:")
        if rows:
            print_table(rows)
        else:
            print("(missing or empty)")
        failures_file = out / "failures.json"
        failures = json.loads(failures_file.read_text()) if failures_file.is_file() else []
        for failure in failures:
            print(f"failure: {failure}")
        if run.returncode != 0:
            print(f"\nlast lines of the flow's output:\n{run.output[-3000:]}")

        checks: list[tuple[str, bool]] = []
        for p in workers:
            checks.append(
                (f"worker {p.pid}: peak {_mb(p.peak)} MB <= {_mb(TARGET_PEAK_BYTES)} MB",
                 p.peak <= TARGET_PEAK_BYTES)
            )  # fmt: skip
        if not workers:
            checks.append(("no pool worker seen", False))
        checks.append((f"flow exit code {run.returncode} == 0", run.returncode == 0))
        checks.extend(check_stores(out, centers))
        print()
        for label, ok in checks:
            print(f"{_verdict(ok)} {label}")
    finally:
        if args.keep:
            print(f"\nkept {scratch} (out/, candidates/, prefect_home/, flow.log)")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0 if all(ok for _, ok in checks) else 1  # a failed check fails the benchmark


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    raise SystemExit(main())
