"""The job launcher under real mpiexec: lines are streamed, a failed rank is named."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import psutil
import pytest

from proxyfl.config import TrainConfig
from proxyfl.engine.runtime import threads_by_placement, usable_cores
from proxyfl.engine.trained import ModelCard, load_trained, predict_tumor, read_card
from proxyfl.engine.validation import read_failures
from proxyfl.kept import trained_path
from proxyfl.launch.job import (
    JOB_LOG,
    TrainingJob,
    TrainingJobFailed,
    _raise_unless_finished,
    _RankTails,
    _SignaledRanks,
    run_job,
    warm_ranks,
)
from proxyfl.launch.placement import Placement
from proxyfl.launch.shared_memory import (
    RANK_SEGMENT_BYTES,
    SEGMENT_NAME,
    SHM_DIR,
    mapped_paths,
    orphaned_segments,
    remove_orphaned_segments,
    remove_segments_since,
    segment_names,
    warn_if_short,
)
from proxyfl.results import predictions_path, read_predictions
from tests.conftest import command_line
from wsi.store.reader import PatchSplitReader
from wsi.store.schema import store_path

REPO = Path(__file__).resolve().parents[2]

OPTIONS = {
    "rounds": 1, "batch_size": 8, "proxy_model": "cnn1", "private_model": "mlp",
    "device": "cpu", "sigma": 1.0, "clip": 1.0, "lr": 1e-2,
}  # fmt: skip
# pytest sets PYTEST_CURRENT_TEST anew for each phase of each test, and a kept warm server
# serves only the environment it was started with: pinned for the jobs of _run_job, so that
# they all match this module's server (one_warm_server)
SHARED_SERVER_ENV = {"PYTEST_CURRENT_TEST": "tests/proxyfl/test_launch_mpi.py"}


@pytest.fixture(scope="module", autouse=True)
def one_warm_server() -> Iterator[None]:
    """One kept warm server for the module's jobs run by :func:`_run_job`, as a flow's jobs
    share one (:func:`~proxyfl.launch.job.warm_ranks`), instead of each importing torch in a
    server of its own (~2 s of CPU a job). The tests of what a job's own server does
    (started for it, for a block, inheriting ignored signals) call ``run_job`` itself."""
    with warm_ranks(Placement(), env=SHARED_SERVER_ENV):
        yield


def _run_job(
    job: TrainingJob, on_line: Callable[[str], None], env: dict[str, str] | None = None
) -> None:
    """``run_job``, its ranks forked from this module's server where the job's placement
    and ``env`` leave the ranks' environment that server's."""
    run_job(job, on_line=on_line, env={**SHARED_SERVER_ENV, **(env or {})})


def _job(
    data: Path,
    out: Path,
    algorithm: str = "ProxyFL",
    centers: tuple[int, ...] = (0, 1),
    placement: Placement | None = None,
    rounds: int = 1,
) -> TrainingJob:
    config = TrainConfig(
        algorithm=algorithm, seed=0, data=data, run_dir=out, centers=list(centers),
        **{**OPTIONS, "rounds": rounds},
    )  # fmt: skip
    return TrainingJob(config, placement or Placement())


def _rank_records(job: TrainingJob) -> list[dict[str, Any]]:
    return json.loads((job.run_dir / "machine.json").read_text())["ranks"]


def _threads(ranks: int) -> int:
    """What each of ``ranks`` ranks on this machine runs: the cores over the ranks."""
    return threads_by_placement(ranks, *usable_cores())


def test_a_job_streams_every_rank_and_writes_its_log(stores: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    job = _job(stores, tmp_path / "run")
    _run_job(job, on_line=lines.append)
    assert any("[rank 0]" in line and "round 1/1" in line for line in lines)
    assert any("[rank 1]" in line and "round 1/1" in line for line in lines)
    header, *logged = (job.run_dir / JOB_LOG).read_text().splitlines()
    assert header.startswith("=== ") and "proxyfl.run --config" in header
    assert logged == lines
    assert json.loads((job.run_dir / "run.json").read_text())["status"] == "finished"
    # ranks end without the interpreter's teardown (proxyfl.run.leave), where nanobind
    # would list Triton's objects as "leaked", a hundred lines a rank
    assert not [line for line in lines if "nanobind" in line or "leaked" in line]
    assert not (job.run_dir / "checkpoints").exists()  # a finished run keeps no checkpoints
    # its ranks forked from this module's kept server (one_warm_server)
    launcher = json.loads((job.run_dir / "machine.json").read_text())["timings"]["launcher"]
    cold = os.environ.get("PLUMBING_COLD_RANKS") == "1"
    assert launcher["warm_server"] == (None if cold else "kept")
    # the fork launcher sets no MPI_LOCALNRANKS: each rank still takes its share of cores,
    # in deterministic mode without its fill, and compiles nothing here (a CPU, auto)
    for rank in _rank_records(job):
        assert rank["torch_threads"] == _threads(2)
        assert rank["fill_uninitialized_memory"] is False and rank["deterministic"]
        assert rank["compiled"] is False and rank["recompiles"] == 0
        assert 0 <= rank["timings"]["data_wait_seconds"] < rank["timings"]["train_seconds"]


def test_the_jobs_of_a_block_fork_their_ranks_from_one_kept_server(
    stores: Path, tmp_path: Path
) -> None:
    """warm_ranks starts one warm server before the first job; every job's ranks inside the
    block are its children (no server of their own), and it is gone after the block."""

    def servers() -> list[psutil.Process]:
        return [p for p in psutil.Process().children()
                if p.pid not in others and "plumbing.warm" in command_line(p)]  # fmt: skip

    others: set[int] = set()
    others.update(p.pid for p in servers())  # kept for other tests' jobs (run_mpi's, this
    # module's: one_warm_server)

    with warm_ranks(Placement()):
        (kept,) = servers()
        for name in ("first", "second"):
            forked: list[set[int]] = []
            job = _job(stores, tmp_path / name, rounds=2)
            run_job(job, on_line=lambda _: None,
                    on_round=lambda _, seen=forked: seen.append(
                        {p.pid for p in kept.children()}))  # fmt: skip
            assert forked and len(forked[0]) == 2, forked  # both ranks, mid-run
            assert servers() == [kept]
            ranks = json.loads((job.run_dir / "machine.json").read_text())["ranks"]
            assert {rank["pid"] for rank in ranks} == forked[0]
    assert not kept.is_running() or kept.status() == psutil.STATUS_ZOMBIE


# a command that took a Ctrl-C whose KeyboardInterrupt a bare `except:` swallowed (as a
# library's may: no hook sees it, unlike one Python drops: tests/test_processes.py), then
# runs a job to its end
AFTER_A_SWALLOWED_INTERRUPT = """
import os, signal, sys
from pathlib import Path
from plumbing.processes import interruptible
from proxyfl.config import TrainConfig
from proxyfl.launch.job import TrainingJob, run_job
interruptible()
try:
    os.kill(os.getpid(), signal.SIGINT)
    sum(range(3))  # the handler runs between these bytecodes
