"""The flake hunt: the suite's timing-sensitive groups, run again and again under load.

    python -m tests.stress                       # every group, 100 runs each, a hog of 0.5 core
    python -m tests.stress --groups launcher warm --runs 20
    python -m tests.stress --hog 1.0 --json build/stress.json

A test that passes on an idle machine can fail where the machine is busier or slower: the
slower of the project's two machine kinds has about half a core of headroom while the
suite runs. Each group below (its test files) runs ``--runs`` times in a fresh pytest,
one group after the other, while a hog process keeps ``--hog`` of one core busy (spinning
that share of every 10 ms), and as CI starts it: a background job of a script, SIGINT and
SIGQUIT ignored (a signal lost in the warm shim's window showed only so; ``--foreground``
leaves them as this command has them), and under coverage of every process, as ``make
test`` runs (:func:`coverage_environment`; a process's coverage saves its data as it
exits, and two exits racing showed only so; ``--no-coverage`` runs without). What it
prints, per group: runs, failed runs, failures per 100 runs, and each failing test with
how often it failed; the whole record as JSON with ``--json``. Exit 1 when any run failed.

Run it before touching the launcher, the warm server, signal handling, the Slurm
cluster's tests or the crash and fault campaigns (docs/getting-started.md, "The tests").
A failure it finds is fixed where it lives (in the product where the product is wrong,
else in the test's own timing), never by a retry, a looser assertion or a skip.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plumbing.atomic import write_json
from plumbing.processes import parent_bound_command, stop_tree, tree_bound_command

REPO = Path(__file__).resolve().parents[1]

GROUPS: dict[str, tuple[str, ...]] = {
    # mpiexec's fork launcher, ranks killed and stopped, shared memory, the kept server;
    # hydra's ssh hosts (loopback, and network namespaces where it may make them)
    "launcher": (
        "tests/proxyfl/test_launch_mpi.py",
        "tests/proxyfl/test_address_exchange.py",
        "tests/proxyfl/test_hosts.py",
        "tests/proxyfl/test_hosts_netns.py",
    ),
    # the warm server: forked ranks, their shims, signals passed on, queued requests
    "warm": ("tests/test_warm.py",),
    # ranks that host several clients: one killed mid-round and resumed, a client failing
    # mid-training, a run stopped and resumed on fewer ranks (one failed under a hog and
    # a second worker's load, 2026-12-03: the resumed run's files were not the whole's)
    "clients": ("tests/proxyfl/test_clients_mpi.py",),
    # Ctrl-C and SIGTERM through flows, process trees bound to their parents, file locks,
    # a killed preprocessing run's pool and server (one failed under a hog, 2026-12-01)
    "signals": (
        "tests/pipeline/test_interrupt.py",
        "tests/test_processes.py",
        "tests/test_locks.py",
        "tests/flows/test_preprocess_runner.py",
    ),
    # the Prefect deployment: a served flow run, its worker, cancelled and stopped
    "deployment": ("tests/pipeline/test_deployment.py",),
    # a one-node Slurm cluster: sbatch, srun's tasks, a killed task (skips without Slurm)
    "slurm": ("tests/slurm/test_slurm.py",),
    # FLARE: sites killed mid-run, the launcher stopped and killed, sites that cannot join
    # (tests/proxyfl's files together: named after a file of another folder, pytest did
    # not give the later one tests/proxyfl/conftest.py's fixtures)
    "flare": (
        "tests/proxyfl/test_flare.py",
        "tests/proxyfl/test_federation.py",
        "tests/test_sites.py",
    ),
    # power loss at every write, and the preprocessing's injected faults
    "campaigns": (
        "tests/pipeline/test_crash_campaign.py",
        "tests/flows/test_preprocess_faults.py",
    ),
}
"""Every test file that watches the clock or signals processes (``CLOCKED_FILES`` of
tests/conftest.py, checked by tests/test_test_plumbing.py), and the launcher's, Slurm's
and the fault campaigns'."""

# what the hog runs: `share` of one core busy, in every period of 10 ms
HOG = """
import sys, time
share, period = float(sys.argv[1]), 0.01
while True:
    start = time.perf_counter()
    while time.perf_counter() - start < share * period:
        pass
    if share < 1:
        time.sleep((1 - share) * period)
"""


