"""MPI ranks forked from a warm interpreter: a job's ranks import their heavy modules once.

A training rank spends ~4 s of CPU importing torch, Opacus and the trainer before its
first line of work; four ranks on two cores wait ~8 s for it. On one machine the launcher
instead starts a *warm server* that imports those modules once, and has ``mpiexec`` start
a :mod:`~plumbing.warm_shim` in place of each rank. The shim passes the server what
its rank would have inherited (argv, environment, working directory, every open
descriptor: the PMI socket ``mpiexec`` talks to, its output pipes), the server forks, and
the child becomes the rank: the same descriptors at the same numbers, the same
environment, ``python -m mpi4py -m proxyfl.run ...`` run as ``__main__``, the interpreter's
own exit at its end. Nothing differs for MPI or for the program; only the imports were
done before the fork.

The server also holds its copies of each rank's descriptors until ``mpiexec`` has reaped
that rank's shim. MPICH's fork launcher waits its full 2 s for ranks it has not yet reaped
once their pipes close (``MPIE_WaitForProcesses`` never resets its count), which at a
rank's exit, pipes first, then SIGCHLD, happens at random: held so, the pipes close only
after every shim is reaped, and the launcher exits at once.

The server listens on a Unix socket in a private (0700) temporary directory: nothing of it
is on a network. It lives as long as the job (:func:`warm_server`), or as the block of jobs
that keeps it (:func:`kept_warm_server`: a flow's jobs, whose ranks then fork from one
server that imported once, started before the first job so that its imports overlap the
flow's own start). It exits when the launcher closes its control pipe or dies
(``PR_SET_PDEATHSIG``), killing any rank it forked that is still running, and a forked rank
dies with it. A rank whose shim dies (``mpiexec`` killing it) is killed too. A shim that
finds no server, or whose server ends before forking its rank, starts the rank cold.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import gc
import importlib
import json
import logging
import os
import runpy
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from plumbing import warm_shim
from plumbing.collector import imports_done, pause
from plumbing.environment import environment_variable
from plumbing.processes import die_with_parent

logger = logging.getLogger(__name__)

SOCKET_ENV = warm_shim.SOCKET_ENV
# a server kept for the commands a process runs (kept_warm_server(shared=True)): its folder,
# whose SERVED_FILE says the environment and imports it serves
SHARED_ENV = "PLUMBING_WARM_SHARED"
SERVED_FILE = "served.json"
# what a shell or DVC sets afresh for each command it runs: not part of what a server serves
_PER_COMMAND_NAMES = frozenset({"_", "PWD", "OLDPWD", "SHLVL", SHARED_ENV, SOCKET_ENV})
_PER_COMMAND_PREFIXES = ("DVC_",)
DISABLE_ENV = "PLUMBING_COLD_RANKS"  # set to 1: every rank starts its own interpreter
_UNIX_PATH_MAX = 107  # sun_path's 108 bytes, less the terminating NUL
_REAP_POLL_SECONDS = 0.002
_REAP_WAIT_SECONDS = 5.0  # a shim mpiexec has not reaped by then: release its rank anyway
_REQUEST_TIMEOUT_SECONDS = 30.0
_STOP_WAIT_SECONDS = 1.0  # a server told to stop exits at once, unless still importing


@dataclass(frozen=True)
class RankRequest:
    """What a shim sent: the rank's program and everything it would have inherited."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    fds: dict[int, int]  # the rank's descriptor number -> the one received for it
    shim_pid: int
    ignored_signals: frozenset[int]  # those the shim inherited ignored


@dataclass
class _Rank:
    """A forked rank, as the server follows it."""

    connection: socket.socket
    shim_pid: int
    held: list[int]  # the server's copies of the rank's descriptors
    pid: int | None = None
    ended_at: float | None = None  # monotonic time the rank's status went to its shim


