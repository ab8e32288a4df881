"""Entry point of training, a client per MPI rank, or several::

    mpiexec -n R python -m mpi4py -m proxyfl.run --algorithm ALG --data DIR --run-dir RUN_DIR

Client k is the client of ``--centers``[k] (default 0..R-1) and opens only that centre's
training split; every client evaluates on the merged test splits of the clients' centres
and of ``--eval-centers``. Joint runs as one rank over the pooled training splits of the
listed centres. With more centres than ranks, each rank hosts ⌊C/R⌋ or ⌈C/R⌉ clients and
trains them in turn (:mod:`proxyfl.hosted`); every record is the client's, and the same
bytes whatever R.

Bad input (a missing or malformed store, a centre listed twice, more ranks than centres,
an unknown model or algorithm, a batch larger than a client's data, PrivateKT without its
public store or with more knowledge-transfer items than the pool holds, ...) is reported
before any training: rank 0 prints every rank's message and all ranks exit with status 2.

PrivateKT reads, on every rank, the images (never the labels) of its public pool: a
share ``--public-share`` of every client's training split, which the clients then leave
out of their training (``--public-pool share``, the paper's), or the public centre's store
(``--public-pool center --public-center C``), which must not be a client's centre.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import functools
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from plumbing.atomic import remove_stale_temporaries
from plumbing.cli import ConfigError, Flag, add_model_flags, given, validate
from plumbing.collector import imports_done, pause
from plumbing.exit_early import exit_here, flush_c_streams
from plumbing.output import adopt_passed_output
from plumbing.processes import stoppable_by_launcher
from plumbing.verified import record_digest
from proxyfl.comm.control import gather_json
from proxyfl.config import TrainConfig
from proxyfl.engine.timings import process_age
from proxyfl.engine.validation import (
    EXIT_BAD_INPUT,
    EXIT_STOPPED,
    FatalSignalRecord,
    RankFailure,
    SetupError,
    agree,
    check_or_exit,
    ending_together,
    exit_together,
    record_failure,
    run_phase,
)
from proxyfl.launch.progress import rank_line_format
from proxyfl.rank_inputs import check_resumable, check_stores, check_world, open_client_data
from proxyfl.results import METRICS_FILE, RUN_FILE

if TYPE_CHECKING:  # torch and Opacus load only once the input has been checked
    from proxyfl.trainer import ClientTrainer


logger = logging.getLogger("proxyfl.run")


class _ParserError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of exiting, so all ranks can fail together."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ParserError(message)


def build_parser() -> tuple[argparse.ArgumentParser, list[Flag]]:
    """Every :class:`TrainConfig` field as a flag, and ``--config``."""
    parser = _Parser(
        prog="python -m proxyfl.run",
        description=(
            "Train one client per MPI rank with ProxyFL or a baseline. Launch with "
            "mpiexec -n K python -m mpi4py -m proxyfl.run ..."
        ),
    )
    parser.add_argument(
        "--config", type=Path,
        help="a job's RUN_DIR/config.json, as `python -m flows.train` writes it from a "
        "parameters file; flags override",
    )  # fmt: skip
    return parser, add_model_flags(parser, TrainConfig)


def config_file_values(path: Path) -> dict[str, Any]:
    """A job's ``config.json`` as it is. A parameters file is refused: its ``train:``
    section becomes jobs' configurations in one place only, ``TrainSection.job_config``
    (``python -m flows.train``), which writes each job's ``config.json``."""
    if path.suffix != ".json":
        raise ConfigError(
            path, "not a job configuration: proxyfl.run reads a RUN_DIR/config.json; a "
            "parameters file's train: section is launched by `python -m flows.train --config "
            f"{path}` (which writes one per job)",
        )  # fmt: skip
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as error:
        raise ConfigError(path, f"not a job configuration ({error})") from None


def parse_config(argv: Sequence[str] | None) -> TrainConfig:
    """CLI (and optional ``--config`` file) → validated :class:`TrainConfig`."""
    parser, flags = build_parser()
    try:
        namespace = parser.parse_args(argv)
    except _ParserError as error:
        raise SetupError(str(error)) from None
    values = {flag.key[0]: value for flag, value in given(namespace, flags).items()}
    source = namespace.config or "command line"
    file_values = config_file_values(namespace.config) if namespace.config else {}
    config = validate(TrainConfig, {**file_values, **values}, source, given(namespace, flags))
    config.require_paths()
    return config


