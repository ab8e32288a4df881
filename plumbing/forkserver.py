"""Pool workers forked from a fork server that has imported their modules once, started as
spawned workers are, and bound to the process that opened their pool (Linux).

**Start-up.** A spawned worker is a fresh interpreter that imports its task's modules
(Prefect, torch: 1-3 s of CPU a worker, often most of a small task's cost). A worker of
:func:`worker_context` forks from :mod:`multiprocessing`'s fork server instead: a
single-threaded process, one per process that opens pools, that imports ``preload`` once
and serves every later pool of that process. It starts as a spawned worker would, once
its initializer :func:`start_worker` has run: the starting process' working folder and
``sys.path`` (multiprocessing sends them), and the environment the pool was opened under
(the server's own, from its start, replaced).

**Lifetime.** A worker is bound to its parent, the fork server (:func:`start_worker`), and
the server to the process that started it: this module is the first the server imports,
and binds it there. The binding is needed: every worker holds the write end of the
server's "alive" pipe (so that it could start processes of its own), so the server does
not read end of file while they live, and they would outlive a starter killed outright.
The kernel sends the signal when the *thread* that started the server ends
(:mod:`plumbing.processes`): :func:`ensure_running` starts it from the calling thread, to
be called from one that lives as long as the pools (the flow's, not an executor's). A
server whose thread ended is started again by the next pool.

Where the platform has no fork server, :func:`worker_context` spawns.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import sys
from collections.abc import Mapping, Sequence

from plumbing.processes import die_with_parent

_FORK_SERVER_COMMAND = "from multiprocessing.forkserver import main"


def _is_fork_server() -> bool:
    return any(argument.startswith(_FORK_SERVER_COMMAND)
               for argument in getattr(sys, "orig_argv", sys.argv))  # fmt: skip


if _is_fork_server():  # imported by the server first (worker_context's preload)
    # the parent read before the binding: if it died first, this is not it and we exit
    die_with_parent(os.getppid())


def forks() -> bool:
    """Whether workers fork from a fork server here."""
    return "forkserver" in multiprocessing.get_all_start_methods()


def worker_context(preload: Sequence[str]) -> multiprocessing.context.BaseContext:
    """The context of a pool whose workers fork from the fork server with ``preload``
    imported; spawned where there is no fork server. The server is one per process: the
    first pool to start it decides what it imports (a module it lacks, a worker imports)."""
    if not forks():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, *preload])
    return context


def ensure_running() -> None:
    """Start the fork server from this thread, or find it running (see the module's
    docstring: the kernel binds it to this thread)."""
    if forks():
        multiprocessing.forkserver.ensure_running()


def start_worker(starter_pid: int, environment: Mapping[str, str]) -> None:
    """A worker's first step (the pool's initializer): bound to its parent, gone if the
    process that opened the pool is, and given the environment the pool was opened under.
    A spawned worker's parent is that process itself."""
    die_with_parent(os.getppid())
    try:
        os.kill(starter_pid, 0)
    except ProcessLookupError:  # it died before the binding: so did the server
        os._exit(1)
    os.environ.clear()
    os.environ.update(environment)
