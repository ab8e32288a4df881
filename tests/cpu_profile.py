"""Where a command's CPU went, by the program of each process it started.

    python -m tests.cpu_profile -- make test
    python -m tests.cpu_profile --json build/cpu.json -- .venv/bin/python -m pytest tests/pipeline

The suite's time is mostly its processes': flow commands, Prefect servers, warm servers
and the ranks they fork, FLARE's sites, DVC. To cut it, know which. This runs COMMAND as a
child subreaper (what its processes orphan stays under it: a daemonised server too),
reads every process under it from /proc every ``--interval`` seconds, and prints the CPU
(user + system) of each program: the module after ``python -m``, a script's name, an
executable's; a process forked from another without an exec of its own (a rank forked by
a warm server, a pool's worker) is counted as "forked from" its parent's program. A
process is read while it lives: what it spends after the last read before it ends is not
counted (at most ``--interval`` of CPU each), and a process that starts and ends between
two reads is not seen. The total is therefore a lower bound; ``time -v`` beside it gives
the whole. Exit status: COMMAND's.

``--by-test N``: also the N tests whose processes spent the most, each with its programs.
A process belongs to the test named by ``PYTEST_CURRENT_TEST`` in the environment it
started with (pytest sets it in each worker for the test it runs, and a test's commands
inherit it), else to its parent's test.

Figures of 2026-11-30 (4 workers, the faster kind): docs/getting-started.md, "The tests".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from plumbing.processes import adopt_orphans

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
PYTHONS = ("python", "python3")


def program(argv: Sequence[str]) -> str:
    """What a command line runs: ``python -m MODULE``, ``python -c``, ``python SCRIPT``
    (its file name), else the executable's file name."""
    if not argv:
        return "?"
    executable = Path(argv[0]).name
    if not executable.startswith(PYTHONS):
        return executable
    arguments = iter(argv[1:])
    for argument in arguments:
        if argument == "-m":
            return f"python -m {next(arguments, '')}"
        if argument == "-c":
            return "python -c"
        if argument in ("-W", "-X", "--check-hash-based-pycs"):
            next(arguments, None)  # an option's value
        elif not argument.startswith("-"):
            return f"python {Path(argument).name}"
    return "python"


@dataclass
class Seen:
    """One process: its parent as first read, its command line and CPU seconds as last."""

    parent: int
    argv: tuple[str, ...]
    cpu_s: float
    test: str | None = None  # PYTEST_CURRENT_TEST as it started, without its phase


def started_for_test(pid: int) -> str | None:
    """The test named by ``PYTEST_CURRENT_TEST`` in ``pid``'s initial environment, without
    the phase pytest appends (``(setup)``, ``(call)``, ``(teardown)``); None without it."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            variables = environ.read().split(b"\0")
    except OSError:
        return None
    for variable in variables:
        if variable.startswith(b"PYTEST_CURRENT_TEST="):
            value = variable.split(b"=", 1)[1].decode(errors="replace")
            return value.rsplit(" (", 1)[0]
    return None


def read_process(pid: int) -> tuple[int, int, float, tuple[str, ...]] | None:
    """``(parent, start time in ticks, CPU seconds, argv)`` of ``pid``, or ``None`` when it
    is gone; a zombie's argv is empty, its CPU seconds its last."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            argv = tuple(part.decode(errors="replace") for part in cmdline.read().split(b"\0")
                         if part)  # fmt: skip
    except (OSError, IndexError):
        return None
    parent, start = int(fields[1]), int(fields[19])
    cpu_s = (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND
    return parent, start, cpu_s, argv


@dataclass
class Sampler:
    """Every process under ``root`` (this one's tree), read every ``interval_s``."""

    root: int
    interval_s: float
    command: int = 0  # the command's process: its status is subprocess's to collect
    seen: dict[tuple[int, int], Seen] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def read_once(self) -> None:
        """Read every process now under ``root``: a new one with its parent, a known one's
        command line (an exec changes it) and CPU; then reap the orphans it adopted that
        have ended (zombies), their last CPU read first. Left unreaped, each would look
        alive to a test waiting for it to end, as under init it would not."""
        processes = {}
        for name in os.listdir("/proc"):
            if name.isdigit() and (found := read_process(int(name))) is not None:
                processes[int(name)] = found
        children: dict[int, list[int]] = {}
        for pid, (parent, *_) in processes.items():
            children.setdefault(parent, []).append(pid)
        todo = list(children.get(self.root, []))
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            parent, start, cpu_s, argv = processes[pid]
            if (pid, start) in self.seen:  # its parent as first read: the one that forked
                entry = self.seen[(pid, start)]  # it, not the subreaper after it ended
                entry.argv, entry.cpu_s = argv or entry.argv, cpu_s
            elif argv:
                self.seen[(pid, start)] = Seen(parent, argv, cpu_s, started_for_test(pid))
        for pid in children.get(self.root, []):
            if not processes[pid][3] and pid != self.command:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)

    def run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.read_once()

    def stop(self) -> None:
        self._stop.set()


