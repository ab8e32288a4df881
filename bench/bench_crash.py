"""Crash anywhere, lose nothing: a randomized power-loss campaign over the pipeline's commands.

On a copy of the demo's outputs (the project at ``HEAD``, the demo's slides linked, its
stores, runs, staging and results copied, a Prefect home of its own), each *command* is
first run once uninterrupted, after its preparation (its outputs removed, or a parameter
changed, so that it has work to do): the reference, its outputs' content and its time.
Then, at each of ``--points`` points (seeded: the command and the instant are drawn from
``--seed``), the command is prepared again and started, and at the drawn instant, uniform
over the reference's time, **every process of the copy** (the command and all it started:
its Prefect server, workers, MPI ranks, DVC's children) is killed with SIGKILL at once, as
a power loss stops them; then the same command is run again to completion, and:

- **rerun**: whether it succeeded (exit 0), and its time against the reference's;
- **divergence**: every output compared *by content* with the reference's (metrics without
  their timings, stores by their datasets, kept models by their bytes, tables, report.html,
  the lock's entries), each file that differs or is missing named;
- **leftovers**: processes of the copy still alive, temporary files (``.NAME.PID.tmp``,
  ``*.partial``) anywhere in it, and Prefect flow runs its database still shows Running.

The commands: ``report`` (``python -m flows.report``), ``stage`` (one centre's staging,
its folder removed), ``preprocess`` (one centre's store removed), ``train`` (one run,
Regular seed 0, removed), ``dvc`` (``dvc repro report`` after
``report.staging_pictures_mb`` changed from the committed lock's). Not here: the audit
(minutes of reference models a point) and the Prefect deployment run (its worker's
process tree is the deployment's; ``tests/pipeline/test_deployment.py`` kills it).

``python -m bench crash --points 40`` (after ``make demo``); ``--commands report stage``
chooses; ``--keep`` keeps the copy. Exit 1 when a point diverged or left something.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

IN_DEFAULT_RUN = False  # needs the demo's outputs, and an hour for 40 points

ROOT = Path(__file__).resolve().parents[1]
TEMPORARY = re.compile(r"^\..+\.[0-9]+\.tmp$|\.partial$|\.tmp$")
# fields of a run's records that say how long, when or where, not what was computed
TIMING_KEYS = re.compile(r"seconds|_s$|time|wall|elapsed|started|finished_at|host|pid|date")


def digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _without_timings(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if not TIMING_KEYS.search(k)}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def content_digest(path: Path) -> str:
    """A file's content, as the campaign compares it: JSON and JSON lines without their
    timing fields, an HDF5 file by its datasets and attributes, anything else by bytes."""
    if path.suffix == ".json" or path.suffix == ".jsonl":
        lines = path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]
        values = [_without_timings(json.loads(line)) for line in lines if line.strip()]
        return digest_bytes(json.dumps(values, sort_keys=True).encode())
    if path.suffix == ".h5":
        import h5py

        parts: list[bytes] = []
        with h5py.File(path, "r") as handle:

            def visit(name: str, item: object) -> None:
                parts.append(name.encode())
                if isinstance(item, h5py.Dataset):
                    value = item[()]
                    # strings are objects: their text, not the array's pointers
                    if item.shape == ():
                        parts.append(repr(value).encode())
                    elif value.dtype.kind == "O":
                        parts.append(repr(value.tolist()).encode())
                    else:
                        parts.append(value.tobytes())
                attrs = getattr(item, "attrs", {})
                for key in sorted(attrs):
                    if not TIMING_KEYS.search(key):
                        parts.append(f"{key}={attrs[key]!r}".encode())

            visit("/", handle)
            handle.visititems(visit)
        return digest_bytes(b"\0".join(parts))
    return digest_bytes(path.read_bytes())


def tree_digests(
    root: Path, relative: Sequence[str], skip: Callable[[Path], bool]
) -> dict[str, str]:
    """``{path: content digest}`` of every file under each of ``relative`` (a file or a
    folder under ``root``) but those ``skip`` names."""
    digests = {}
    for name in relative:
        base = root / name
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for path in files:
            if not skip(path):
                digests[path.relative_to(root).as_posix()] = content_digest(path)
    return digests


def _ordinary(path: Path) -> bool:
    """Files that are not outputs: digests beside their file (compared through it), empty
    lock files, timings (they change with every run), inputs records (identities by time)."""
    name = path.name
    return (name.endswith((".sha256", ".lock")) or name.startswith("timings")
            or name.endswith(".inputs.json") or "machine.json" in name
            or name == "job.log" or TEMPORARY.search(name) is not None)  # fmt: skip


@dataclass(frozen=True)
class CrashCommand:
    """A command of the campaign: how to make it do work, what it runs, what it writes."""

    name: str
    argv: Sequence[str]
    prepare: Callable[[Path], None]
    outputs: Sequence[str]
    # outputs that say what happened, a failure included (preprocess's summary of every
    # centre): a failed command rewrites them to say it failed, which is not half-written
    records: Sequence[str] = ()

    def digests(self, copy: Path) -> dict[str, str]:
        digests = tree_digests(copy, [o for o in self.outputs if (copy / o).exists()], _ordinary)
        if self.name == "dvc":  # the lock's entry of the stage it ran, not the file's order
            lock = json.dumps(_lock_entry(copy / "dvc.lock", "report"), sort_keys=True)
            digests["dvc.lock#report"] = digest_bytes(lock.encode())
        return digests


def _lock_entry(path: Path, stage: str) -> object:
    import yaml

    entry = yaml.safe_load(path.read_text())["stages"][stage]
    for dep in entry.get("deps", []):
        dep.pop("size", None)  # a rewritten file's size is its content's; md5 says it
    return entry


def _remove(*relative: str) -> Callable[[Path], None]:
    def prepare(copy: Path) -> None:
        for name in relative:
            target = copy / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()

    return prepare


def _change_pictures_budget(copy: Path) -> None:
    """``report.staging_pictures_mb`` changed from the committed lock's (6) to 5, the lock
    and the parameters restored first: each time the report stage is stale by the same
    change, so every rerun must end where the reference did."""
    subprocess.run(["git", "checkout", "--quiet", "--", "dvc.lock", "params.yaml"], cwd=copy,
                   check=True)  # fmt: skip
    params = copy / "params.yaml"
    text = params.read_text()
    now = re.search(r"staging_pictures_mb: ([0-9.]+)", text)
    assert now is not None and now.group(1) != "5.0", "params.yaml: staging_pictures_mb"
    params.write_text(text.replace(now.group(0), "staging_pictures_mb: 5.0"))


PYTHON = sys.executable
COMMANDS: dict[str, CrashCommand] = {
    c.name: c
    for c in (
        CrashCommand("report", [PYTHON, "-m", "flows.report"],
                     _remove("results/tables", "results/report.html", "results/metrics.json"),
                     ["results/tables", "results/report.html", "results/metrics.json"]),
        CrashCommand("stage", [PYTHON, "-m", "flows.stage", "--centers", "1", "--step",
                               "centres"],
                     _remove("staging/center_1", "staging/center_1.inputs.json"),
                     ["staging/center_1"]),
        CrashCommand("preprocess", [PYTHON, "-m", "flows.preprocess", "--centers", "2"],
                     _remove("data/patches/center_2.h5", "data/patches/center_2.json",
                             "data/patches/center_2.inputs.json"),
                     ["data/patches/center_2.h5", "data/patches/center_2.json",
                      "data/patches/failures.json", "data/patches/summary.json",
                      "data/patches/summary.csv"], records=["data/patches/summary.csv"]),
        CrashCommand("train", [PYTHON, "-m", "flows.train", "--algorithms", "Regular",
                               "--seeds", "0"],
                     _remove("runs/Regular/seed_0"),
                     ["runs/Regular/seed_0/metrics.jsonl", "runs/Regular/seed_0/models",
                      "runs/Regular/seed_0/predictions", "runs/Regular/seed_0/run.json"]),
        CrashCommand("dvc", [PYTHON, "-m", "flows.server", "--", "dvc", "repro", "report"],
                     _change_pictures_budget, ["results/report.html", "results/tables"]),
    )
}  # fmt: skip


# the commands in the pipeline's order: a reference of a command is taken after those
# upstream of it wrote theirs (the report of the runs the train reference trained)
PIPELINE_ORDER = ("preprocess", "train", "stage", "report", "dvc")


def upstream_first(names: Sequence[str]) -> list[str]:
    """``names`` in :data:`PIPELINE_ORDER`, the order their references are taken in."""
    return sorted(names, key=PIPELINE_ORDER.index)


def make_copy(source: Path, folder: Path) -> Path:
    """The project at ``HEAD`` with the demo's outputs: slides and DVC's cache hard-linked
    (read only), stores, runs, staging and results copied."""
    copy = folder / "project"
    subprocess.run(["git", "clone", "--quiet", str(source), str(copy)], check=True)
    # read only, never rewritten in place: hard links (DVC's cache, so that the copy's
    # outputs are in its cache as the project's are, and `dvc status` is clean)
    for name in ("data/synthetic", ".dvc/cache"):
        if (source / name).is_dir():
            shutil.copytree(source / name, copy / name, copy_function=os.link,
                            dirs_exist_ok=True)  # fmt: skip
    for name in ("data/patches", "data/cache", "runs", "staging", "results"):
        if (source / name).exists():
            shutil.copytree(source / name, copy / name, dirs_exist_ok=True, symlinks=True)
    return copy


def copy_processes(copy: Path, exclude: set[int]) -> list[psutil.Process]:
    """The live processes of the copy: started in it (their working directory) or naming
    it on their command line."""
    found = []
    for process in psutil.process_iter(["pid", "cwd", "cmdline", "status"]):
        info = process.info
        if info["pid"] in exclude or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cwd, cmdline = info["cwd"] or "", " ".join(info["cmdline"] or [])
        if cwd.startswith(str(copy)) or str(copy) in cmdline:
            found.append(process)
    return found


def power_loss(root: psutil.Process, copy: Path, exclude: set[int]) -> int:
    """SIGKILL to the command's whole tree and every other process of the copy, all at
    once (collected first, so that none is missed by dying parents); how many."""
    try:
        victims = {p.pid: p for p in root.children(recursive=True)}
        victims[root.pid] = root
    except psutil.NoSuchProcess:
        victims = {}
    victims.update({p.pid: p for p in copy_processes(copy, exclude)})
    for process in victims.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    return len(victims)


def stuck_flow_runs(prefect_home: Path) -> list[str]:
    """Flow runs the copy's Prefect database still shows Running (or Pending)."""
    database = prefect_home / "prefect.db"
    if not database.exists():
        return []
    # closed here: a connection left to the collector (its statement cache is a cycle)
    # closes later, folding and deleting the copy's WAL at a moment nobody chose
    with contextlib.closing(sqlite3.connect(database)) as connection:
        rows = connection.execute(
            "select name, state_type from flow_run where state_type in ('RUNNING', 'PENDING')"
        ).fetchall()
    return [f"{name} ({state})" for name, state in rows]


