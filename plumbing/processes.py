"""Child processes that do not outlive the process that started them (Linux).

A process killed with SIGKILL runs no cleanup, so its children (process-pool workers, a
Prefect server, an MPI job) would otherwise live on with PPID 1. On Linux each such child
asks the kernel for a signal when its parent dies (``PR_SET_PDEATHSIG``):

- a process calls :func:`die_with_parent` for itself (a pool worker as its initializer, a
  command at its start);
- programs started with ``subprocess`` are wrapped by :func:`parent_bound_command`, or,
  when they start children that must not outlive them either (``mpiexec``'s ssh clients),
  by :func:`tree_bound_command`.

The kernel sends the signal when the *thread* that forked the child exits, so children
must be forked from threads that live as long as they do. Elsewhere than on Linux this
module does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from plumbing.collector import imports_done

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36

# What parent_bound_command runs before the program: the same steps as die_with_parent,
# then exec (the death signal survives execve). Inline rather than `-m plumbing.processes`
# so that it needs nothing importable; no preexec_fn, which is unsafe once threads run.
_EXEC_BOUND = (
    "import ctypes, os, sys\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(1, int(sys.argv[2]), 0, 0, 0) != 0:\n"
    "    raise OSError(ctypes.get_errno(), 'prctl(PR_SET_PDEATHSIG) failed')\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execv(sys.argv[3], sys.argv[3:])\n"
)


def binds_children() -> bool:
    """Whether children can be bound to their parent here (Linux only)."""
    return sys.platform.startswith("linux")


def die_with_parent(parent_pid: int, signal_number: int = signal.SIGKILL) -> None:
    """Have the kernel send ``signal_number`` to the calling process when its parent dies.

    ``parent_pid`` is the parent that started us: if it is no longer our parent, it died
    before the request took effect, and we exit at once. Does nothing off Linux.
    """
    if not binds_children():
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal_number), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if os.getppid() != parent_pid:
        os._exit(1)


def parent_bound_command(argv: Sequence[str], signal_number: int = signal.SIGKILL) -> list[str]:
    """``argv`` (an executable's path, then its arguments) as a command whose process gets
    ``signal_number`` when the calling process dies; ``argv`` itself off Linux. SIGTERM
    lets a program that has children of its own (``mpiexec``) stop them first."""
    if not binds_children():
        return list(argv)
    return [sys.executable, "-c", _EXEC_BOUND, str(os.getpid()), str(int(signal_number)),
            *argv]  # fmt: skip


# What tree_bound_command runs: bound to its parent as above, and a subreaper
# (PR_SET_CHILD_SUBREAPER), so that what the program's children leave behind when they die
# becomes its own child rather than init's. It starts the program and ends every process
# under it when asked to stop (SIGTERM, SIGINT, SIGHUP: the parent's death sends SIGTERM):
# SIGTERM, then SIGKILL once the grace is over, or LEFT_ALONE_S after the program alone is
# left of a tree it had (a launcher has nothing to stop once its children are gone; MPICH's
# fork launcher ignores SIGTERM and notices its ranks' end only at its next poll, seconds
# later). A program alone from the start gets the whole grace: SIGKILL on the
# heels of SIGTERM cut short its own handling of it, a handler's cleanup and its exit
# status (coverage's SIGTERM handler saving a test's data: exit 137, not 143). Once the
# program has exited, it kills and reaps whatever the program left. What it adopts is
# reaped as it ends, not at the program's end: a zombie looks alive to whoever waits for
# that process to end.
# The program gets every descriptor the supervisor has (a launcher's ranks write to one
# their environment names, not only to standard output). It exits as the program did:
# its status, or 128 + the signal.
LEFT_ALONE_S = 2.0
"""Seconds a stopped program left alone of the tree it had is given to end by itself (its
own cleanup and status, coverage's save) before SIGKILL; within the job's grace."""
_SUPERVISE_TREE = (
    "import ctypes, os, signal, subprocess, sys, threading, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "if libc.prctl(1, int(signal.SIGTERM), 0, 0, 0) or libc.prctl(36, 1, 0, 0, 0):\n"
    "    raise OSError(ctypes.get_errno(), 'prctl failed')\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "def under():\n"
    "    children = {}\n"
    "    for name in filter(str.isdigit, os.listdir('/proc')):\n"
    "        try:\n"
    "            with open(f'/proc/{name}/stat', 'rb') as stat:\n"
    "                parent = int(stat.read().rsplit(b')', 1)[1].split()[1])\n"
    "        except (OSError, ValueError, IndexError):\n"
    "            continue\n"
    "        children.setdefault(parent, []).append(int(name))\n"
    "    found, todo = [], [os.getpid()]\n"
    "    while todo:\n"
    "        below = children.get(todo.pop(), [])\n"
    "        found, todo = found + below, todo + below\n"
    "    return found\n"
    "def signal_all(number):\n"
    "    signalled = under()\n"
    "    for pid in signalled:\n"
    "        try:\n"
    "            os.kill(pid, number)\n"
    "        except ProcessLookupError:\n"
    "            pass\n"
    "    return signalled\n"
    "grace, left_alone, child, asked = float(sys.argv[2]), float(sys.argv[3]), None, []\n"
    "def finish(had_company):\n"
    "    deadline = time.monotonic() + grace\n"
    "    while time.monotonic() < deadline:\n"
    "        if had_company and under() == [child.pid]:\n"
    "            had_company, deadline = False, min(deadline, time.monotonic() + left_alone)\n"
    "        time.sleep(0.05)\n"
    "    signal_all(signal.SIGKILL)\n"
    "def stop(number, frame):\n"
    "    asked.append(number)\n"
    "    if child is not None and len(asked) == 1:\n"
    "        had_company = signal_all(signal.SIGTERM) != [child.pid]\n"
    "        threading.Thread(target=finish, args=(had_company,), daemon=True).start()\n"
    "for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
    "    signal.signal(number, stop)\n"
    "child = subprocess.Popen(sys.argv[4:], close_fds=False)\n"
    "if asked:\n"
    "    signal_all(signal.SIGKILL)\n"
    "while True:\n"
    "    pid, status = os.waitpid(-1, 0)\n"
    "    if pid == child.pid:\n"
    "        code = os.waitstatus_to_exitcode(status)\n"
    "        break\n"
    "while under():\n"
    "    signal_all(signal.SIGKILL)\n"
    "    while True:\n"
    "        try:\n"
    "            os.waitpid(-1, 0)\n"
    "        except ChildProcessError:\n"
    "            break\n"
    "os._exit(128 - code if code < 0 else code)\n"
)


def tree_bound_command(argv: Sequence[str], grace_s: float = 3.0) -> list[str]:
    """``argv`` run by a supervisor that ends every process under it, in whatever session
    or group: when the calling process dies (even by SIGKILL), when the supervisor gets
    SIGTERM, SIGINT or SIGHUP (SIGTERM to all, SIGKILL ``grace_s`` later, or
    :data:`LEFT_ALONE_S` after ``argv`` alone is left of the processes it had then), and
    once ``argv`` has exited.
    For a launcher whose children would otherwise outlive it: hydra's ``mpiexec`` starts
    each ``ssh`` in a session of its own, and leaves one to a host that does not answer
    running when it is stopped. The supervisor exits as ``argv`` did (128 + N for signal
    N). ``argv`` itself off Linux."""
    if not binds_children():
        return list(argv)
    return [sys.executable, "-c", _SUPERVISE_TREE, str(os.getpid()), str(float(grace_s)),
            str(LEFT_ALONE_S), *argv]  # fmt: skip


def adopt_orphans() -> None:
    """Become the parent of every process under this one whose own parent ends first (a
    child subreaper): :func:`stop_trees` then reaps them at once. Otherwise they wait as
    zombies for an ancestor's reaping, and a warm server (:mod:`plumbing.warm`) holds
    their descriptors until then. Does nothing off Linux."""
    if not binds_children():
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(errno)}")


def stop_tree(pid: int, timeout_s: float = 8.0) -> None:
    """Stop process ``pid`` and every process under it (:func:`stop_trees`). For children
    that start children of their own in other sessions (a Prefect worker's flow runs, a
    server's uvicorn)."""
    stop_trees([pid], timeout_s)


def stop_trees(pids: Iterable[int], timeout_s: float = 8.0) -> None:
    """Stop processes ``pids`` and every process under them: SIGTERM to all, then SIGKILL
    to those still running after ``timeout_s``. A zombie has ended: one that is not this
    process's child (a grandchild whose parent ended first) is its subreaper's to reap,
    and waiting for it to vanish waited out both timeouts (8 s of every FLARE job's end,
    under :func:`tree_bound_command`'s subreaper)."""
    import psutil

    tree: list[psutil.Process] = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            top = psutil.Process(pid)
            tree += [top, *top.children(recursive=True)]
    for member in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.terminate()
    alive = _still_running(tree, timeout_s)
    for member in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    _still_running(alive, 5.0)
    psutil.wait_procs(tree, timeout=0)  # those adopted since (adopt_orphans), reaped


def _still_running(processes: list[Any], timeout_s: float) -> list[Any]:
    """Those of ``processes`` (psutil's) still running after at most ``timeout_s``, this
    process's own children among them reaped as they end."""
    import psutil

    def running(process: psutil.Process) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + timeout_s
    while True:
        psutil.wait_procs(processes, timeout=0)  # reaps the children that have ended
        left = [process for process in processes if running(process)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


# what runs `nohup cmd &` or a script's `(cmd &)`: a parent meant to exit before its command
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "tcsh", "csh", "busybox"})


def started_detached() -> bool:
    """Whether this process was started to outlive the shell that ran it: ``setsid`` (a
    session leader), or ``nohup`` (SIGHUP ignored) run by a shell.

    SIGHUP ignored alone does not say it: it is inherited by every descendant of a
    ``nohup``'d command, so a stage command that ``dvc repro`` runs inside ``nohup make
    test &`` has it too, while its parent is DVC, which it must end with (a killed
    ``dvc repro`` otherwise left its training job running to the end)."""
    if os.getsid(0) == os.getpid():
        return True
    hangup_ignored = signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    return hangup_ignored and _parent_name() in SHELLS


def _parent_name() -> str:
    """The command name of this process's parent ("" where it cannot be read)."""
    try:
        return Path(f"/proc/{os.getppid()}/comm").read_text().strip()
    except OSError:
        import psutil

        try:
            return psutil.Process(os.getppid()).name()
        except psutil.Error:
            return ""


def end_with_parent() -> None:
    """SIGTERM when the process that ran this one dies, so that a ``dvc repro`` killed
    outright takes its stage's command (and, through their own binding, that command's
    children) with it; not for a process started detached (:func:`started_detached`),
    whose parent is a shell meant to exit before it."""
    if not started_detached():
        die_with_parent(os.getppid(), signal.SIGTERM)


_interrupted = threading.Event()  # set by the first SIGINT that interruptible()'s handler took


def _interrupt(number: int, frame: object) -> None:
    _interrupted.set()
    raise KeyboardInterrupt


_INTERRUPT_AGAIN_AFTER_S = 0.01


def _interrupt_main_thread_again() -> None:
    time.sleep(_INTERRUPT_AGAIN_AFTER_S)  # the main thread is past the hook by then
    with contextlib.suppress(OSError, ValueError):  # it has ended meanwhile
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


def _raise_dropped_interrupt_again(unraisable: Any) -> None:
    """``sys.unraisablehook`` while :func:`interruptible`: an interrupt whose
    ``KeyboardInterrupt`` Python could not pass on comes again, a moment later, to the main
    thread (sent from here, it would be raised in this hook, and dropped again); any other
    exception goes to the hook there was before."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _interrupted.is_set():
        threading.Thread(target=_interrupt_main_thread_again, daemon=True).start()
        return
    _hook_before(unraisable)


_hook_before = sys.unraisablehook


def interruptible() -> None:
    """Ctrl-C (SIGINT) raises ``KeyboardInterrupt`` even where it was inherited ignored (a
    background job of a script), so that the command stops with everything it started.

    Python runs a signal's handler between any two bytecodes of the main thread, a
    finaliser's (``__del__``) or a callback's from C code among them, and there it cannot
    pass the exception on: it hands it to ``sys.unraisablehook`` ("Exception ignored in")
    and goes on. Such an interrupt comes again to the main thread, so that its
    ``KeyboardInterrupt`` is raised where the program is next (a blocking call it waits in
    interrupted), until one is raised where it propagates; and the handler records that it
    came (:func:`interrupted`), for a command to check where a job ends (an exception that
    a bare ``except:`` swallowed reaches no hook)."""
    global _hook_before
    if sys.unraisablehook is not _raise_dropped_interrupt_again:
        _hook_before = sys.unraisablehook
        sys.unraisablehook = _raise_dropped_interrupt_again
    signal.signal(signal.SIGINT, _interrupt)


def interrupted() -> bool:
    """Whether this process took a SIGINT through :func:`interruptible`'s handler, its
    ``KeyboardInterrupt`` raised or not: a command checks it where a job ends (a job its
    ranks, stopped by the same Ctrl-C, failed), so that an interrupt still stops it."""
    return _interrupted.is_set()


def stoppable_by_launcher() -> None:
    """For an MPI rank: SIGINT raises ``KeyboardInterrupt`` and SIGQUIT ends the process,
    whatever it inherited. A launcher stops the other ranks with them when one dies (MPICH's
    fork launcher: SIGINT, then SIGQUIT); a job started from a background job of a script
    inherits both ignored, and its ranks would busy-wait on their dead peer for ever."""
    interruptible()
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def start_command() -> None:
    """For a command's ``__main__``: its imports done (the collector back on where its
    package paused it: :mod:`plumbing.collector`), interruptible wherever it was started,
    and ended with the process that ran it unless started detached."""
    imports_done()
    interruptible()
    end_with_parent()


_watched_parent: int | None = None  # the parent the watch started with (one watch a process)


def exit_when_orphaned(status: int, why: str, poll_s: float = 0.25) -> None:
    """End this process with ``status`` at once (``os._exit``: as SIGKILL would, with no
    clean-up) when the process that started it dies, after writing ``why`` to standard
    error. For a process started by a program that cannot bind it (FLARE's participants
    start their job processes; a death signal fires when the *thread* that forked a child
    ends, and theirs need not live as long as it): FLARE's own watch stops a job process
    whose participant was killed through its run's whole end, seconds that grow with the
    machine's load. A thread polls the parent every ``poll_s``; once per process, the first
    call's ``status``; the parent counts as dead once this process has a new one (its
    orphans' subreaper, or init). A process forked from a warm server has the server for
    a parent: there its shim watches the starter instead (:mod:`plumbing.warm_shim`)."""
    global _watched_parent
    if _watched_parent is not None:
        return
    parent = _watched_parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        with contextlib.suppress(OSError, ValueError):
            print(f"{why} (process {parent}, which started this one, is gone)", file=sys.stderr,
                  flush=True)  # fmt: skip
        os._exit(status)

    threading.Thread(target=watch, name="exit-when-orphaned", daemon=True).start()