except BaseException:
    print("swallowed")
config = TrainConfig.model_validate_json(Path(sys.argv[1]).read_text())
try:
    run_job(TrainingJob(config), on_line=lambda _: None)
except KeyboardInterrupt:
    sys.exit("stopped at the job's end")
print("went on")
"""


def test_a_job_ended_after_a_swallowed_interrupt_stops_the_command(
    stores: Path, tmp_path: Path
) -> None:
    """The interrupt is recorded as it comes, and the job's end raises it: a training
    command whose KeyboardInterrupt was lost on the way otherwise took its ranks' exit 130
    (they had the Ctrl-C too) for a failure, retried the job and trained on."""
    config = tmp_path / "config.json"
    config.write_text(_job(stores, tmp_path / "run", algorithm="Joint").config.model_dump_json())
    done = subprocess.run([sys.executable, "-c", AFTER_A_SWALLOWED_INTERRUPT, str(config)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.stdout.startswith("swallowed"), done.stdout  # the KeyboardInterrupt was lost
    assert done.returncode == 1 and "stopped at the job's end" in done.stderr, done.stderr[-3000:]
    assert "went on" not in done.stdout


LEAVING_RANK = """\
import atexit, ctypes, os, sys, time
from pathlib import Path
from plumbing.exit_early import exit_here
exit_here()  # as proxyfl.run.main does, before MPI_Init
from mpi4py import MPI
from proxyfl import run
rank = MPI.COMM_WORLD.Get_rank()
folder = Path(sys.argv[1])
atexit.register(lambda: (folder / f"exit_handler_{rank}").write_text("ran"))
# stdout is a pipe: C's stdio holds this line in its buffer until something flushes it
ctypes.CDLL(None).printf(b"rank %d pid %d: said in C\\n", ctypes.c_int(rank),
                         ctypes.c_int(os.getpid()))
MPI.COMM_WORLD.Barrier()
if rank == 0:  # rank 1 ends first: the launcher must know it finalised, or it stops rank 0
    MPI.Finalize()
    time.sleep(1)
