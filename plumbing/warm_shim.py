"""A rank's stand-in: what ``mpiexec`` starts when the ranks are forked warm.

Run as ``python -I -S warm_shim.py PROGRAM ARGS...`` (standard library only, no site
packages: it starts in ~20 ms). It hands everything a freshly executed PROGRAM would have
inherited (its argv, environment, working directory and every open file descriptor, the
launcher's PMI socket among them) to the warm server named in the environment
(:mod:`plumbing.warm`), which forks the rank from an interpreter that has already
imported torch and Opacus. It then stands in for that rank towards ``mpiexec``: it forwards
the signals ``mpiexec`` sends, and exits as the rank exited (the same status, or killed by
the same signal).

Where there is no server, or it cannot be reached, the shim executes PROGRAM itself: the
rank starts cold, as it would without the server.

The shim's starter dying ends the rank: a forked rank's parent is the server, not whoever
started the shim, so neither the starter's end nor a watch of the rank's own parent
(:func:`plumbing.processes.exit_when_orphaned`) reaches it. The shim watches the process
that started it (mpiexec's proxy, FLARE's site, slurmstepd) from its first instant and,
once that is gone, says so and ends as the rank does, killed (SIGKILL to both: a FLARE
site killed outright left its forked rank training until the whole launch ended).

Signals: the shim catches every forwarded signal before it sends its request, so that none
``mpiexec`` sends while the server forks is lost (one that a background job's launcher
left ignored was dropped in that window, and the job then waited for its rank for ever).
The signals the shim inherited ignored are named in the request, and the forked rank
ignores them as an executed one would have (:func:`plumbing.warm.become_rank`); a shim
that starts the rank cold puts them back first.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Collection, Iterator
from typing import NoReturn

SOCKET_ENV = "PLUMBING_WARM_SOCKET"
STARTED_ENV = "PLUMBING_STARTED_AT_TICKS"  # this process's start, for the rank's start-up
HEADER = struct.Struct("!I")  # the request's length, then its JSON
# Every signal whose default action ends a process and that a handler can catch: sent to
# the shim (by mpiexec stopping the job, or by a person), it goes to the rank, which then
# ends as that signal says, and the shim with it. SIGKILL cannot be caught: the server
# kills the rank when its shim's connection closes.
FORWARDED = (
    signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGILL, signal.SIGTRAP,
    signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGUSR1, signal.SIGSEGV,
    signal.SIGUSR2, signal.SIGPIPE, signal.SIGALRM, signal.SIGTERM, signal.SIGXCPU,
    signal.SIGXFSZ, signal.SIGVTALRM, signal.SIGPROF, signal.SIGSYS,
)  # fmt: skip
# Every interpreter ignores these two as it starts (as subprocess' restore_signals says):
# the shim cannot tell whether its launcher ignored them, and a rank ignores them anyway
IGNORED_BY_PYTHON = (signal.SIGPIPE, signal.SIGXFSZ)
STARTER_POLL_SECONDS = 0.25  # how often the shim looks for the process that started it


def _open_descriptors() -> list[int]:
    """Every descriptor open in this process (listing /proc opens one more, gone after)."""
    listed = [int(name) for name in os.listdir("/proc/self/fd")]
    open_ones = []
    for fd in listed:
        try:
            os.fstat(fd)
        except OSError:
            continue
        open_ones.append(fd)
    return sorted(open_ones)


def start_ticks() -> int:
    """This process's start time, in clock ticks since boot (/proc/self/stat, field 22,
    counted after the name, which may hold spaces and parentheses)."""
    with open("/proc/self/stat", encoding="ascii") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[19])


def _exec_cold(argv: list[str], ignored: Collection[int] | None = None) -> None:
    """Execute the rank in place. Where the shim has caught the forwarded signals, each goes
    back to what it inherited: ``ignored`` (those it inherited ignored, but for
    :data:`IGNORED_BY_PYTHON`, which the rank's interpreter ignores anyway) ignored, the
    others their default; ``None`` where it caught none."""
    if ignored is not None:
        for number in FORWARDED:
            signal.signal(number, signal.SIG_IGN if number in ignored else signal.SIG_DFL)
    os.execv(argv[0], argv)


def _end_with_starter(child: list[int]) -> None:
    """From now on, once the process that started this one is gone (this one's parent has
    changed: adopted by a subreaper, or by init), say so and end, killed, with the rank
    (``child``, once forked; the server kills one it forks for a shim gone by then)."""
    starter = os.getppid()

    def watch() -> None:
        while os.getppid() == starter:
            time.sleep(STARTER_POLL_SECONDS)
        with contextlib.suppress(OSError, ValueError):
            print(f"warm_shim: process {starter}, which started this one, is gone; "
                  "the rank ends", file=sys.stderr, flush=True)  # fmt: skip
        for pid in (*child, os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    threading.Thread(target=watch, name="end-with-starter", daemon=True).start()


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("warm_shim: no program to run")
    path = os.environ.pop(SOCKET_ENV, "")
    if not path:
        _exec_cold(argv)
    child: list[int] = []
    _end_with_starter(child)

    def forward(number: int, _frame: object) -> None:
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child[0], number)
            return
        # no rank yet (the server may still be importing torch, seconds under load): end
        # now, as a cold rank would; the server, finding this connection closed, kills a
        # rank it forks for it. Waiting for the fork to forward the signal held a stopped
        # job for the whole of the server's imports
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)

    # caught before the request goes: a signal sent while the server forks reaches the rank
    inherited = {number: signal.signal(number, forward) for number in FORWARDED}
    ignored = [int(number) for number, disposition in inherited.items()
               if disposition == signal.SIG_IGN and number not in IGNORED_BY_PYTHON]  # fmt: skip
    descriptors = _open_descriptors()
    environment = dict(os.environ)
    environment[STARTED_ENV] = str(start_ticks())
    request = json.dumps({"argv": argv, "env": environment, "cwd": os.getcwd(),
                          "fds": descriptors, "shim_pid": os.getpid(),
                          "ignored_signals": ignored}).encode()  # fmt: skip
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
        # a server gone while this sends is an error here (not SIGPIPE, which is forwarded)
        socket.send_fds(connection, [HEADER.pack(len(request))], descriptors,
                        socket.MSG_NOSIGNAL)  # fmt: skip
        connection.sendall(request, socket.MSG_NOSIGNAL)
    except OSError as error:
        print(f"warm_shim: no warm server at {path} ({error}); starting cold",
              file=sys.stderr, flush=True)  # fmt: skip
        connection.close()
        _exec_cold(argv, ignored)
    for word, value in _messages(connection):
        if word == "pid":
            child.append(int(value))
        elif word == "status":
            _end_as(int(value))
    if child:
        print("warm_shim: the warm server went away before the rank ended", file=sys.stderr,
              flush=True)  # fmt: skip
        os._exit(1)
    # the server ended before forking the rank (its imports failed, or it was stopped):
    # nothing has run yet, so the rank starts cold
    print(f"warm_shim: the warm server at {path} ended before starting the rank; "
          "starting cold", file=sys.stderr, flush=True)  # fmt: skip
    connection.close()
    _exec_cold(argv, ignored)


def _messages(connection: socket.socket) -> Iterator[tuple[str, str]]:
    """The server's lines ("pid N", then "status S") until it closes the connection, or
    resets it (a server that exits with shims still queued for it)."""
    reader = connection.makefile("r", encoding="ascii")
    with contextlib.suppress(ConnectionError):
        for line in reader:
            word, _, value = line.partition(" ")
            yield word, value


def _end_as(status: int) -> NoReturn:
    """Exit as a process with wait status ``status`` did: killed by its signal, or its code."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be handled:
            signal.signal(number, signal.SIG_DFL)  # asking raises OSError (a rank killed
        os.kill(os.getpid(), number)  # by the OOM killer was reported as the shim's SIGQUIT)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