def temporaries(copy: Path) -> list[str]:
    skip = {".git", ".venv", ".dvc"}
    found = []
    for path in copy.rglob("*"):
        parts = path.relative_to(copy).parts
        if parts and parts[0] in skip:
            continue
        if path.is_file() and TEMPORARY.search(path.name):
            found.append(path.relative_to(copy).as_posix())
    return sorted(found)


@dataclass
class Point:
    command: str
    instant_s: float
    killed: int = 0
    finished_before_kill: bool = False
    rerun_ok: bool = False
    rerun_s: float = 0.0
    differs: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)


def run_command(command: CrashCommand, copy: Path, env: dict[str, str],
                timeout_s: float = 1800) -> tuple[int, float, str]:  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(command.argv, cwd=copy, env=env, capture_output=True, text=True,
                            timeout=timeout_s)  # fmt: skip
    return result.returncode, time.monotonic() - started, result.stdout + result.stderr


def crash_point(command: CrashCommand, copy: Path, env: dict[str, str], instant_s: float,
                reference: dict[str, str], prefect_home: Path) -> Point:  # fmt: skip
    point = Point(command.name, instant_s)
    command.prepare(copy)
    process = subprocess.Popen(command.argv, cwd=copy, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    root = psutil.Process(process.pid)
    try:
        process.wait(timeout=instant_s)
        point.finished_before_kill = True
    except subprocess.TimeoutExpired:
        point.killed = power_loss(root, copy, {os.getpid()})
        process.wait()
    time.sleep(0.5)  # the kernel reaps; nothing restarts a killed process
    code, point.rerun_s, output = run_command(command, copy, env)
    point.rerun_ok = code == 0
    if not point.rerun_ok:
        point.differs.append(f"rerun exit {code}: {output.strip().splitlines()[-1:]}")
    now = command.digests(copy)
    point.differs += sorted(name for name in reference.keys() | now.keys()
                            if reference.get(name) != now.get(name))  # fmt: skip
    point.leftovers += [f"process {p.pid} {' '.join(p.cmdline()[:3])}"
                        for p in copy_processes(copy, {os.getpid()})]  # fmt: skip
    point.leftovers += [f"temporary {name}" for name in temporaries(copy)]
    point.leftovers += [f"flow run {name}" for name in stuck_flow_runs(prefect_home)]
    return point


def campaign_arguments(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, points: int,
    commands: Sequence[str],
) -> argparse.Namespace | None:  # fmt: skip
    """A campaign's options (``--points``, ``--seed``, ``--commands``, ``--source``,
    ``--keep``, and what ``parser`` already has), parsed; ``None`` after saying so when the
    source holds no outputs to copy."""
    parser.add_argument("--points", type=int, default=points)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--commands", nargs="+", choices=sorted(COMMANDS),
                        default=list(commands))  # fmt: skip
    parser.add_argument(
        "--source",
        type=Path,
        default=ROOT,
        help="the project whose outputs are copied (default: this one)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the copy (its path is said)")
    args = parser.parse_args(argv)
    if not (args.source / "runs").is_dir() or not (args.source / "data" / "patches").is_dir():
        print(f"error: {args.source}: no demo outputs to copy (run `make demo` first)",
              file=sys.stderr)  # fmt: skip
        return None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench crash", description=__doc__)
    args = campaign_arguments(parser, argv, 40, sorted(COMMANDS))
    if args is None:
        return 2
    folder = Path(tempfile.mkdtemp(prefix="crash-"))
    try:
        copy = make_copy(args.source, folder)
        prefect_home = folder / "prefect-home"
        env = {
            **os.environ,
            "PREFECT_HOME": str(prefect_home),
            "PATH": f"{Path(PYTHON).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        env.pop("PREFECT_API_URL", None)  # each command its own server, as a user's would
        # `dvc repro report` must find the rest up to date, else it rebuilds it first
        status = subprocess.run(["dvc", "status"], cwd=copy, env={**env, "DVC_NO_ANALYTICS": "1"},
                                capture_output=True, text=True)  # fmt: skip
        if "dvc" in args.commands and "up to date" not in status.stdout:
            print(f"error: the copy of {args.source} is not up to date (`dvc status`: "
                  f"{status.stdout.strip()[:500]}); run `make demo` there first",
                  file=sys.stderr)  # fmt: skip
            return 2
        references: dict[str, tuple[float, dict[str, str]]] = {}
        for name in upstream_first(args.commands):
            command = COMMANDS[name]
            command.prepare(copy)
            code, seconds, output = run_command(command, copy, env)
            if code != 0:
                print(f"error: the reference {name} failed (exit {code}):\n{output[-3000:]}",
                      file=sys.stderr)  # fmt: skip
                return 1
            references[name] = (seconds, command.digests(copy))
            print(f"reference {name}: {seconds:.1f} s, {len(references[name][1])} outputs",
                  flush=True)  # fmt: skip
        draw = random.Random(args.seed)
        points = []
        for index in range(args.points):
            name = draw.choice(args.commands)
            seconds, reference = references[name]
            instant = draw.uniform(0.0, seconds)
            point = crash_point(COMMANDS[name], copy, env, instant, reference, prefect_home)
            points.append(point)
            verdict = "ok" if not point.differs and not point.leftovers else "FAILED"
            done = ", already done" if point.finished_before_kill else ""
            print(f"point {index + 1:>2}: {name:<10} killed at {instant:6.1f} s "
                  f"({point.killed} processes{done}); "
                  f"rerun {'ok' if point.rerun_ok else 'FAILED'} in {point.rerun_s:.1f} s "
                  f"(reference {seconds:.1f} s); {verdict}"
                  + "".join(f"\n    differs: {d}" for d in point.differs)
                  + "".join(f"\n    left: {x}" for x in point.leftovers), flush=True)  # fmt: skip
        diverged = sum(bool(p.differs) for p in points)
        left = sum(bool(p.leftovers) for p in points)
        killed = sum(not p.finished_before_kill for p in points)
        print(f"\n{len(points)} points over {', '.join(args.commands)} (seed {args.seed}): "
              f"{diverged} diverged, {left} left something behind; {killed} killed the "
              f"command midway (the others came after it had finished)")  # fmt: skip
        for name in args.commands:
            mine = [p for p in points if p.command == name]
            if mine:
                seconds = references[name][0]
                extra = statistics.median(p.rerun_s for p in mine) / seconds
                print(f"  {name}: {len(mine)} points, rerun median {extra:.2f}x the "
                      f"uninterrupted {seconds:.1f} s")  # fmt: skip
        return 1 if diverged or left else 0
    finally:
        if args.keep:
            print(f"the copy: {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