def _receive(connection: socket.socket) -> RankRequest:
    """A shim's request; the descriptors received are closed again if it is malformed."""
    connection.settimeout(_REQUEST_TIMEOUT_SECONDS)  # a shim sends all of it at once
    header, fds, _, _ = socket.recv_fds(connection, warm_shim.HEADER.size, 1024)
    try:
        if len(header) != warm_shim.HEADER.size:
            raise ValueError("a shim closed its connection before its request")
        (length,) = warm_shim.HEADER.unpack(header)
        body = bytearray()
        while len(body) < length:
            chunk = connection.recv(length - len(body))
            if not chunk:
                raise ValueError("a shim's request was cut short")
            body += chunk
        connection.settimeout(None)
        message = json.loads(body)
        numbers = [int(n) for n in message["fds"]]
        if len(numbers) != len(fds):
            raise ValueError(f"a shim named {len(numbers)} descriptors and sent {len(fds)}")
        ignored = frozenset(int(number) for number in message["ignored_signals"])
        return RankRequest(argv=[str(a) for a in message["argv"]], env=dict(message["env"]),
                           cwd=str(message["cwd"]), fds=dict(zip(numbers, fds, strict=True)),
                           shim_pid=int(message["shim_pid"]), ignored_signals=ignored)  # fmt: skip
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _reaped(pid: int) -> bool:
    """Whether ``pid`` is gone, its zombie reaped by its parent (a zombie still exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, as another user's process (pid reused)
        pass
    return False


class _Server:
    """The warm server's loop: accept shims, fork ranks, relay their statuses."""

    def __init__(self, listener: socket.socket, control_fd: int) -> None:
        self.listener, self.control_fd = listener, control_fd
        self.selector = selectors.DefaultSelector()
        self.ranks: dict[int, _Rank] = {}  # by connection descriptor
        self._is_child = False
        self.wake_read, self.wake_write = os.pipe()
        for fd in (self.wake_read, self.wake_write):
            os.set_blocking(fd, False)

    def serve(self) -> RankRequest | None:
        """Run until the launcher lets go (None), or, in a forked child, return the rank's
        request with every descriptor of the server closed."""
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.control_fd, selectors.EVENT_READ, "control")
        self.selector.register(self.wake_read, selectors.EVENT_READ, "signal")
        self.listener.setblocking(False)
        try:
            while True:
                releasing = any(r.ended_at is not None for r in self.ranks.values())
                events = self.selector.select(_REAP_POLL_SECONDS if releasing else None)
                for key, _ in events:
                    if key.data == "control":
                        if not os.read(self.control_fd, 4096):
                            return None
                    elif key.data == "signal":
                        with contextlib.suppress(BlockingIOError):
                            os.read(self.wake_read, 4096)
                        self._collect_children()
                    elif key.data == "accept":
                        self._accept()
                    else:
                        request = self._on_connection(key.fileobj)  # type: ignore[arg-type]
                        if request is not None:
                            return request  # the child
                self._collect_children()
                self._release_reaped()
        finally:
            if not self._is_child:
                self._stop_all()

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            connection, _ = self.listener.accept()
            connection.setblocking(True)
            self.selector.register(connection, selectors.EVENT_READ, "rank")
            self.ranks[connection.fileno()] = _Rank(connection, shim_pid=0, held=[])

    def _on_connection(self, connection: socket.socket) -> RankRequest | None:
        rank = self.ranks[connection.fileno()]
        if rank.pid is None:  # the shim's request
            try:
                request = _receive(connection)
            except (OSError, ValueError, KeyError, TypeError) as error:
                logger.warning("warm server: %s", error)
                self._close(rank)
                return None
            if _hung_up(connection):  # the shim was stopped while the server was busy
                self._close(rank)
                return None
            return self._fork(rank, request)
        # a shim says nothing after its request: this is its end (mpiexec killed it; a
        # shim killed with bytes unread resets the connection instead of closing it)
        try:
            ended = not connection.recv(1)
        except OSError:
            ended = True
        if ended:
            if rank.ended_at is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rank.pid, signal.SIGKILL)
            self.selector.unregister(connection)
        return None

    def _fork(self, rank: _Rank, request: RankRequest) -> RankRequest | None:
        server_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            self._is_child = True
            self._close_in_child(keep=set(request.fds.values()))
            die_with_parent(server_pid)
            return request
        rank.pid, rank.shim_pid = pid, request.shim_pid
        rank.held = list(request.fds.values())
        try:
            rank.connection.sendall(f"pid {pid}\n".encode())
        except OSError:  # the shim is gone already
            os.kill(pid, signal.SIGKILL)
        return None

    def _close_in_child(self, keep: set[int]) -> None:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.selector.close()
        self.listener.close()
        for rank in self.ranks.values():
            rank.connection.close()
            for fd in rank.held:
                if fd not in keep:
                    os.close(fd)
        for fd in (self.control_fd, self.wake_read, self.wake_write):
            os.close(fd)

    def _collect_children(self) -> None:
        by_pid = {rank.pid: rank for rank in self.ranks.values() if rank.pid is not None}
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rank = by_pid.get(pid)
            if rank is None:
                continue
            rank.ended_at = time.monotonic()
            with contextlib.suppress(OSError):
                rank.connection.sendall(f"status {status}\n".encode())

    def _release_reaped(self) -> None:
        """Close what the server holds of each ended rank once mpiexec has reaped its
        shim (or after a while regardless): the launcher then sees the pipes close."""
        now = time.monotonic()
        for rank in list(self.ranks.values()):
            if rank.ended_at is None:
                continue
            if _reaped(rank.shim_pid) or now - rank.ended_at > _REAP_WAIT_SECONDS:
                self._close(rank)

    def _close(self, rank: _Rank) -> None:
        self.ranks.pop(rank.connection.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(rank.connection)
        rank.connection.close()
        for fd in rank.held:
            with contextlib.suppress(OSError):
                os.close(fd)
        rank.held = []

    def _stop_all(self) -> None:
        """The launcher let go: no rank outlives it."""
        for rank in list(self.ranks.values()):
            if rank.pid is not None and rank.ended_at is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rank.pid, signal.SIGKILL)
            self._close(rank)