@dataclass
class GroupRecord:
    """What ``runs`` runs of one group gave."""

    group: str
    files: tuple[str, ...]
    runs: int = 0
    failed_runs: int = 0
    seconds: list[float] = field(default_factory=list)
    failing_tests: Counter[str] = field(default_factory=Counter)
    skipped_tests: Counter[str] = field(default_factory=Counter)

    def record(self) -> dict[str, Any]:
        """What ``--json`` writes of this group (a Counter's entries as a mapping: dataclasses'
        ``asdict`` would rebuild it from its pairs)."""
        return {"group": self.group, "files": list(self.files), "runs": self.runs,
                "failed_runs": self.failed_runs, "failures_per_100": self.failures_per_100,
                "seconds": self.seconds, "failing_tests": dict(self.failing_tests),
                "skipped_tests": dict(self.skipped_tests)}  # fmt: skip

    def add(self, outcome: RunOutcome) -> None:
        """One more finished run of the group."""
        self.runs += 1
        self.seconds.append(outcome.seconds)
        self.skipped_tests.update(outcome.skipped)
        if not outcome.passed:
            self.failed_runs += 1
            self.failing_tests.update(outcome.failed or [f"(exit {outcome.code})"])

    @property
    def failures_per_100(self) -> float:
        return 100.0 * self.failed_runs / self.runs if self.runs else 0.0

    def line(self) -> str:
        median = statistics.median(self.seconds) if self.seconds else 0.0
        return (
            f"{self.group:<10} {self.runs:>5} runs  {self.failed_runs:>4} failed  "
            f"{self.failures_per_100:6.1f} per 100  median {median:6.1f} s a run"
        )


@contextmanager
def hog(share: float) -> Iterator[None]:
    """A process keeping ``share`` of one core busy for the block (none for 0), bound to
    this one: a stress command ended by SIGTERM or SIGKILL runs no ``finally``, and its
    hog would spin on, loading whatever runs next."""
    if share <= 0:
        yield
        return
    process = subprocess.Popen(parent_bound_command([sys.executable, "-c", HOG, str(share)]))
    try:
        yield
    finally:
        process.kill()
        process.wait()


def failed_tests(report: Path) -> list[str]:
    """The node ids of the tests a junit XML report says failed or errored."""
    return _cases(report, "failure", "error")


def skipped_tests(report: Path) -> list[str]:
    """The node ids of the tests a junit XML report says were skipped (Slurm's, where
    slurm-wlm is not installed: a group that ran nothing found nothing)."""
    return _cases(report, "skipped")


def _cases(report: Path, *outcomes: str) -> list[str]:
    if not report.is_file():
        return []
    return [f"{case.get('classname', '')}::{case.get('name', '')}"
            for case in ElementTree.parse(report).getroot().iter("testcase")
            if any(case.find(outcome) is not None for outcome in outcomes)]  # fmt: skip


@dataclass(frozen=True)
class RunOutcome:
    """One run of a group: pytest's exit code, its seconds, the tests that failed and the
    tests that skipped."""

    code: int
    seconds: float
    failed: list[str]
    skipped: list[str]

    @property
    def passed(self) -> bool:
        return self.code in (0, 5)  # 5: every test deselected


def coverage_environment(workdir: Path) -> dict[str, str]:
    """This process's environment with what ``make test`` adds for coverage of every
    process (the Makefile's ``test`` target): the data files in ``workdir``, the
    configuration, and tests/coverage_site (whose sitecustomize starts it) on the path."""
    (workdir / "coverage").mkdir(parents=True, exist_ok=True)
    site = str(REPO / "tests" / "coverage_site")
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "COVERAGE_FILE": str(workdir / "coverage" / ".coverage"),
            "CAMELYON_PROXYFL_TEST_COVERAGE": str(REPO / "pyproject.toml"),
            "PYTHONPATH": f"{site}:{path}" if path else site}  # fmt: skip


# What a non-interactive shell does to a command it starts with ``&``: SIGINT and SIGQUIT
# ignored, which every process the command starts inherits (CI's are so); then the command
AS_BACKGROUND_JOB = (
    "import os, signal, sys\n"
    "for number in (signal.SIGINT, signal.SIGQUIT):\n"
    "    signal.signal(number, signal.SIG_IGN)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def run_group(files: Sequence[str], workdir: Path, pytest_args: Sequence[str],
              background: bool = True, coverage: bool = True) -> RunOutcome:  # fmt: skip
    """One run of a group in a fresh pytest, its folders and report in ``workdir``; started
    as a background job (:data:`AS_BACKGROUND_JOB`) unless ``background`` is false, under
    coverage (:func:`coverage_environment`) unless ``coverage`` is false."""
    report = workdir / "report.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               f"--basetemp={workdir / 'tmp'}", f"--junitxml={report}", *pytest_args,
               *files]  # fmt: skip
    if background:  # started by its own exec: the supervisor below takes SIGINT to stop
        command = [sys.executable, "-c", AS_BACKGROUND_JOB, *command]
    started = time.perf_counter()
    environment = coverage_environment(workdir) if coverage else None
    # under a supervisor bound to this process that ends every process under it, what it
    # adopts included (tree_bound_command): stopped or killed mid-run, a stress command
    # otherwise left that run, its Prefect server and Slurm daemons running on, loading
    # whatever ran next, and a job's slurmstepd (slurmd's double fork: no descendant of
    # pytest's) kept the step's ranks going with its scratch folder
    process = subprocess.Popen(tree_bound_command(command), cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=environment)  # fmt: skip
    try:
        output, _ = process.communicate()
    except BaseException:
        stop_tree(process.pid)
        raise
    outcome = RunOutcome(process.returncode, time.perf_counter() - started,
                         failed_tests(report), skipped_tests(report))  # fmt: skip
    if not outcome.passed:
        (workdir / "output.txt").write_text(output)
    return outcome


