"""A site's job process forked warm: :class:`WarmJobLauncher`.

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
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from nvflare.app_common.job_launcher.client_process_launcher import ClientProcessJobLauncher

from plumbing.warm import SOCKET_ENV, WarmRanks


class WarmJobLauncher(ClientProcessJobLauncher):
    """FLARE's process launcher for a site's jobs, forking them from the warm server the
    site's environment names, if any (module doc)."""

    def get_command(self, job_meta: Any, fl_ctx: Any) -> str:
        command = super().get_command(job_meta, fl_ctx)
        socket_path = os.environ.get(SOCKET_ENV)
        if not socket_path:
            return command
        return shlex.join(warm_program(shlex.split(command), Path(socket_path)))


def warm_program(argv: list[str], socket_path: Path) -> list[str]:
    """``python -u -m MODULE ...`` as the shim of the server at ``socket_path``: the server
    runs ``python -m MODULE ...`` (unbuffered output is the site's ``PYTHONUNBUFFERED``)."""
    unbuffered = [argv[0], *argv[2:]] if argv[1:2] == ["-u"] else argv
    return WarmRanks(socket_path).program(unbuffered)