def _hung_up(connection: socket.socket) -> bool:
    """Whether the peer of ``connection`` has closed it (nothing left to read, at once)."""
    try:
        return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _place_descriptors(fds: Mapping[int, int]) -> None:
    """Put each received descriptor at the number it had in the shim, as exec would."""
    moved = {}
    for target, received in fds.items():
        moved[target] = fcntl.fcntl(received, fcntl.F_DUPFD_CLOEXEC, 1024)
        os.close(received)
    for target, high in moved.items():
        os.dup2(high, target)  # the copy is inheritable, as the shim's was
        os.close(high)


def _take_signals(ignored: frozenset[int]) -> None:
    """The dispositions an executed rank would have started with: ``ignored`` (the shim's,
    inherited) ignored, as exec passes them on; SIGINT raising ``KeyboardInterrupt`` where
    it is not (the server ignores it); no other signal ignored, whatever the server's own
    launcher ignored. What the server set up otherwise (coverage's SIGTERM handler, where
    the tests measure it) stays: a fresh interpreter sets up the same."""
    for number in warm_shim.FORWARDED:
        if number in ignored:
            signal.signal(number, signal.SIG_IGN)
        elif number == signal.SIGINT:
            signal.signal(number, signal.default_int_handler)  # as a fresh interpreter has it
        elif (signal.getsignal(number) == signal.SIG_IGN
              and number not in warm_shim.IGNORED_BY_PYTHON):  # fmt: skip
            signal.signal(number, signal.SIG_DFL)


def become_rank(request: RankRequest) -> None:
    """Turn this forked child into the rank the shim would have executed: returns only by
    raising SystemExit, as the program's ``__main__`` does."""
    _place_descriptors(request.fds)
    _take_signals(request.ignored_signals)
    os.environ.clear()
    os.environ.update(request.env)
    os.chdir(request.cwd)
    argv = request.argv
    if len(argv) < 3 or argv[1] != "-m":
        raise SystemExit(f"warm server: can only run `python -m MODULE ...`, not {argv}")
    sys.argv = [argv[0], *argv[3:]]
    runpy.run_module(argv[2], run_name="__main__", alter_sys=True)


def server_main(argv: list[str] | None = None) -> None:
    """``python -m plumbing.warm LISTENER_FD LAUNCHER_PID MODULE,...``: import the modules,
    then serve on the inherited listening socket; standard input is the launcher's control
    pipe. Shims that connect before the imports are done wait in the listener's queue."""
    args = sys.argv[1:] if argv is None else argv
    # Ctrl-C reaches the terminal's whole process group, the server with it: the server
    # ends with its launcher (control pipe, PR_SET_PDEATHSIG), not halfway through an
    # import with a traceback of its own; its ranks take SIGINT back (become_rank)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    listener = socket.socket(fileno=int(args[0]))
    die_with_parent(int(args[1]))
    pause()  # no collection walks the imports as they arrive (plumbing.collector)
    for name in filter(None, args[2].split(",")):
        importlib.import_module(name)
    gc.collect()
    imports_done()  # frozen: what every rank shares stays out of its collections (and pages)
    request = _Server(listener, control_fd=0).serve()
    if request is None:
        os._exit(0)  # nothing to flush; skips collecting torch at exit (~1 s of CPU)
    become_rank(request)


