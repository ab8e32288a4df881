"""Launch one training run as an MPI job and follow what its ranks say.

A run is ``mpiexec -n K python -m mpi4py -m proxyfl.run ...`` with K = the number of
clients (one for Joint, which pools the clients' data). ``mpiexec`` is called by its full
path next to the interpreter (pip's ``mpich`` installs it there), and ``-m mpi4py`` makes
an exception in any rank abort the whole job instead of leaving the others waiting.
Where the ranks run, what starts them, and so what of the job listens on a network, is
its :class:`Placement`: on this machine only (the default, no socket at all), across
hosts named in a list or a hostfile (hydra's ``mpiexec``, over ssh), or where a Slurm
allocation has room (``srun``).

Every line the job prints is handed to a callback as it arrives (a Prefect task forwards
them to the run's log) and appended to ``RUN_DIR/job.log``. When the job fails,
:class:`TrainingJobFailed` carries the exit code, the rank that failed first and why (from
the record it left in ``RUN_DIR/failures/``, :class:`proxyfl.engine.validation.RankFailure`), and
its last lines.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from plumbing.output import passing_output
from plumbing.processes import interrupted, tree_bound_command
from plumbing.refusals import EXIT_REFUSED, naming
from plumbing.warm import WarmRanks, kept_warm_server, warm_server
from proxyfl.config import TrainConfig
from proxyfl.engine.validation import (
    EXIT_STOPPED,
    RankFailure,
    clear_failures,
    rank_name,
    read_failures,
)
from proxyfl.launch.accounting import record_launcher_wall
from proxyfl.launch.address_exchange import (
    AddressesOfUnequalLength,
    AddressExchangeWatch,
    launched_again_on_unequal_addresses,
)
from proxyfl.launch.hosts import lost_host, named_hosts
from proxyfl.launch.placement import Placement
from proxyfl.launch.progress import RoundFollower, RoundProgress
from proxyfl.launch.rundir import (
    CONFIG_FILE,
    Action,
    LaunchPlan,
    RunState,
    prepare,
    publish_staged,
    read_recorded_run,
    write_config,
)
from proxyfl.launch.shared_memory import (
    remove_orphaned_segments,
    remove_segments_since,
    segment_names,
    warn_if_short,
)
from proxyfl.launch.slurm import empty_srun_options, tasks_ended
from proxyfl.names import CUDA_ALLOCATOR_SETTING
from proxyfl.results import METRICS_FILE, RUN_FILE

logger = logging.getLogger(__name__)

JOB_LOG = "job.log"
# how a rank the machine refused says so (proxyfl.run), before the job ends with exit 3
RANK_REFUSAL_PREFIX = "proxyfl.run: error: "
# seconds a stopped job's processes have between SIGTERM and SIGKILL: a rank loses at most
# the round under way (checkpoints are written whole or not at all)
STOP_GRACE_S = 3.0
# every log line of a rank starts so (proxyfl.run's logging format): tails are kept per rank
_RANK_PREFIX = re.compile(r"\[rank (\d+)(?: client \d+)?\]")
# how MPICH's fork launcher reports a rank a signal ended; it exits 0 all the same
_RANK_SIGNALED = re.compile(r"^\[\d+\](\d+):Return code = -?\d+, signaled with (.+)$")
# srun's words for a task that exited non-zero
_TASK_EXITED = re.compile(r"^Exited with exit code (\d+)$")
# the signals a launcher sends the other ranks once one has died
_LAUNCHER_STOPS = {"fork": (signal.SIGQUIT, signal.SIGINT), "srun": (signal.SIGTERM,)}
_SIGNAL_BY_DESCRIPTION = {
    description: number
    for number in signal.valid_signals()
    if (description := signal.strsignal(number)) is not None
}


# What a rank imports before its first line of work: proxyfl.run's imports deferred until
# its input is checked, mpi4py's runner, and torch._dynamo, which the first optimizer a
# rank builds imports (torch.optim.Optimizer.__init__ is wrapped by _disable_dynamo; 0.85 s
# of CPU a rank). On one machine a warm server imports them once and forks the ranks from
# it (plumbing.warm). Not mpi4py.MPI: its import initialises MPI.
RANK_IMPORTS = (
    "torch", "torch._dynamo", "opacus", "proxyfl.algorithms.strategies", "proxyfl.comm.graphs",
    "proxyfl.engine.checkpoint", "proxyfl.engine.runtime", "proxyfl.loop", "proxyfl.records",
    "proxyfl.engine.trained", "proxyfl.trainer", "proxyfl.engine.memory", "mpi4py.run",
)  # fmt: skip
# A FLARE site's job process (proxyfl.sites.warm_launcher) runs FLARE's worker and the
# rank's executor first: imported with the rest, once, they spare each site's job 1.4 s of
# CPU (neither starts a thread as it is imported: the server forks)
SITE_JOB_IMPORTS = ("nvflare.private.fed.app.client.worker_process", "proxyfl.sites.executor")
# the FLARE server's job process (its RunController's), forked warm where `sites start`
# runs a server (proxyfl.sites.warm_launcher): no torch
SERVER_JOB_IMPORTS = ("nvflare.private.fed.app.server.runner_process",
                      "proxyfl.sites.controller")  # fmt: skip


def rank_imports(placement: Placement) -> tuple[str, ...]:
    """What the warm server of ``placement``'s jobs imports before it forks a rank: under
    FLARE on this machine it forks the sites' and the server's job processes, which import
    :data:`SITE_JOB_IMPORTS` and :data:`SERVER_JOB_IMPORTS` besides."""
    if placement.launcher == "flare":
        return RANK_IMPORTS + SITE_JOB_IMPORTS + SERVER_JOB_IMPORTS
    return RANK_IMPORTS


@dataclass(frozen=True)
class TrainingJob:
    """One training run: its validated configuration, whose ``data``, ``run_dir`` and
    ``centers`` are set. The job's ranks read it from ``run_dir/config.json``
    (``proxyfl.run --config``), never from regenerated flags."""

    config: TrainConfig
    placement: Placement = Placement()  # noqa: RUF009 - frozen, so one shared default is safe

    def __post_init__(self) -> None:
        missing = [name for name in ("data", "run_dir", "centers")
                   if getattr(self.config, name) is None]  # fmt: skip
        if missing:
            raise ValueError(f"a training job needs {', '.join(missing)} set")

    @property
    def algorithm(self) -> str:
        return self.config.algorithm

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def run_dir(self) -> Path:
        assert self.config.run_dir is not None
        return self.config.run_dir

    @property
    def ranks(self) -> int:
        return self.config.job_ranks()

    @property
    def config_file(self) -> Path:
        return self.run_dir / CONFIG_FILE

    def write_config(self) -> Path:
        """``run_dir/config.json``: the configuration the ranks will run with."""
        return write_config(self.config)

    def in_directory(self, run_dir: Path) -> TrainingJob:
        """The same job training in ``run_dir`` (a replacement's staging directory)."""
        if run_dir == self.run_dir:
            return self
        return TrainingJob(self.config.model_copy(update={"run_dir": run_dir}), self.placement)

    def arguments(self) -> list[str]:
        """The ``proxyfl.run`` command-line arguments of this job."""
        return ["--config", str(self.config_file)]

    def command(self, warm: WarmRanks | None = None) -> list[str]:
        """The whole command line: the placement's launcher, then a rank's program (as the
        shim that has ``warm``'s server fork it, when one is given)."""
        if self.placement.launcher == "flare":  # no mpiexec: the sites run the ranks
            return [sys.executable, "-m", "proxyfl.launch.flare", "--ranks", str(self.ranks),
                    *self.arguments()]  # fmt: skip
        program = [sys.executable, "-m", "mpi4py", "-m", "proxyfl.run", *self.arguments()]
        return [
            *self.placement.command_prefix(self.ranks),
            *(warm.program(program) if warm is not None else program),
        ]


class TrainingJobFailed(RuntimeError):
    """The MPI job failed: it exited non-zero, a rank was ended by a signal (128 + the
    signal's number, as a shell says it), or it exited 0 without finishing its run. The
    message names the run, the exit code, the rank that failed first and why, and that
    rank's last lines; where the machine refused a rank (a full disk, a read-only folder:
    exit 3, :data:`~plumbing.refusals.EXIT_REFUSED`), one line that names the path, the
    cause and what to do, and :attr:`exit_status` 3."""

    def __init__(
        self,
        job: TrainingJob,
        exit_code: int,
        failure: RankFailure | None,
        lines: list[str],
        reason: str | None = None,
    ):
        self.job, self.exit_code, self.failure, self.lines = job, exit_code, failure, lines
        self.rank = failure.rank if failure is not None else None
        who = failure.client if failure is not None else "the job"
        if exit_code == EXIT_REFUSED:
            refused = failure.error if failure is not None else "the machine refused a write"
            super().__init__(f"{job.algorithm} seed {job.seed}: {who}: {refused} (full log: "
                             f"{job.run_dir / JOB_LOG})")  # fmt: skip
            return
        why = f" at {failure.phase}: {failure.error}" if failure is not None else ""
        why = f": {reason}" if failure is None and reason else why
        tail = "\n".join(f"  {line}" for line in lines)
        super().__init__(
            f"{job.algorithm} seed {job.seed} failed with exit code {exit_code}; {who} failed"
            f"{why}; its last lines (full log: {job.run_dir / JOB_LOG}):\n{tail}"
        )

    @property
    def exit_status(self) -> int:
        """The command's exit status for this failure: 3 where the machine refused, else 1."""
        return EXIT_REFUSED if self.exit_code == EXIT_REFUSED else 1


class _SignaledRanks:
    """The ranks the launcher reports ended by a signal, in the order it reports them:
    rank -> the signal's description ("Bus error"). MPICH's fork launcher says so in lines
    of its own (and exits 0 all the same), srun in its ``task N: Killed`` lines
    (:func:`~proxyfl.launch.slurm.tasks_ended`), which also say which task exited non-zero
    first (``Exited with exit code N``: then the cause, not the tasks srun then stopped);
    hydra only in its exit code."""

    def __init__(self, launcher: str) -> None:
        self.launcher = launcher
        self.by_rank: dict[int, str] = {}

    @classmethod
    def of(cls, placement: Placement) -> _SignaledRanks | None:
        if placement.fork_launcher() is not None:
            return cls("fork")
        return cls("srun") if placement.launcher == "srun" else None

    def add(self, line: str) -> None:
        if self.launcher == "srun":  # "Killed", "Terminated", "Exited with exit code N"
            for rank, how in tasks_ended(line):
                self.by_rank.setdefault(rank, how)
            return
        match = _RANK_SIGNALED.match(line.strip())
        if match:
            self.by_rank.setdefault(int(match.group(1)), match.group(2).strip())

    def first(self) -> tuple[int, str] | None:
        """The rank a signal ended first: once one has died the launcher stops the others
        (the fork launcher with SIGINT or SIGQUIT, srun's --kill-on-bad-exit with
        SIGTERM), so a rank ended by another signal is the cause."""
        stops = {signal.strsignal(number) for number in _LAUNCHER_STOPS[self.launcher]}
        causes = [(rank, what) for rank, what in self.by_rank.items() if what not in stops]
        ended = causes or list(self.by_rank.items())
        return ended[0] if ended else None


def _signal_failure(run_dir: Path, rank: int, description: str) -> tuple[int, RankFailure]:
    """The exit code a shell would give (128 + the signal's number) and the record of
    rank ``rank`` ended by the signal the launcher described as ``description`` (or, in
    srun's words, ``Exited with exit code N``: N, and that it exited so), the rank named as
    it named itself (its centre, or the clients it hosted: :func:`rank_name`)."""
    exited = _TASK_EXITED.match(description)
    name = rank_name(run_dir, rank)
    if exited is not None:
        code = int(exited.group(1))
        return code, RankFailure(rank=rank, client=name, phase="training",
                                 error=f"exited with code {code}")  # fmt: skip
    number = _SIGNAL_BY_DESCRIPTION.get(description)
    hint = ""
    if number == signal.SIGBUS:
        hint = (" (a full /dev/shm? ranks on one machine talk through shared memory: free "
                "it, or give the container more, docker run --shm-size=1g)")  # fmt: skip
    elif number == signal.SIGKILL:
        hint = " (out of memory? the kernel's OOM killer sends SIGKILL)"
    signal_name = signal.Signals(number).name if number is not None else description
    failure = RankFailure(rank=rank, client=name, phase="training",
                          error=f"ended by signal {signal_name}: {description}{hint}")  # fmt: skip
    return 128 + (number or 0), failure


class _RankTails:
    """The last lines of each rank (a line without a rank prefix, such as a traceback,
    belongs to the rank that spoke last)."""

    def __init__(self, keep: int) -> None:
        self.by_rank: dict[int | None, deque[str]] = defaultdict(lambda: deque(maxlen=keep))
        self._current: int | None = None
        self.refused: RankFailure | None = None  # the first rank that said the machine refused

    def add(self, line: str) -> None:
        if self.refused is None and line.startswith(RANK_REFUSAL_PREFIX):
            client, _, message = line.removeprefix(RANK_REFUSAL_PREFIX).partition(": ")
            rank = re.match(r"rank (\d+)", client)
            self.refused = RankFailure(rank=int(rank.group(1)) if rank else 0, client=client,
                                       phase="training", error=message)  # fmt: skip
        prefix = _RANK_PREFIX.search(line)
        if prefix:
            self._current = int(prefix.group(1))
        self.by_rank[self._current].append(line)

    def lines_of(self, rank: int | None) -> list[str]:
        if rank is None or not self.by_rank.get(rank):
            return [line for lines in self.by_rank.values() for line in lines]
        return list(self.by_rank[rank])


def run_job(
    job: TrainingJob,
    on_line: Callable[[str], None] = logger.info,
    tail_lines: int = 25,
    env: Mapping[str, str] | None = None,
    on_round: Callable[[RoundProgress], None] | None = None,
) -> None:
    """Run ``job`` to completion, passing each output line to ``on_line`` and, after each
    round every client has finished, its :class:`~proxyfl.launch.progress.RoundProgress` to
    ``on_round``.

    Raises :class:`TrainingJobFailed` when the job exits non-zero, a signal ends one of its
    ranks, or it ends without a finished run.json. If the caller is interrupted (Ctrl-C, a
    cancelled flow run), the whole job's process group is terminated, so no rank is left
    running. On one machine, the shared memory that killed ranks left behind is removed:
    earlier jobs' before and after, this job's as soon as it has ended
    (:mod:`proxyfl.launch.shared_memory`).
    """
    before = set()
    if job.placement.single_machine:
        remove_orphaned_segments()
        warn_if_short(job.ranks)
        before = segment_names()
    try:
        _run_job(job, on_line, tail_lines, env, on_round)
    finally:
        if job.placement.single_machine:
            remove_segments_since(before)  # this job's, left by ranks a signal killed
            remove_orphaned_segments()


def _run_job(
    job: TrainingJob,
    on_line: Callable[[str], None],
    tail_lines: int,
    env: Mapping[str, str] | None,
    on_round: Callable[[RoundProgress], None] | None,
) -> None:
    job.write_config()
    clear_failures(job.run_dir)
    process_env = rank_environment(job.placement, env)
    # on one machine the ranks are forked from one interpreter that imported torch once
    warm = (warm_server(_server_environment(process_env), rank_imports(job.placement))
            if job.placement.ranks_fork_warm else contextlib.nullcontext(None))  # fmt: skip
    with warm as forked:
        if forked is not None:
            process_env.update(forked.environment())
        try:
            launched_again_on_unequal_addresses(
                lambda: _launch(job, forked, process_env, on_line, tail_lines, on_round),
                f"{job.algorithm} seed {job.seed}",
            )
        except AddressesOfUnequalLength as failed:
            raise TrainingJobFailed(job, failed.exit_code, None, failed.lines,
                                    reason=str(failed)) from failed  # fmt: skip


def rank_environment(placement: Placement, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a job's ranks start with: this process's, ``env`` over it, and what
    the placement needs (before the launch adds its descriptors and its warm server); CUDA's
    allocator with expandable segments unless the user chose its settings."""
    merged = {**os.environ, **(env or {}), **placement.environment(), "PYTHONUNBUFFERED": "1"}
    if empty := empty_srun_options(merged):  # a batch script's export of an unset variable
        logger.info("%s set but empty: launching as if unset", ", ".join(empty))
        for name in empty:
            del merged[name]
    # before any process of the job imports torch (proxyfl.engine.runtime.configure_torch)
    merged.setdefault("PYTORCH_CUDA_ALLOC_CONF", CUDA_ALLOCATOR_SETTING)
    return merged


def _server_environment(ranks: Mapping[str, str]) -> dict[str, str]:
    """What a warm server starts with, and is matched by: the ranks' environment less
    Prefect's settings. A rank's imports never import Prefect (tested), and a flow command
    sets ``PREFECT_API_URL`` only once its Prefect server is up: a server kept from before
    then still serves its jobs. Each forked rank still gets its whole environment."""
    return {name: value for name, value in ranks.items() if not name.startswith("PREFECT_")}


@contextlib.contextmanager
def warm_ranks(
    placement: Placement, env: Mapping[str, str] | None = None, *, shared: bool = False
) -> Iterator[None]:
    """The ranks of every job run inside the block on this machine (``placement`` with
    ``env``, as :func:`run_job` would be given them) forked from one warm server, started
    now: its imports are done once for all the block's jobs, on another core while the
    caller sets up its first. Nothing where ``placement`` is not this machine.
    ``shared``: the jobs of the commands this process runs in the block too (``dvc
    repro``'s stages: :func:`plumbing.warm.kept_warm_server`)."""
    if not placement.ranks_fork_warm:
        yield
        return
    server_environment = _server_environment(rank_environment(placement, env))
    with kept_warm_server(server_environment, rank_imports(placement), shared=shared):
        yield


def _launch(
    job: TrainingJob,
    warm: WarmRanks | None,
    process_env: dict[str, str],
    on_line: Callable[[str], None],
    tail_lines: int,
    on_round: Callable[[RoundProgress], None] | None,
) -> None:
    # the launcher and every process it starts (its ranks' shims, hydra's ssh clients, in
    # sessions of their own) end with this process, even killed by SIGKILL
    command = tree_bound_command(job.command(warm), STOP_GRACE_S)
    logger.info("launching %s", " ".join(job.command()))
    tails = _RankTails(tail_lines)
    # MPICH's fork launcher and srun say which rank a signal ended (the fork launcher then
    # exits 0 all the same); hydra exits with the signal's number, its words in the tails
    signaled = _SignaledRanks.of(job.placement)
    exchange = AddressExchangeWatch()
    rounds = RoundFollower(job.run_dir / METRICS_FILE, job.config.rounds) if on_round else None
    # one pipe for every line: the launcher's, and the ranks' (which on this machine write
    # to it themselves, around the fork launcher's relay: plumbing.output)
    read_end, write_end = os.pipe()
    if job.placement.single_machine:
        process_env.update(passing_output(write_end, write_end))
    with (
        open(read_end, encoding="utf-8", errors="replace") as output,
        # a full disk's write to the log, or the flush of its last line at close, names no
        # file: this one
        naming(job.run_dir / JOB_LOG),
        # appended, a header per attempt, each line on disk as it comes: an attempt killed
        # outright (kill -9) keeps its lines, and its resume does not erase them
        open(job.run_dir / JOB_LOG, "a", encoding="utf-8", buffering=1) as log_file,
    ):
        log_file.write(attempt_header(job))
        started = time.perf_counter()  # the job's wall, as the launcher sees it
        try:
            process = subprocess.Popen(
                command, stdout=write_end, stderr=subprocess.STDOUT, pass_fds=(write_end,),
                env=process_env, start_new_session=True,
            )  # fmt: skip
        finally:
            os.close(write_end)  # the job's processes hold it: the output ends when they do
        try:
            for raw in output:
                line = raw.rstrip("\n")
                log_file.write(raw)
                tails.add(line)
                if signaled is not None:
                    signaled.add(line)
                exchange.add(line)
                on_line(line)
                if rounds is not None and on_round is not None:  # a round ends in lines
                    for progress in rounds.poll():
                        on_round(progress)
            exit_code = process.wait()
            if interrupted():  # Ctrl-C reached this process: its ranks' exit is no failure,
                raise KeyboardInterrupt  # even where its exception was swallowed
            record_launcher_wall(job.run_dir, time.perf_counter() - started,
                                 warm.origin if warm is not None else None)  # fmt: skip
        except BaseException:
            _terminate(process)
            raise
    if exit_code != 0 and exchange.failed:  # MPI_Init failed before any rank ran
        raise AddressesOfUnequalLength(exit_code, tails.lines_of(None))
    _raise_unless_finished(job, exit_code, signaled, tails)


def attempt_header(job: TrainingJob) -> str:
    """The line ``job.log`` gets before each attempt's output: when, and what ran."""
    when = time.strftime("%Y-%m-%d %H:%M:%S %z")
    return f"=== {when}: {' '.join(job.command())} ===\n"


def _raise_unless_finished(
    job: TrainingJob, exit_code: int, signaled: _SignaledRanks | None, tails: _RankTails
) -> None:
    """:class:`TrainingJobFailed` unless the job exited 0, no signal ended a rank and its
    run.json says finished (the fork launcher exits 0 when a signal ends its ranks: then
    ``signaled`` holds what it reported, as for srun; ``None`` for hydra). Under srun the
    exit code is the first failed task's (128 + its signal, or its own), not srun's (143
    whichever task died: it stops the others with SIGTERM)."""
    recorded = read_failures(job.run_dir)
    first, code = (recorded[0] if recorded else None), exit_code
    if first is None and exit_code == EXIT_REFUSED:  # a full disk kept its record unwritten
        first = tails.refused  # the rank's own line: the cause, not the ranks stopped after
    ended = signaled.first() if signaled is not None else None
    if ended is not None:  # a signal ended a rank: failed, whatever the launcher exited
        signal_code, signal_failure = _signal_failure(job.run_dir, *ended)
        # the fork launcher's own exit code stands when it has one (a rank's Abort(3): the
        # others it then stopped are not the cause); srun's is 143 whichever task died
        # (not a stopped rank's EXIT_STOPPED, which the fork launcher exits with as the
        # greatest of its ranks' statuses: a consequence)
        stood = exit_code not in (0, EXIT_STOPPED)
        code = signal_code if signaled.launcher == "srun" or not stood else exit_code
        first = first or signal_failure  # a rank's own fault record says more, if any
    if code != 0 and not job.placement.single_machine and job.placement.launcher == "mpiexec":
        # hydra's ssh to a host: name it, no retry
        reached = named_hosts(job.placement.hosts, job.placement.hostfile)
        lost = lost_host(tails.lines_of(None), reached)
        if lost is not None:
            raise lost
    if code != 0:
        raise TrainingJobFailed(job, code, first, tails.lines_of(first.rank if first else None))
    state = read_recorded_run(job.run_dir).state
    if state is not RunState.FINISHED:
        raise TrainingJobFailed(
            job, 1, None, tails.lines_of(None),
            reason=f"its launcher exited 0, but {job.run_dir / RUN_FILE} records no "
            "finished run",
        )  # fmt: skip


def launch_planned(
    job: TrainingJob,
    plan: LaunchPlan,
    on_line: Callable[[str], None] = logger.info,
    on_round: Callable[[RoundProgress], None] | None = None,
) -> None:
    """Carry out ``plan`` (:func:`proxyfl.launch.rundir.plan_launch` of ``job``): nothing for a
    kept run; otherwise run the job in ``plan.work`` and, for a replacement, swap the
    finished new run into place. A failed replacement leaves the finished run as it was."""
    if plan.action is Action.KEEP:
        return
    prepare(plan, job.config)
    run_job(job.in_directory(plan.work), on_line=on_line, on_round=on_round)
    if plan.action is Action.REPLACE:
        publish_staged(plan.run_dir)


def _terminate(process: subprocess.Popen[str], grace_seconds: float = STOP_GRACE_S + 5) -> None:
    """Stop every process of the job: its supervisor (:func:`tree_bound_command`) ends
    every process under it, the ranks with them."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_seconds)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
