"""A site's (and the server's) job process forked warm: :class:`WarmJobLauncher`,
:class:`WarmServerJobLauncher`.

FLARE starts a site's job process as a fresh interpreter
(``python -u -m nvflare.private.fed.app.client.worker_process ...``), which then imports
torch, Opacus and the trainer when its rank starts: ~4 s of CPU a site, the larger part of
what a FLARE job costs beyond mpiexec's on one machine. Where the site's environment names
a warm server (:mod:`plumbing.warm`, as :func:`~proxyfl.launch.job.run_job` starts one for
a job on this machine, and ``train.launcher: flare`` runs every site on this machine),
the job process is started as that server's shim instead, and forked from an interpreter
that imported them once for every site. It is the same program with the same argv,
environment, folder and descriptors; FLARE stops it through its shim, as mpiexec stops a
rank. Without a server it starts as FLARE starts it.

The server's job process (its controller's) is started so too where the server's
environment names a warm server: ``sites start`` runs one for a server, which imports
FLARE's server runtime and the controller once (~1.5 s of CPU a job otherwise).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from nvflare.app_common.job_launcher.client_process_launcher import ClientProcessJobLauncher
from nvflare.app_common.job_launcher.server_process_launcher import ServerProcessJobLauncher

from plumbing.warm import SOCKET_ENV, WarmRanks


class WarmJobLauncher(ClientProcessJobLauncher):
    """FLARE's process launcher for a site's jobs, forking them from the warm server the
    site's environment names, if any (module doc)."""

    def get_command(self, job_meta: Any, fl_ctx: Any) -> str:
        return warm_command(super().get_command(job_meta, fl_ctx))


class WarmServerJobLauncher(ServerProcessJobLauncher):
    """FLARE's process launcher for the server's jobs, forking them from the warm server
    the server's environment names, if any (module doc)."""

    def get_command(self, job_meta: Any, fl_ctx: Any) -> str:
        return warm_command(super().get_command(job_meta, fl_ctx))


def warm_command(command: str) -> str:
    """FLARE's job command as the shim of the warm server this process's environment
    names; as it is where none is named."""
    socket_path = os.environ.get(SOCKET_ENV)
    if not socket_path:
        return command
    return shlex.join(warm_program(shlex.split(command), Path(socket_path)))


def warm_program(argv: list[str], socket_path: Path) -> list[str]:
    """``python -u -m MODULE ...`` as the shim of the server at ``socket_path``: the server
    runs ``python -m MODULE ...`` (unbuffered output is the site's ``PYTHONUNBUFFERED``)."""
    unbuffered = [argv[0], *argv[2:]] if argv[1:2] == ["-u"] else argv
    return WarmRanks(socket_path).program(unbuffered)