def enabled(environment: Mapping[str, str]) -> bool:
    """Whether ranks start warm: on Linux (fork, /proc, descriptor passing), unless
    ``PLUMBING_COLD_RANKS=1``."""
    return sys.platform.startswith("linux") and environment.get(DISABLE_ENV, "") != "1"


@dataclass
class _KeptServer:
    """A server kept for the jobs of a block (:func:`kept_warm_server`), and what it is for."""

    environment: dict[str, str]
    preload: tuple[str, ...]
    ranks: WarmRanks
    process: subprocess.Popen[bytes]
    used: bool = False  # a job has been given it

    def serves(self, environment: Mapping[str, str], preload: Sequence[str]) -> bool:
        """Started with this environment and these imports, and still running."""
        return (self.preload == tuple(preload) and self.environment == dict(environment)
                and self.process.poll() is None)  # fmt: skip


_kept: list[_KeptServer] = []
_kept_lock = threading.Lock()


def _kept_for(
    environment: Mapping[str, str], preload: Sequence[str], job: bool
) -> WarmRanks | None:
    """The newest kept server for ``environment`` and ``preload``, marked used by a job;
    else the one this process's parent shares with its commands, if it serves the same."""
    with _kept_lock:
        found = [kept for kept in _kept if kept.serves(environment, preload)]
        if found and job:
            found[-1].used = True
    return found[-1].ranks if found else _shared_with_us(environment, preload)


def _served(environment: Mapping[str, str]) -> dict[str, str]:
    """What of ``environment`` a shared server is matched on: all but what a shell or DVC
    sets afresh for each command (``PWD``, ``SHLVL``, ``DVC_*``...)."""
    return {
        name: value
        for name, value in environment.items()
        if name not in _PER_COMMAND_NAMES and not name.startswith(_PER_COMMAND_PREFIXES)
    }


def _shared_with_us(environment: Mapping[str, str], preload: Sequence[str]) -> WarmRanks | None:
    """The server named by ``PLUMBING_WARM_SHARED`` (a parent's, kept for its commands)
    when it serves ``environment`` and ``preload`` and is still there; else None."""
    folder = os.environ.get(SHARED_ENV)
    if not folder:
        return None
    ranks = WarmRanks(Path(folder) / "socket", origin="shared")
    try:
        served = json.loads((Path(folder) / SERVED_FILE).read_text())
    except (OSError, ValueError):
        return None  # its command has ended, and the server with it
    if served != {"environment": _served(environment), "preload": list(preload)}:
        theirs = served.get("environment", {}) if isinstance(served, dict) else {}
        ours = _served(environment)
        differing = sorted(name for name in theirs.keys() | ours.keys()
                           if theirs.get(name) != ours.get(name))  # fmt: skip
        logger.info(
            "the shared warm server serves another environment (%s) or other imports: this "
            "job starts its own", ", ".join(differing) or "the same",
        )  # fmt: skip
        return None
    if not ranks.socket_path.exists():
        return None
    logger.debug("ranks forked from the shared warm server in %s", folder)
    return ranks


@contextlib.contextmanager
def warm_server(
    environment: Mapping[str, str], preload: Sequence[str]
) -> Iterator[WarmRanks | None]:
    """A warm server for one job that has imported ``preload`` (never ``mpi4py.MPI``,
    whose import initialises MPI: that must happen in the rank), started with
    ``environment`` (the ranks' own, which decides what those imports read); None where
    ranks start cold. A server kept by an enclosing :func:`kept_warm_server` for the same
    environment and imports is used as it is; otherwise one is started, and stopped after."""
    kept = _kept_for(environment, preload, job=True)
    if kept is not None:
        yield kept
        return
    with _started(environment, preload) as started:
        yield started[0] if started is not None else None