run.leave(3 if rank == 1 else 0)
"""


def test_a_rank_leaves_with_its_status_its_exit_handlers_run_and_what_c_printed(
    helpers: Any, tmp_path: Path
) -> None:
    """proxyfl.run.leave ends a rank before the destructors of what it had loaded
    (plumbing.exit_early; libtorch's: ~0.3 s of CPU a rank), after MPICH's exit handler:
    the launcher takes the rank's status and knows it finalised (the rank that ends first
    does not stop the other), the interpreter's exit handlers (coverage's save among them)
    run, a line C's stdio buffered is printed, and libfabric leaves no region of a rank's
    in /dev/shm."""
    script = tmp_path / "leaving_rank.py"
    script.write_text(LEAVING_RANK)
    done = helpers.run_mpi(2, [tmp_path], script=script, timeout=120)
    assert done.returncode == 3, helpers.explain(done)
    said = re.findall(r"rank (\d) pid (\d+): said in C", done.stdout)
    assert sorted(rank for rank, _ in said) == ["0", "1"], helpers.explain(done)
    assert sorted(path.name for path in tmp_path.glob("exit_handler_*")) == [
        "exit_handler_0", "exit_handler_1"], helpers.explain(done)  # fmt: skip
    pids = {pid for _, pid in said}
    assert not [name for name in segment_names(SHM_DIR) if name.split(":")[0] in pids]


def test_joint_runs_as_one_rank(stores: Path, tmp_path: Path) -> None:
    job = _job(stores, tmp_path / "joint", algorithm="Joint")
    assert job.command()[1:3] == ["-n", "1"] and job.ranks == 1
    _run_job(job, on_line=lambda _: None)
    assert json.loads((job.run_dir / "run.json").read_text())["world_size"] == 1
    (rank,) = _rank_records(job)
    assert rank["torch_threads"] == _threads(1)  # every core of this machine (2 on CI's)
    # train.options.torch_threads overrides the placement
    job = _job(stores, tmp_path / "one_thread", algorithm="Joint")
    job = TrainingJob(job.config.model_copy(update={"torch_threads": 1}), job.placement)
    _run_job(job, on_line=lambda _: None)
    assert [rank["torch_threads"] for rank in _rank_records(job)] == [1]


def _corrupt_training_images(store: Path) -> None:
    """Rewrite the train images gzip-compressed, then garble one chunk's bytes: the store
    opens and validates, but decoding that patch fails in the rank that trains on it."""
    with h5py.File(store, "a") as h5:
        images = h5["train"]["images"][()]
        del h5["train"]["images"]
        h5["train"].create_dataset(
            "images", data=images, chunks=(1, *images.shape[1:]), compression="gzip"
        )
    with h5py.File(store, "r") as h5:
        chunk = h5["train"]["images"].id.get_chunk_info(0)
    with open(store, "r+b") as handle:
        handle.seek(chunk.byte_offset)
        handle.write(np.full(chunk.size, 0xFF, dtype=np.uint8).tobytes())


def test_a_failed_rank_is_named_with_its_last_lines(helpers: Any, tmp_path: Path) -> None:
    data = helpers.write_stores(tmp_path / "stores", centers=(0, 1))
    _corrupt_training_images(store_path(data, 1))
    job = _job(data, tmp_path / "run")
    with pytest.raises(TrainingJobFailed) as failure:
        _run_job(job, on_line=lambda _: None)
    error = failure.value
    assert error.exit_code != 0
    # named from the record the rank left, not from what the log says (patches load at setup)
    assert error.rank == 1 and error.failure is not None and error.failure.phase == "setup"
    assert [f.rank for f in read_failures(job.run_dir)] == [1]
    message = str(error)
    assert "ProxyFL seed 0 failed with exit code" in message and "rank 1" in message
    assert "rank 1 (centre 1)" in message and "read data" in message  # HDF5's own reason
    assert str(job.run_dir / JOB_LOG) in message


class _JobSockets:
    """The listening sockets of the job's processes (the launcher, its helpers and the
    ranks: what ``ss -ltnp`` shows of the job), sampled each time a rank speaks (a rank
    logs only after ``MPI_Init``, which opens its listeners) and, within :meth:`sampling`,
    all along: a rank of a one-round job speaks once, as it ends, and under load its line
    was read once the rank had gone (the stress's launcher group, 1 run in 11)."""

    def __init__(self) -> None:
        self.rank_pids: set[int] = set()
        self.listening: set[tuple[str, str, int]] = set()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def sampling(self, every_s: float = 0.02) -> Iterator[None]:
        """:meth:`sample_now` every ``every_s`` from a thread while the block runs."""
        stop = threading.Event()

        def sample_until_stopped() -> None:
            while not stop.is_set():
                self.sample_now()
                stop.wait(every_s)

        thread = threading.Thread(target=sample_until_stopped, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    @staticmethod
    def _job_processes() -> list[psutil.Process]:
        """mpiexec and its children (the ranks, or their warm shims), and the warm server
        and its children (the ranks it forked: plumbing.warm)."""
        found = []
        for process in psutil.Process().children(recursive=True):
            try:
                command = process.cmdline()
                if Path(command[0]).name.startswith("mpiexec") or "plumbing.warm" in command:
                    found += [process, *process.children(recursive=True)]
            except (psutil.NoSuchProcess, IndexError):
                continue
        return found

    def sample(self, line: str) -> None:
        if "[rank " in line:
            self.sample_now()

    def sample_now(self) -> None:
        for process in self._job_processes():
            try:
                rank = "PMI_RANK" in process.environ()  # a rank (or its shim), not mpiexec
                listening = {
                    (process.name(), connection.laddr.ip, connection.laddr.port)
                    for connection in process.net_connections(kind="inet")
                    if connection.status in (psutil.CONN_LISTEN, psutil.CONN_NONE)
                }
            except psutil.NoSuchProcess:
                continue
            with self._lock:
                if rank:
                    self.rank_pids.add(process.pid)
                self.listening |= listening


def test_a_job_on_this_machine_listens_on_no_network(helpers: Any, tmp_path: Path) -> None:
    """Four ranks on one machine: neither the launcher nor a rank listens on any socket,
    not even loopback (hydra's control port would be on 0.0.0.0, every rank's on the
    external interface: the next test)."""
    data = helpers.write_stores(tmp_path / "stores", centers=(0, 1, 2, 3))
    job = _job(data, tmp_path / "run", centers=(0, 1, 2, 3))
    sockets = _JobSockets()
    with sockets.sampling():
        _run_job(job, on_line=sockets.sample)
    assert len(sockets.rank_pids) == 4, "sampled while every rank was running"
    assert sockets.listening == set()
    assert json.loads((job.run_dir / "run.json").read_text())["status"] == "finished"


def test_a_job_across_named_hosts_is_launched_by_hydra(helpers: Any, tmp_path: Path) -> None:
    """``train.hosts``: hydra's mpiexec starts the ranks (here on this machine, by name),
    and they train; its control port listens beyond loopback, as a multi-host job must."""
    data = helpers.write_stores(tmp_path / "stores", centers=(0, 1))
    job = _job(data, tmp_path / "run", placement=Placement(hosts=("localhost",)))
    assert job.command()[1:3] == ["-hosts", "localhost"]
    sockets = _JobSockets()
    with sockets.sampling():
        run_job(job, on_line=sockets.sample)
    assert json.loads((job.run_dir / "run.json").read_text())["status"] == "finished"
    beyond_loopback = {ip for _, ip, _ in sockets.listening} - {"127.0.0.1", "::1"}
    assert beyond_loopback, sockets.listening
    # hydra sets MPI_LOCALNRANKS (torch alone would then take one thread): the same rule
    assert [rank["torch_threads"] for rank in _rank_records(job)] == [_threads(2)] * 2


def test_a_rank_killed_under_hydra_fails_the_job_by_its_exit_code(
    helpers: Any, tmp_path: Path
) -> None:
    """Hydra (and srun) report a rank a signal ended in words of their own and exit
    non-zero: the job fails on that exit code, with hydra's words among its last lines,
    and nothing of the fork launcher's format is looked for."""
    data = helpers.write_stores(tmp_path / "stores", centers=(0, 1))
    job = _job(data, tmp_path / "run", rounds=5, placement=Placement(hosts=("localhost",)))
    killed: list[int] = []

    def kill_rank_1(line: str) -> None:
        if not killed and "[rank 1]" in line and (rank_1 := _rank_process(1)) is not None:
            rank_1.kill()
            killed.append(rank_1.pid)

    with pytest.raises(TrainingJobFailed) as failure:
        run_job(job, on_line=kill_rank_1)
    assert killed, "rank 1 was running when it was killed"
    error = failure.value
    assert error.exit_code != 0 and error.failure is None, str(error)
    assert "signal 9" in str(error)  # hydra's own line: "... EXIT STRING: Killed (signal 9)"
    assert json.loads((job.run_dir / "run.json").read_text())["status"] != "finished"


def _rank_process(rank: int) -> psutil.Process | None:
    """Rank ``rank`` of the job this test launched, once it runs: the process mpiexec
    started for it (with PMI_RANK in its environment), which is the rank itself or its
    warm shim (plumbing.warm_shim), which passes signals on to the rank."""
    for process in _JobSockets._job_processes():
        try:
            if process.environ().get("PMI_RANK") == str(rank):
                return process
        except psutil.NoSuchProcess:
            continue
    return None


def _forked_rank(started: psutil.Process) -> psutil.Process:
    """The process that runs the rank mpiexec started as ``started``: itself, or, when
    ``started`` is a warm shim, the server's child holding the same PMI socket at the same
    descriptor (plumbing.warm places every descriptor at its number in the shim)."""
    if not any("warm_shim" in part for part in command_line(started)):
        return started
    descriptor = started.environ()["PMI_FD"]
    socket_of = Path(f"/proc/{started.pid}/fd/{descriptor}").readlink()
    for process in _JobSockets._job_processes():
        with contextlib.suppress(OSError, psutil.NoSuchProcess):
            if (process.pid != started.pid
                    and Path(f"/proc/{process.pid}/fd/{descriptor}").readlink() == socket_of
                    and process.parent() is not None
                    and "plumbing.warm" in process.parent().cmdline()):  # fmt: skip
                return process
    raise AssertionError(f"no rank forked for shim {started.pid}")


def _all_segments() -> set[str]:
    """The MPI shared-memory segments in /dev/shm now."""
    if not SHM_DIR.is_dir():
        return set()
    return {entry.name for entry in SHM_DIR.iterdir() if SEGMENT_NAME.fullmatch(entry.name)}


@pytest.mark.timeout(300)  # a rank deaf to the launcher's stop would spin for ever
@pytest.mark.parametrize("stops", ["default", "inherited ignored"])
def test_a_rank_ended_by_a_fatal_signal_is_named_with_the_signal(
    helpers: Any, tmp_path: Path, stops: str
) -> None:
    """A rank that dies of SIGBUS (what a full /dev/shm gives) runs no Python to say so:
    its fault record names it, though the launcher stops the others and they die too, also
    when the job is started with SIGINT and SIGQUIT ignored (a background job of a script,
    which mpiexec, the warm server and the ranks inherit): the launcher's SIGQUIT would
    otherwise leave the other rank busy-waiting on its dead peer."""
    data = helpers.write_stores(tmp_path / "stores", centers=(0, 1))
    job = _job(data, tmp_path / "run", rounds=5)  # signalled after round 1: mid-run
    signalled: list[int] = []

    def bus_error_rank_1(line: str) -> None:
        if not signalled and "[rank 1]" in line and (rank_1 := _rank_process(1)) is not None:
            rank_1.send_signal(signal.SIGBUS)
            signalled.append(rank_1.pid)

    with contextlib.ExitStack() as inherited:
        if stops != "default":
            for number in (signal.SIGINT, signal.SIGQUIT):
                inherited.callback(signal.signal, number, signal.signal(number, signal.SIG_IGN))
        with pytest.raises(TrainingJobFailed) as failure:
            run_job(job, on_line=bus_error_rank_1)
    assert signalled, "rank 1 was running when it was signalled"
    error = failure.value
    assert error.exit_code != 0 and error.rank == 1, str(error)
    assert error.failure is not None and "Bus error" in error.failure.error
    assert "rank 1 (centre 1)" in str(error)
    assert json.loads((job.run_dir / "run.json").read_text())["status"] != "finished"


@pytest.mark.parametrize("killed_ranks", [(1,), (0, 1)], ids=["one", "every"])
def test_ranks_killed_fail_the_job_naming_sigkill(
    helpers: Any, tmp_path: Path, killed_ranks: tuple[int, ...]
) -> None:
    """The OOM killer SIGKILLs the largest process, the rank itself (not a warm rank's shim):
    the launch fails naming SIGKILL and a killed rank, whether the launcher stopped the
    other rank first (it then exits 130 and says nothing of the killed one if the stopped
    rank aborts: it exits instead) or the other was killed too (the fork launcher then
    exits 0). The shared memory the killed ranks could not release is removed once no
    process maps it."""
    data = helpers.write_stores(tmp_path / "stores", centers=(0, 1))
    job = _job(data, tmp_path / "run", rounds=5)  # killed after round 1: mid-run
    killed: list[int] = []
    segments: set[str] = set()  # what the ranks mapped in /dev/shm when they were killed

    def kill_ranks(line: str) -> None:
        if not killed and "[rank " in line:
            started = [_rank_process(rank) for rank in (0, 1)]
            ranks = [_forked_rank(process) for process in started if process is not None]
            segments.update(mapped_paths(SHM_DIR, ranks))
            for rank in killed_ranks:
                ranks[rank].kill()
                killed.append(rank)

    with pytest.raises(TrainingJobFailed) as failure:
        _run_job(job, on_line=kill_ranks)
    assert killed == list(killed_ranks), "the ranks were running when they were killed"
    error = failure.value
    assert error.exit_code == 128 + signal.SIGKILL and error.rank in killed_ranks, str(error)
    assert "SIGKILL" in str(error) and f"rank {error.rank}" in str(error)
    # removed by the launcher once the job ended (they are this job's), not 10 s later
    assert segments and not {Path(path).name for path in segments} & _all_segments()


def test_segments_mapped_by_a_living_process_are_kept(tmp_path: Path) -> None:
    """Only segments no process maps are removed: a job running beside keeps its own."""
    mapped, orphaned, other = tmp_path / "mpich_shm_0abc_0", tmp_path / "4242:0:0", tmp_path / "x"
    for path in (mapped, orphaned, other):
        path.write_bytes(b"\0" * mmap.PAGESIZE)
    with open(mapped, "r+b") as handle, mmap.mmap(handle.fileno(), 0):
        assert orphaned_segments(tmp_path, grace_seconds=0) == [orphaned]
        assert orphaned_segments(tmp_path, grace_seconds=3600) == []  # too young yet
        cleared = remove_orphaned_segments(tmp_path, grace_seconds=0)
    assert cleared.segments == 1 and not orphaned.exists()
    assert mapped.exists() and other.exists()  # not an MPI segment's name


def test_a_jobs_own_unmapped_segments_are_removed_at_once_and_no_others(
    tmp_path: Path,
) -> None:
    """What the launcher removes once its job has ended: segments made since it started
    that no process maps (its killed ranks'), however young; not one that was there before
    (another job's, left to the grace period), nor one a process maps (a job beside)."""
    earlier = tmp_path / "mpich_shm_0aaa_0"
    earlier.write_bytes(b"\0" * mmap.PAGESIZE)
    before = segment_names(tmp_path)
    ours, beside = tmp_path / "4242:0:0", tmp_path / "mpich_shm_0bbb_0"
    for path in (ours, beside):
        path.write_bytes(b"\0" * mmap.PAGESIZE)
    with open(beside, "r+b") as handle, mmap.mmap(handle.fileno(), 0):
        cleared = remove_segments_since(before, tmp_path, settle_seconds=0.05)
    assert cleared.segments == 1 and not ours.exists()
    assert earlier.exists() and beside.exists()
    assert remove_segments_since(segment_names(tmp_path), tmp_path).segments == 0  # no wait


def test_too_little_shared_memory_for_the_ranks_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    free = shutil.disk_usage(tmp_path).free
    assert not warn_if_short(1, tmp_path) or free < RANK_SEGMENT_BYTES
    ranks = free // RANK_SEGMENT_BYTES + 1  # one more than the room there
    assert warn_if_short(int(ranks), tmp_path)
    assert "SIGBUS" in caplog.text and "--shm-size" in caplog.text


# what an older CPU runs: torch's kernels without vector extensions, oneDNN's at SSE4.1
OLDER_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}


def test_the_same_job_writes_the_same_run_anywhere(
    stores: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, helpers: Any
) -> None:
    """The reproducibility promise (docs/reproducibility.md). One job launched from two
    directories (other paths, other times, other processes) with the same kernels: every
    file DVC hashes is the same bytes, so a run's dvc.lock entry is the same on any
    machine with these kernels; where and how long it ran is in the files .dvcignore
    leaves out. The kernels are recorded with each client: the same job with an older
    CPU's kernels says so, and its numbers are another draw, not promised equal."""
    hashed = []
    for place, env in (("here", {}), ("there", {}), ("older", OLDER_KERNELS)):
        (tmp_path / place).mkdir()
        shutil.copytree(stores, tmp_path / place / "stores")
        monkeypatch.chdir(tmp_path / place)  # relative paths, as params.yaml gives them
        _run_job(_job(Path("stores"), Path("runs/ProxyFL/seed_0"), rounds=2),
                 on_line=lambda _: None, env=env)  # fmt: skip
        hashed.append(helpers.dvc_hashed_files(tmp_path / place / "runs" / "ProxyFL" / "seed_0"))
    kernels = [{client["kernels"] for client in json.loads(files["run.json"])["clients"]}
               for files in hashed]  # fmt: skip
    # the threads split a reduction's sums: they are part of the kernels
    threads = _threads(2)
    count = f"{threads} thread{'s' if threads > 1 else ''}"
    assert kernels[0] == kernels[1] and len(kernels[0]) == 1
    assert next(iter(kernels[0])).endswith(f", onednn native, {count}")
    assert kernels[2] == {f"cpu DEFAULT, onednn SSE41, {count}"}
    hashed = hashed[:2]
    records = {"run.json", "metrics.jsonl", "ranks/rank_0.json", "run.json.sha256",
               "metrics.jsonl.sha256", "predictions/client_0.csv.sha256"}  # fmt: skip
    assert records <= set(hashed[0])
    assert not {"job.log", "machine.json", "ranks/rank_0.machine.json"} & set(hashed[0])
    assert hashed[0].keys() == hashed[1].keys()
    differing = [name for name in hashed[0] if hashed[0][name] != hashed[1][name]]
    assert not differing, differing
    machine = json.loads((tmp_path / "here" / "runs/ProxyFL/seed_0/machine.json").read_text())
    assert machine["timings"]["wall_seconds"] > 0 and machine["ranks"][1]["opened"]


def test_the_kept_models_load_in_one_line_and_give_the_runs_predictions(
    stores: Path, tmp_path: Path
) -> None:
    """Each client's final models are kept as safetensors with their card; loaded with
    the README's line, they give the final round's predictions on the test patches."""
    job = _job(stores, tmp_path / "run", rounds=2)
    _run_job(job, on_line=lambda _: None)
    run = json.loads((job.run_dir / "run.json").read_text())
    for client in (0, 1):
        predictions = read_predictions(predictions_path(job.run_dir, client))
        for label in ("private", "proxy"):
            model, card = load_trained(trained_path(job.run_dir, client, label))
            assert (card.evaluated_model, card.client, card.center) == (label, client, client)
            assert card.config_digest == run["config_digest"] and card.rounds == 2
            assert card.architecture == ("mlp" if label == "private" else "cnn1")
            assert ModelCard.from_json(trained_path(job.run_dir, client, label)
                                       .with_suffix(".json").read_text()) == card  # fmt: skip
            expected = predictions.of_model(label)
            for center in (0, 1):
                reader = PatchSplitReader(store_path(stores, center), "test")
                p_tumor = predict_tumor(model, card, reader.images())
                rows = expected.center == center
                assert np.abs(p_tumor - expected.p_tumor[rows]).max() <= 5e-7
    with pytest.raises(ValueError, match="not a model a run kept"):
        read_card(_plain_safetensors(tmp_path / "plain.safetensors"))


def _plain_safetensors(path: Path) -> Path:
    from safetensors.numpy import save_file

    save_file({"w": np.zeros(2, dtype=np.float32)}, str(path))
    return path


def test_the_rank_a_signal_ended_first_is_the_cause_not_those_the_launcher_stopped() -> None:
    """The fork launcher's own lines: once rank 1 dies of SIGBUS it stops rank 0 (SIGQUIT
    or SIGINT); the cause is rank 1, whatever order the lines come in."""
    signaled = _SignaledRanks("fork")
    for line in (
        "[0]0:Return code = 0, signaled with Quit",
        "[rank 0] INFO something else",
        "[0]1:Return code = 0, signaled with Bus error",
    ):
        signaled.add(line)  # fmt: skip
    assert signaled.first() == (1, "Bus error")
    only_stopped = _SignaledRanks("fork")
    only_stopped.add("[0]1:Return code = 0, signaled with Interrupt")
    assert only_stopped.first() == (1, "Interrupt")
    assert _SignaledRanks("fork").first() is None


def test_a_launcher_exiting_0_without_a_finished_run_fails_the_job(
    stores: Path, tmp_path: Path
) -> None:
    """No signal reported and exit 0, but run.json does not say finished (or is missing):
    the job failed all the same, and the message says why."""
    job = _job(stores, tmp_path / "run")
    job.run_dir.mkdir(parents=True)
    for state in (None, "running"):
        if state is not None:
            (job.run_dir / "run.json").write_text(json.dumps({"status": state}))
        with pytest.raises(TrainingJobFailed, match=r"exited 0, but .*run\.json records no "
                           r"finished run") as failure:  # fmt: skip
            _raise_unless_finished(job, 0, _SignaledRanks("fork"), _RankTails(5))
        assert failure.value.exit_code == 1 and failure.value.rank is None
        with pytest.raises(TrainingJobFailed, match="records no finished run"):
            _raise_unless_finished(job, 0, None, _RankTails(5))  # hydra's, srun's: no lines
    (job.run_dir / "run.json").write_text(json.dumps({"status": "finished"}))
    _raise_unless_finished(job, 0, _SignaledRanks("fork"), _RankTails(5))  # a finished run passes


def test_a_rank_the_machine_refused_fails_the_job_in_one_line_and_is_not_retried(
    stores: Path, tmp_path: Path
) -> None:
    """A rank whose disk filled says so and aborts with 3 (proxyfl.run); the fork launcher
    exits 3 and stops the other rank (SIGINT). The job's error is the rank's line, whose
    failure record the full disk kept from being written, exit status 3, and the training
    task does not retry it."""
    from prefect.states import Failed

    from tasks.train import worth_retrying

    job = _job(stores, tmp_path / "run")
    job.run_dir.mkdir(parents=True)
    said = ("runs/x/ranks/rank_1.json: no space left on its device (ENOSPC): free space "
            "there, or write elsewhere")  # fmt: skip
    tails, signaled = _RankTails(5), _SignaledRanks("fork")
    for line in ("[rank 1] INFO proxyfl.loop: round 1/2 client 1: ...",
                 f"proxyfl.run: error: rank 1 (centre 1): {said}",
                 "Traceback (most recent call last):", "OSError: [Errno 28] ...",
                 "[0]0:Return code = 0, signaled with Interrupt"):  # fmt: skip
        tails.add(line)
        signaled.add(line)
    with pytest.raises(TrainingJobFailed) as raised:
        _raise_unless_finished(job, 3, signaled, tails)
    error = raised.value
    assert error.exit_code == 3 and error.exit_status == 3 and error.rank == 1
    assert str(error) == (f"ProxyFL seed 0: rank 1 (centre 1): {said} (full log: "
                          f"{job.run_dir / 'job.log'})")  # fmt: skip
    assert not worth_retrying(None, None, Failed(data=error))  # type: ignore[arg-type]
    other = TrainingJobFailed(job, 137, None, ["a line"])
    assert other.exit_status == 1 and worth_retrying(None, None, Failed(data=other))  # type: ignore[arg-type]


def test_a_stopped_ranks_abort_is_never_the_cause_of_a_killed_ranks_job(
    stores: Path, tmp_path: Path
) -> None:
    """Rank 0 SIGKILLed, rank 1 stopped by the launcher (SIGINT) and exiting with
    EXIT_STOPPED (the fork launcher then exits 130), or killed too (it exits 0): the job
    failed with the signal (137, rank 0), not with the stopped rank's 130."""
    from proxyfl.engine.validation import EXIT_STOPPED

    job = _job(stores, tmp_path / "run")
    job.run_dir.mkdir(parents=True)
    tails, signaled = _RankTails(5), _SignaledRanks("fork")
    for line in ("[rank 1] INFO proxyfl.loop: round 1/5 client 1: ...",
                 "proxyfl.run: rank 1 stopped (SIGINT)",
                 "[0]0:Return code = 0, signaled with Killed"):  # fmt: skip
        tails.add(line)
        signaled.add(line)
    for launcher_exit in (EXIT_STOPPED, 0):
        with pytest.raises(TrainingJobFailed) as raised:
            _raise_unless_finished(job, launcher_exit, signaled, tails)
        assert raised.value.exit_code == 128 + signal.SIGKILL and raised.value.rank == 0
        assert "SIGKILL" in str(raised.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (needs root)")
def test_a_run_without_room_for_its_checkpoints_is_refused_before_round_one(
    stores: Path, tmp_path: Path
) -> None:
    """The runs' folder on a real 1 MiB filesystem: the ranks set up, then rank 0 finds
    less room than the checkpoints and models of both ranks take (proxyfl.run) and ends
    the job in one line with exit status 3 before any round, not retried."""
    runs = tmp_path / "runs"
    runs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(runs)], check=True)
    try:
        job = _job(stores, runs / "run")
        with pytest.raises(TrainingJobFailed) as raised:
            _run_job(job, on_line=lambda _: None)
        error = raised.value
        assert error.exit_status == 3 and error.rank == 0, str(error)
        assert re.fullmatch(
            rf"ProxyFL seed 0: rank 0 \(centre 0\): {re.escape(str(job.run_dir))}: the run "
            r"needs about [0-9,]+ bytes for the checkpoints and models of its 2 rank\(s\) but "
            r"only [0-9,]+ are free on its filesystem: free space there, or set train.runs to "
            rf"a folder with room \(full log: {re.escape(str(job.run_dir / 'job.log'))}\)",
            str(error)), str(error)  # fmt: skip
        assert not (job.run_dir / "metrics.jsonl").exists()  # no round ran
        assert not list((job.run_dir / "checkpoints").glob("*/*.pt"))
    finally:
        subprocess.run(["umount", "-l", str(runs)], check=False)