def _stopped(number: int, frame: object) -> None:
    """SIGTERM or SIGHUP: stop as Ctrl-C does, the current run's processes with this one."""
    raise SystemExit(128 + number)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.stress", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--groups", nargs="+", choices=sorted(GROUPS), default=list(GROUPS))
    parser.add_argument("--runs", type=int, default=100, help="runs of each group (default: 100)")
    parser.add_argument(
        "--hog",
        type=float,
        default=0.5,
        help="share of one core the hog keeps busy (default: 0.5; 0: none)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the record there")
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="keep each failed run's output and pytest folders there",
    )
    parser.add_argument(
        "--foreground",
        action="store_true",
        help="run pytest with SIGINT and SIGQUIT as this command has them, not ignored",
    )
    parser.add_argument(
        "--no-coverage",
        action="store_true",
        help="run pytest without coverage (make test measures every process it starts)",
    )
    parser.add_argument("pytest_args", nargs="*", help="more pytest options, after --")
    args = parser.parse_args(argv)
    if args.runs < 1 or not 0 <= args.hog <= 1:
        parser.error("--runs >= 1 and 0 <= --hog <= 1")
    records = {name: GroupRecord(name, GROUPS[name]) for name in args.groups}
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, _stopped)
    print(
        f"{len(records)} group(s) x {args.runs} run(s), a hog of {args.hog} core "
        f"({os.cpu_count()} cores), "
        + ("as a foreground job" if args.foreground else "SIGINT and SIGQUIT ignored, as CI's")
        + (", without coverage" if args.no_coverage else ", under coverage, as make test"),
        flush=True,
    )
    stopped_with: int | None = None
    run = 0
    # a folder a stopped run's last process still wrote into is not worth a traceback:
    # the record is what the command is for, and it is said before the folder goes
    folder = tempfile.TemporaryDirectory(prefix="stress-", ignore_cleanup_errors=True)
    with hog(args.hog), folder as scratch:
        try:
            for run in range(1, args.runs + 1):
                for record in records.values():
                    workdir = Path(scratch) / f"{record.group}-{run}"
                    workdir.mkdir()
                    outcome = run_group(record.files, workdir, args.pytest_args,
                                        background=not args.foreground,
                                        coverage=not args.no_coverage)  # fmt: skip
                    record.add(outcome)
                    if not outcome.passed:
                        if args.keep is not None:
                            args.keep.mkdir(parents=True, exist_ok=True)
                            shutil.move(workdir, args.keep / workdir.name)
                        print(f"run {run}: {record.group} FAILED {', '.join(outcome.failed)}",
                              flush=True)  # fmt: skip
                print(
                    f"run {run}/{args.runs}: "
                    + "  ".join(f"{r.group} {r.failed_runs}" for r in records.values()),
                    flush=True,
                )
        except (KeyboardInterrupt, SystemExit) as stop:
            # Ctrl-C, SIGTERM or SIGHUP (_stopped): the run under way was stopped with its
            # processes (run_group); a hunt of hours is often ended so, and what its
            # finished runs found is still said and kept
            if isinstance(stop, KeyboardInterrupt):
                stopped_with = 128 + signal.SIGINT
            else:  # _stopped's status; a SystemExit of anyone else's may carry None or text
                stopped_with = stop.code if isinstance(stop.code, int) else 1
            print(f"\nstopped during run {run} of {args.runs}; the runs finished before it:",
                  flush=True)  # fmt: skip
        summarize(records.values(), args.json)
    if stopped_with is not None:
        return stopped_with
    return 1 if any(record.failed_runs for record in records.values()) else 0


def summarize(records: Iterable[GroupRecord], json_path: Path | None) -> None:
    """Each group's line (:meth:`GroupRecord.line`), its failing tests and how many tests
    it skipped; the records also written to ``json_path``, where given."""
    groups = list(records)
    print()
    for record in groups:
        print(record.line())
        for test, count in record.failing_tests.most_common():
            print(f"    {count:>4} x {test}")
        if record.skipped_tests:
            print(f"    skipped: {len(record.skipped_tests)} test(s), e.g. "
                  f"{next(iter(record.skipped_tests))}")  # fmt: skip
    if json_path is not None:  # whole or not at all: the stop may come again meanwhile
        json_path.parent.mkdir(parents=True, exist_ok=True)
        write_json(json_path, {record.group: record.record() for record in groups})


if __name__ == "__main__":
    sys.exit(main())