@contextlib.contextmanager
def kept_warm_server(
    environment: Mapping[str, str], preload: Sequence[str], *, shared: bool = False
) -> Iterator[WarmRanks | None]:
    """A warm server started now and kept for the block: every :func:`warm_server` asked
    for inside it with the same environment and imports (the jobs of a flow) forks its
    ranks from this one, whose imports are done once, while the caller goes on with what
    comes before its first job. One already kept for the same is used instead. The server
    stops when the block ends, and any rank still running with it; one that no job used
    (every run up to date) is killed at once, still importing as it may be.

    ``shared``: also for the commands this process starts in the block (``dvc repro``'s
    stage commands, each a process of its own): ``PLUMBING_WARM_SHARED`` names the server
    to them, and their jobs fork from it where their ranks' environment is this one, less
    what a shell or DVC sets afresh per command; elsewhere they start their own."""
    kept = _kept_for(environment, preload, job=False)
    if kept is not None:
        yield kept
        return
    with _started(environment, preload) as started:
        if started is None:
            yield None
            return
        ranks, process = started
        entry = _KeptServer(dict(environment), tuple(preload),
                            dataclasses.replace(ranks, origin="kept"), process)  # fmt: skip
        with _kept_lock:
            _kept.append(entry)
        try:
            with _shared_for_commands(entry, shared):
                yield entry.ranks
        finally:
            with _kept_lock:
                _kept.remove(entry)
            if not entry.used:  # no job here (all up to date, or only the commands' jobs,
                entry.process.kill()  # ended with them): still importing as it may be


@contextlib.contextmanager
def _shared_for_commands(entry: _KeptServer, shared: bool) -> Iterator[None]:
    """``entry`` named to the commands this process starts in the block (``shared``)."""
    if not shared:
        yield
        return
    folder = entry.ranks.socket_path.parent
    served = {"environment": _served(entry.environment), "preload": list(entry.preload)}
    (folder / SERVED_FILE).write_text(json.dumps(served))  # before any command can read it
    with environment_variable(SHARED_ENV, str(folder)):
        yield


@contextlib.contextmanager
def _started(
    environment: Mapping[str, str], preload: Sequence[str]
) -> Iterator[tuple[WarmRanks, subprocess.Popen[bytes]] | None]:
    """A server started for the block, and its process; None where ranks start cold."""
    if not enabled(environment):
        yield None
        return
    directory = Path(tempfile.mkdtemp(prefix="warm-ranks-"))
    path = directory / "socket"
    if len(os.fsencode(path)) > _UNIX_PATH_MAX:
        shutil.rmtree(directory, ignore_errors=True)
        logger.info("ranks start cold: the socket path %s is too long", path)
        yield None
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control_read, control_write = os.pipe()
    process: subprocess.Popen[bytes] | None = None
    try:
        listener.bind(str(path))
        listener.listen(1024)
        command = [sys.executable, "-m", "plumbing.warm", str(listener.fileno()),
                   str(os.getpid()), ",".join(preload)]  # fmt: skip
        process = subprocess.Popen(
            command, stdin=control_read, pass_fds=(listener.fileno(),),
            env=dict(environment), stdout=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(control_read)
        control_read = -1
        listener.close()
        yield WarmRanks(path), process
    finally:
        if control_read >= 0:
            os.close(control_read)
        os.close(control_write)  # the server's cue to stop, once its imports are done
        listener.close()
        if process is not None:
            try:  # one still importing has forked no rank: no need to wait for it
                process.wait(timeout=_STOP_WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()  # its ranks, if any, die with it (PR_SET_PDEATHSIG)
                process.wait()
        shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True)
class WarmRanks:
    """A running warm server, as the launcher uses it, and whose it is: started for one
    job, kept by this process for a block of jobs, or shared by the command that started
    this process (each job's machine.json says which its ranks were forked from)."""

    socket_path: Path
    origin: Literal["job", "kept", "shared"] = "job"

    def program(self, argv: list[str]) -> list[str]:
        """``argv`` (a rank's program) as the shim that has the server fork it."""
        return [sys.executable, "-I", "-S", warm_shim.__file__, *argv]

    def environment(self) -> dict[str, str]:
        """What the shims' environment must hold to find the server."""
        return {SOCKET_ENV: str(self.socket_path)}


if __name__ == "__main__":
    server_main()