def _client_label(config: TrainConfig, comm: Any) -> Any:
    """How a rank of ``comm`` is named in errors: ``rank R (centre C)``, or, where ranks host
    several clients, ``client K (centre C, rank R)``."""
    centers = config.client_centers(comm.Get_size())
    placement = getattr(comm, "placement", None)  # a ClientWorld (proxyfl.comm.clients)

    def label(rank: int) -> str:
        if placement is not None:
            return f"client {rank} (centre {centers[rank]}, rank {placement.rank_of(rank)})"
        if config.algorithm != "Joint" and rank < len(centers):
            return f"rank {rank} (centre {centers[rank]})"
        return f"rank {rank}"

    return label


def _configure_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=rank_line_format(f"rank {rank}"),
        stream=sys.stderr,
        force=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """An MPI rank: this process is the rank, MPI's world its job."""
    adopt_passed_output()  # before any line: around the fork launcher's relay
    stoppable_by_launcher()
    # before MPI_Init registers MPICH's exit handler, after a warm server's imports: the
    # rank's exit runs MPICH's, then ends before torch's destructors (plumbing.exit_early)
    exit_here()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    _configure_logging(comm.Get_rank())
    hosting = _hosting(argv, comm.Get_size())
    if hosting is None:
        return run_rank(comm, argv)
    return host_rank_clients(comm, argv, hosting)


def _hosting(argv: Sequence[str] | None, ranks: int) -> TrainConfig | None:
    """The job's configuration where its ``ranks`` ranks host more clients than one each
    (None: a client per rank, or a configuration that does not validate, which
    :func:`run_rank` reports, every rank's error on rank 0)."""
    try:
        config = parse_config(argv)
    except Exception:  # said by run_rank, with every rank's error
        return None
    if config.ranks is not None and config.ranks != ranks and config.algorithm != "Joint":
        logger.warning("the configuration asks for %d rank(s); this job has %d (its "
                       "launcher's -n decides)", config.ranks, ranks)  # fmt: skip
    if config.algorithm == "Joint" or len(config.client_centers(ranks)) <= ranks:
        return None
    return config


def host_rank_clients(world: Any, argv: Sequence[str] | None, config: TrainConfig) -> int:
    """This rank's clients of ``config``'s job over MPI's ``world`` (:mod:`proxyfl.hosted`):
    each runs :func:`run_rank` as a rank of the clients' world, in turn with the rank's
    others; one fault record for the rank."""
    from proxyfl.comm.clients import ClientPlacement
    from proxyfl.comm.mpi_link import MpiLink
    from proxyfl.hosted import host_clients, node_clients

    rank = world.Get_rank()
    placement = ClientPlacement(len(config.client_centers(world.Get_size())), world.Get_size())
    on_node = node_clients(world, placement)
    mine = placement.clients_of(rank)
    _, run_dir = config.require_paths()
    fatal_signals = FatalSignalRecord(
        run_dir, rank, f"rank {rank} (clients {', '.join(map(str, mine))})"
    )
    link = MpiLink(world)
    try:
        status = host_clients(link, rank, placement, on_node, argv,
                              functools.partial(run_rank, fault_record=False))  # fmt: skip
    except SystemExit:  # the clients' own stop (bad input, the test hook), not a crash
        ending_together()  # what their threads could not do for the rank
        fatal_signals.close()
        raise
    finally:
        link.close()
    fatal_signals.close()
    return status


