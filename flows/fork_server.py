"""Imported by the fork server of :mod:`flows.processes` (its first preloaded module): binds
the fork server to the process that started it.

The fork server's workers hold the write end of its "alive" pipe (every client does, so
that it can start processes of its own), so the server does not read end of file when the
process that started it dies while they live; and the workers, bound to their parent (the
server), do not die with it. Bound here, the server gets SIGKILL when its starter dies,
and its workers follow it. Does nothing in any process but a fork server.
"""

from __future__ import annotations

import os
import sys

from plumbing.processes import die_with_parent

_FORK_SERVER = "from multiprocessing.forkserver import main"

if any(argument.startswith(_FORK_SERVER) for argument in getattr(sys, "orig_argv", sys.argv)):
    # the parent read before the binding: if it died first, this is not it and we exit
    die_with_parent(os.getppid())