def test_the_phases_account_for_a_jobs_wall_time(stores: Path, tmp_path: Path) -> None:
    """machine.json splits the job's time: each rank's start-up (process created -> its
    clock), set-up and loop phases add up to its process's life, and the launcher's wall
    is the slowest rank's life plus the launcher's own overhead."""
    job = _job(stores, tmp_path / "run", rounds=2)
    run_job(job, on_line=lambda _: None)
    timings = json.loads((job.run_dir / "machine.json").read_text())["timings"]
    lives = timings["process_seconds_per_rank"]
    assert len(lives) == len(timings["per_rank"]) == 2
    for phases, life, startup in zip(timings["per_rank"], lives,
                                     timings["startup_seconds_per_rank"], strict=True):  # fmt: skip
        # imports of numpy, pydantic and mpi4py before the rank's clock take a while
        assert phases["startup_seconds"] == startup > 0.1
        # waiting for batches is a part of training, not a phase of its own
        accounted = sum(phases.values()) - phases["data_wait_seconds"]
        assert abs(life - accounted) <= 0.5 + 0.05 * life, (life, phases)
    launcher = timings["launcher"]
    assert launcher["slowest_rank_process_seconds"] == max(lives)
    assert launcher["wall_seconds"] >= max(lives) and launcher["overhead_seconds"] >= 0
    assert launcher["overhead_seconds"] == pytest.approx(launcher["wall_seconds"] - max(lives))
    cold = os.environ.get("PLUMBING_COLD_RANKS") == "1"
    assert launcher["warm_server"] == (None if cold else "job")  # started for this job
    # run.json, the same bytes on any machine, holds no timing: no key of it names one (its
    # values hold the paths of the run, which may name anything: a folder "launcher-1")
    keys = _keys(json.loads((job.run_dir / "run.json").read_text()))
    assert not {key for key in keys if "startup" in key or "launcher" in key}, keys