def run_rank(comm: Any, argv: Sequence[str] | None = None, fault_record: bool = True) -> int:
    """One rank of a job over ``comm``: MPI's world (:func:`main`), or a
    :class:`~proxyfl.comm.world.MessageWorld` whose messages another transport carries
    (:mod:`proxyfl.comm.flare`) or whose ranks are clients that a few ranks host
    (:mod:`proxyfl.hosted`); the same program, and the same bytes, over any of them.
    ``fault_record``: whether this rank keeps the fault record (a rank that hosts several
    clients keeps one for all of them)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    wall_start = time.perf_counter()
    startup = process_age()  # before this clock: the interpreter, imports, MPI's init

    config, error = run_phase(lambda: parse_config(argv))
    check_or_exit(comm, error)
    assert config is not None
    label = _client_label(config, comm)
    _, run_dir = config.require_paths()
    fatal_signals = FatalSignalRecord(run_dir, rank, label(rank)) if fault_record else None

    _, error = run_phase(lambda: check_world(config, size))
    _fail_if_any(comm, error, label, run_dir)
    plan, error = run_phase(lambda: check_stores(config, rank, size))
    _fail_if_any(comm, error, label, run_dir)
    assert plan is not None

    from proxyfl.algorithms.strategies import strategy_for
    from proxyfl.comm.clients import ClientWorld
    from proxyfl.comm.graphs import parse_schedule_spec
    from proxyfl.engine import checkpoint as ckpt
    from proxyfl.engine.runtime import configure_torch, make_runtime
    from proxyfl.loop import StopAfterRound, latest_common_round, run_training
    from proxyfl.records import (
        client_summary,
        rank_machine_record,
        rank_record,
        write_machine_json,
        write_run_json,
        write_trained_models,
    )
    from proxyfl.trainer import ClientTrainer

    imports_done()  # where the rank's __main__ paused the collector: frozen, then on again
    configure_torch(config.deterministic)  # before any CUDA work
    runtime, error = run_phase(lambda: make_runtime(comm, config.device, config.torch_threads))
    _fail_if_any(comm, error, label, run_dir)
    assert runtime is not None
    data, error = run_phase(lambda: open_client_data(config, plan))
    _fail_if_any(comm, error, label, run_dir)
    assert data is not None

    def build() -> ClientTrainer:
        trainer = ClientTrainer(
            config=config,
            runtime=runtime,
            strategy=strategy_for(config.algorithm),
            data=data,
            schedule=parse_schedule_spec(config.graph),
            run_dir=run_dir,
        )
        if isinstance(comm, ClientWorld):
            # off the device while its rank's others compute, from the moment its models
            # exist: the rank's next client builds its own with this one's on the host
            comm.hold_on_device(trainer.device_residency())
        return trainer

    trainer, error = run_phase(build)
    _fail_if_any(comm, error, label, run_dir)
    assert trainer is not None

    def resume() -> int:
        if not config.resume:
            return 0
        # a write cut short (a kill inside torch.save) leaves a temporary, never a checkpoint;
        # nor a record of the rank (ranks/rank_N.json, written each round), which DVC would
        # otherwise keep with the run
        remove_stale_temporaries(ckpt.checkpoint_dir(run_dir, rank))
        remove_stale_temporaries(
            run_dir / "ranks", targets={f"rank_{rank}.json", f"rank_{rank}.machine.json"}
        )
        common = latest_common_round(comm, run_dir, rank)
        if common:
            check_resumable(config, run_dir)
            trainer.load_state_dict(ckpt.load_checkpoint(run_dir, rank, common))
            logger.info("resuming after round %d", common)
        else:
            logger.info("resume: no round that every rank completed in %s, starting from "
                        "round 1", run_dir)  # fmt: skip
        return common

    start_round, error = run_phase(resume)
    _fail_if_any(comm, error, label, run_dir)
    assert start_round is not None

    compile_seconds, error = preflight(trainer)
    _fail_if_any(comm, error, label, run_dir)
    trainer.timings.compile_seconds += compile_seconds or 0.0
    _refuse_without_room(trainer, comm, run_dir, label(rank))

    if not config.resume or start_round == 0:

        def start_afresh() -> None:
            ckpt.clear_checkpoints(run_dir, rank)
            if rank == 0:
                (run_dir / METRICS_FILE).unlink(missing_ok=True)

        _, error = run_phase(start_afresh)  # e.g. a folder where a checkpoint was: named
        _fail_if_any(comm, error, label, run_dir)
    records = gather_json(comm, client_summary(trainer), root=0)
    machines = gather_json(comm, rank_machine_record(trainer), root=0)

    def write_start_records() -> None:
        if rank == 0:
            write_machine_json(config, machines)
            write_run_json(config, size, records, status="running")

    # said in one line as every setup failure; and no rank trains before the records exist
    _, error = run_phase(write_start_records)
    _fail_if_any(comm, error, label, run_dir)
    trainer.timings.setup_seconds += (
        time.perf_counter() - wall_start - trainer.timings.compile_seconds
    )
    trainer.timings.startup_seconds += startup or 0.0

    try:
        run_training(trainer, start_round)
    except StopAfterRound:
        logger.warning("stopping after round %s (test hook)", config.stop_after_round)
        if fatal_signals is not None:  # a stop, not a crash
            fatal_signals.close()
        raise
    except Exception as failure:  # named for the launcher, then -m mpi4py aborts the job
        _record_training_failure(failure, trainer, comm, run_dir, label(rank))
        raise

    try:
        started = time.perf_counter()
        write_trained_models(trainer)  # the models a hospital came for, kept with the run
        if not config.keep_final_checkpoints:
            ckpt.clear_checkpoints(run_dir, rank)
        records = gather_json(comm, rank_record(trainer), root=0)
        trainer.timings.records_seconds += time.perf_counter() - started
        machines = gather_json(comm, rank_machine_record(trainer), root=0)
        wall = gather_json(comm, time.perf_counter() - wall_start, root=0)
        startups = gather_json(comm, startup, root=0)
        if rank == 0:  # run.json "finished" last: it says the run is whole
            write_machine_json(config, machines, wall, startups)
            record_digest(run_dir / METRICS_FILE)  # verified when read (proxyfl.kept)
            write_run_json(config, size, records, status="finished")
            record_digest(run_dir / RUN_FILE)
    except Exception as failure:
        _record_training_failure(failure, trainer, comm, run_dir, label(rank))
        raise
    if fatal_signals is not None:
        fatal_signals.close()
    return 0


def _record_training_failure(
    failure: Exception, trainer: Any, comm: Any, run_dir: Path, client: str
) -> None:
    """Leave ``failure`` for the launcher (:func:`record_failure`). Out of memory and the
    machine's refusals (a full disk, a read-only folder: :func:`machine_refusal`) are said
    in one line and end the job at once with their own exit status (2, 3), not retried;
    any other failure is recorded and raised on (its traceback is a bug's)."""
    from plumbing.refusals import EXIT_REFUSED, machine_refusal
    from proxyfl.engine.memory import is_out_of_memory

    rank = trainer.runtime.rank
    if is_out_of_memory(failure):  # said as the pre-run check says it, and not retried
        message = trainer.out_of_memory_message(failure, "a training round",
                                                trainer.largest_batch)  # fmt: skip
        status = EXIT_BAD_INPUT
    elif (refusal := machine_refusal(failure)) is not None:
        message, status = refusal, EXIT_REFUSED
    else:
        error = f"{type(failure).__name__}: {failure}"
        record_failure(run_dir, RankFailure(rank=rank, client=client, phase="training",
                                            error=error))  # fmt: skip
        return
    _abort(comm, run_dir, RankFailure(rank=rank, client=client, phase="training",
                                      error=message), status)  # fmt: skip


# the status this rank is aborting the job with, once it is (a hosted client's thread may
# abort while the main thread runs): the launcher's SIGINT that the abort brings then ends
# the rank with that status, without a second line (stopped)
_ABORTING: list[int] = []


def _abort(comm: Any, run_dir: Path, failure: RankFailure, status: int) -> NoReturn:
    """Record ``failure``, say it in one line and end the job with ``status``."""
    _ABORTING.append(status)
    record_failure(run_dir, failure)
    # the launcher reads this line where the record could not be written (a full disk)
    print(f"proxyfl.run: error: {failure.client}: {failure.error}", file=sys.stderr,
          flush=True)  # fmt: skip
    # the launcher stops every rank once one aborts (SIGINT, then SIGQUIT), this one too
    # while it aborts: no traceback of an interrupted abort, no core file
    if threading.current_thread() is threading.main_thread():  # a hosted client's is not
        for number in (signal.SIGINT, signal.SIGQUIT):
            signal.signal(number, signal.SIG_IGN)
    comm.Abort(status)
    # MPI_Abort returns where the launcher is already ending the job (another rank aborted
    # first): this rank ends all the same, with its status, not with a bug's traceback
    sys.stderr.flush()
    os._exit(status)


def _refuse_without_room(trainer: Any, comm: Any, run_dir: Path, client: str) -> None:
    """End the job with exit 3 before round 1 where the filesystem of ``run_dir`` lacks
    the room its checkpoints and kept models will take (every rank's
    :func:`~proxyfl.engine.checkpoint.rank_bytes_needed`, summed by rank 0, which checks
    its own filesystem: ranks of other hosts writing elsewhere are counted all the same):
    the machine's refusal said before hours of training, not at the end of the first
    round."""
    from plumbing.refusals import EXIT_REFUSED
    from proxyfl.engine import checkpoint as ckpt

    rank = trainer.runtime.rank
    needed = ckpt.rank_bytes_needed(trainer.checkpointed_model_bytes,
                                    trainer.config.keep_checkpoints,
                                    ckpt.checkpoints_on_disk(run_dir, rank))  # fmt: skip
    needs = gather_json(comm, needed, root=0)
    if rank == 0 and (free := shutil.disk_usage(run_dir).free) < sum(needs):
        message = (f"{run_dir}: the run needs about {sum(needs):,} bytes for the checkpoints "
                   f"and models of its {len(needs)} rank(s) but only {free:,} are free on "
                   "its filesystem: free space there, or set train.runs to a folder with "
                   "room")  # fmt: skip
        _abort(comm, run_dir, RankFailure(rank=rank, client=client, phase="setup",
                                          error=message), EXIT_REFUSED)  # fmt: skip
    comm.Barrier()  # no rank trains before rank 0 found the room


def preflight(trainer: Any) -> tuple[float | None, str | None]:
    """Every rank's :meth:`~proxyfl.trainer.ClientTrainer.preflight` (a step at its largest
    plausible batch, an evaluation batch): ``(compile seconds, error)``. Where a rank
    compiles graphs its cache has not served before, rank 0 compiles first and the others
    then find its kernels in the run's compile cache, instead of four ranks compiling the
    same graphs at once; where every rank's cache serves it, they all start at once."""
    from proxyfl.comm.control import allgather_json

    comm = trainer.runtime.comm
    compiling = allgather_json(comm, [trainer.compiled, trainer.graphs_cached])
    serial = any(compiled and not served for compiled, served in compiling)
    if serial and trainer.runtime.rank != 0:
        comm.Barrier()
    result = run_phase(trainer.preflight)
    if serial and trainer.runtime.rank == 0:
        comm.Barrier()
    return result


def _fail_if_any(comm: Any, error: str | None, label: Any, run_dir: Path) -> None:
    """Every rank exits (status 2) if any failed; each failed rank leaves its record."""
    if error is not None:
        rank = comm.Get_rank()
        record_failure(run_dir, RankFailure(rank=rank, client=label(rank), phase="setup",
                                            error=error))  # fmt: skip
    messages = agree(comm, error, label)
    if messages:
        exit_together(comm, messages)


def leave(status: int) -> NoReturn:
    """End this rank with ``status`` once its run is written, without the interpreter's
    teardown.

    The teardown frees torch's, Opacus' and Triton's objects one by one: 0.8 s of CPU a
    rank (four ranks on two cores: ~2 s of every job), and in a rank forked warm it
    copies, page by page, the memory it shares with its server. Left frozen out of the
    collector instead, the same objects made nanobind (Triton's bindings) print ~100 lines
    of "leaked" types and functions per rank. So the rank ends as a C program does: the
    interpreter's exit handlers (logging's flush, coverage's save), MPI finalised, Python's
    and C's standard streams flushed, then the C library's ``exit`` (whose handlers include
    MPICH's: it tells the launcher the rank finalised) with the GIL held, should one of
    those handlers call back into Python. In a rank forked warm, that ``exit`` ends after
    MPICH's handler, before the destructors of the libraries the server had loaded
    (:func:`~plumbing.exit_early.exit_here`, in :func:`main`)."""
    from mpi4py import MPI

    atexit._run_exitfuncs()  # what the interpreter's own exit would run first
    if not MPI.Is_finalized():
        MPI.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    flush_c_streams()  # exit_here's _exit would leave them unflushed
    ctypes.PyDLL(None).exit(status)
    raise AssertionError("exit returned")  # pragma: no cover


def stopped() -> NoReturn:
    """End a rank its launcher stopped with SIGINT (another rank failed and the launcher
    ends the job, or Ctrl-C) with :data:`EXIT_STOPPED`, in one line instead of the
    traceback of whatever frame the signal interrupted: what stopped the job is said by the
    rank that failed, or by the launcher.

    It exits, never MPI_Abort: given an abort, MPICH's fork launcher exits with the abort's
    code at once and never prints which rank a signal ended, so a rank the OOM killer
    SIGKILLed (the one its peers are stopped for) was reported as the stopped rank's 130.
    Exiting, the launcher reaps every rank and names the signal (proxyfl.launch.job).

    A rank aborting the job itself (a hosted client's thread in :func:`_abort`, whose line
    says why) ends with its abort's status and says nothing more."""
    if _ABORTING:
        sys.stderr.flush()
        os._exit(_ABORTING[0])
    from mpi4py import MPI

    print(f"proxyfl.run: rank {MPI.COMM_WORLD.Get_rank()} stopped (SIGINT)", file=sys.stderr,
          flush=True)  # fmt: skip
    os._exit(EXIT_STOPPED)  # no MPI_Finalize: its peers are being stopped, or are dead


if __name__ == "__main__":
    # the collector off until run_rank has imported torch, then torch's objects frozen
    # (plumbing.collector): a rank ends by leave(), whose exit never collects them
    pause()
    try:
        status = main()
    except KeyboardInterrupt:
        stopped()
    leave(status)