def by_program(
    seen: dict[tuple[int, int], Seen], parents: dict[tuple[int, int], Seen] | None = None
) -> dict[str, list[float]]:
    """Each program's processes' CPU seconds; a process whose command line is its
    parent's (forked, no exec) under "forked from" that program. ``parents``: where the
    parents are looked up (all that was seen, where ``seen`` is a part of it)."""
    latest_by_pid = {pid: entry for (pid, _), entry in (parents or seen).items()}
    programs: dict[str, list[float]] = {}
    for entry in seen.values():
        name = program(entry.argv)
        parent = latest_by_pid.get(entry.parent)
        if parent is not None and parent.argv == entry.argv:
            name = f"forked from {name}"
        programs.setdefault(name, []).append(entry.cpu_s)
    return programs


def by_test(seen: dict[tuple[int, int], Seen]) -> dict[str, dict[str, list[float]]]:
    """Each test's processes by program (:func:`by_program`): a process without a test of
    its own is its nearest ancestor's that has one; those of none under "(no test)"."""
    latest_by_pid = {pid: entry for (pid, _), entry in seen.items()}

    def test_of(entry: Seen) -> str:
        visited = set()
        while entry.test is None and entry.parent in latest_by_pid:
            if entry.parent in visited:
                break
            visited.add(entry.parent)
            entry = latest_by_pid[entry.parent]
        return entry.test or "(no test)"

    grouped: dict[str, dict[tuple[int, int], Seen]] = {}
    for key, entry in seen.items():
        grouped.setdefault(test_of(entry), {})[key] = entry
    # a fork's parent may belong to another test's group: judged against all that was seen
    return {test: by_program(entries, parents=seen) for test, entries in grouped.items()}


def test_table(tests: dict[str, dict[str, list[float]]], top: int) -> list[str]:
    """The ``top`` tests by their processes' CPU, each with its programs' CPU and count."""
    ranked = sorted(tests.items(), key=lambda item: -sum(map(sum, item[1].values())))
    lines = [f"{'CPU s':>9}  test: program CPU s (processes), ..."]
    for test, programs in ranked[:top]:
        parts = sorted(programs.items(), key=lambda item: -sum(item[1]))
        lines.append(f"{sum(map(sum, programs.values())):9.1f}  {test}")
        lines.append(" " * 11 + ", ".join(f"{name} {sum(cpu):.1f} ({len(cpu)})"
                                          for name, cpu in parts))  # fmt: skip
    return lines


def table(programs: dict[str, list[float]], top: int) -> list[str]:
    """The ``top`` programs by CPU, a line for the rest, and the total."""
    total = sum(map(sum, programs.values()))
    lines = [f"{'CPU s':>9} {'share':>6} {'procs':>6} {'median':>7}  program"]
    ranked = sorted(programs.items(), key=lambda item: -sum(item[1]))
    for name, cpu in ranked[:top]:
        lines.append(f"{sum(cpu):9.1f} {100 * sum(cpu) / (total or 1):5.1f}% {len(cpu):6d} "
                     f"{statistics.median(cpu):7.2f}  {name}")  # fmt: skip
    rest = ranked[top:]
    if rest:
        rest_cpu, rest_count = sum(sum(cpu) for _, cpu in rest), sum(len(cpu) for _, cpu in rest)
        lines.append(f"{rest_cpu:9.1f} {'':>6} {rest_count:6d} {'':>7}  {len(rest)} more")
    lines.append(f"{total:9.1f} {'':>6} {sum(map(len, programs.values())):6d} {'':>7}  in all")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cpu_profile",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("--interval", type=float, default=0.5,
                        help="seconds between reads (default 0.5; a read of 60 processes "
                        "took 2.3 ms of CPU)")  # fmt: skip
    parser.add_argument("--top", type=int, default=30, help="programs listed (default 30)")
    parser.add_argument("--by-test", type=int, default=0, metavar="N",
                        help="also the N tests whose processes spent most (pytest)")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None,
                        help="write every program's processes' CPU seconds there")  # fmt: skip
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name the command after --")
    if args.interval <= 0:
        parser.error("--interval must be positive")
    adopt_orphans()  # what the command's processes orphan stays in this tree
    sampler = Sampler(os.getpid(), args.interval)
    reader = threading.Thread(target=sampler.run, daemon=True)
    started = time.monotonic()
    process = subprocess.Popen(command)
    sampler.command = process.pid
    reader.start()
    try:
        status = process.wait()
    except KeyboardInterrupt:
        status = process.wait()
    sampler.stop()
    reader.join()
    programs = by_program(sampler.seen)
    wall_s = time.monotonic() - started
    print(f"{' '.join(command)}: exit {status}, {wall_s:.0f} s", file=sys.stderr)
    print("\n".join(table(programs, args.top)), file=sys.stderr)
    tests = by_test(sampler.seen)
    if args.by_test > 0:
        print("\n".join(test_table(tests, args.by_test)), file=sys.stderr)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {"command": command, "exit": status, "wall_s": wall_s, "programs": programs,
                  "tests": tests}  # fmt: skip
        args.json.write_text(json.dumps(record, indent=1))
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main())