def _keys(document: Any) -> set[str]:
    """Every key of every mapping in ``document``, at any depth."""
    if isinstance(document, dict):
        return set(document) | {key for value in document.values() for key in _keys(value)}
    if isinstance(document, list):
        return {key for item in document for key in _keys(item)}
    return set()


def test_a_rank_stopped_while_it_exits_together_prints_the_one_error_line() -> None:
    """The first rank to exit with bad input makes the launcher stop the others (SIGINT)
    while they may be running their exit handlers: a rank exiting together is deaf to it,
    so the error stays one line, without a KeyboardInterrupt traceback after it."""
    script = (
        "import atexit, os, signal, time\n"
        "from proxyfl.engine.validation import exit_together\n"
        "class Comm:\n"
        "    def Get_rank(self): return 0\n"
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2)))\n"
        "exit_together(Comm(), ['rank 1 (centre 1): no store'])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "proxyfl.run: error: rank 1 (centre 1): no store"


def test_a_rank_whose_client_aborts_is_not_also_said_stopped_by_the_sigint_it_brings(
    tmp_path: Path,
) -> None:
    """A hosted client's thread aborts the job; the launcher's SIGINT, which the abort
    brings to every rank, reaches this rank's main thread while MPI_Abort has not yet
    returned: the rank ends with the abort's status, its one error line alone.

    The process takes the launcher's signals as a rank does (``stoppable_by_launcher``, as
    ``proxyfl.run.main``): started as CI starts the suite, it inherits SIGINT ignored, and
    without that the SIGINT was lost, the main thread slept on and the process ended by a
    race of two exits (30 s, exit 7 or 0, once SIGSEGV in coverage's two saves). The abort
    waits longer than the main thread: a SIGINT not taken ends the process with 0."""
    script = (
        "import os, signal, sys, threading, time\n"
        "from pathlib import Path\n"
        "from plumbing.processes import stoppable_by_launcher\n"
        "from proxyfl import run\n"
        "from proxyfl.engine.validation import RankFailure\n"
        "stoppable_by_launcher()  # as proxyfl.run.main\n"
        "class Comm:\n"
        "    def Abort(self, status):\n"
        "        os.kill(os.getpid(), signal.SIGINT)  # the launcher stops every rank\n"
        "        time.sleep(60)  # and MPI_Abort has not returned yet\n"
        "failure = RankFailure(rank=1, client='rank 1 client 3', phase='training',\n"
        "                      error='boom')\n"
        "client = threading.Thread(target=run._abort, daemon=True,\n"
        "                          args=(Comm(), Path(sys.argv[1]), failure, 7))\n"
        "try:\n"
        "    client.start()\n"
        "    time.sleep(30)\n"
        "except KeyboardInterrupt:\n"
        "    run.stopped()\n"
    )
    # -X faulthandler: a crash says where, with every thread's stack
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", script, str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=90)  # fmt: skip
    assert done.returncode == 7, done.stderr
    assert done.stderr.strip() == "proxyfl.run: error: rank 1 client 3: boom"
    assert (tmp_path / "failures" / "rank_1.json").is_file()
