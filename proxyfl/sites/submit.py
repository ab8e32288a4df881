"""One training job submitted to a running federation (``camelyon-proxyfl sites submit``).

The server and a site per centre were each started from its own kit at its own place
(``camelyon-proxyfl sites start KIT``); the administrator's kit submits a job to them:

1. an admin session to the server the kit names (mutual TLS, the administrator's
   certificate), and a wait (at most ``connect_timeout_s``) until every site of the job
   has joined; one that has not is named (:data:`~proxyfl.launch.flare.EXIT_NO_CONNECTION`);
2. the job: :class:`~proxyfl.sites.controller.RunController` and
   :class:`~proxyfl.sites.executor.RankExecutor` by class path, the run's configuration as
   JSON and its name (``ALGORITHM/seed_S``); no code, no path of this machine. Each site
   validates the configuration again and trains its rank with its own store, in its own
   runs folder (:mod:`proxyfl.sites.federation`);
3. its status followed, each change said; a site of the job that leaves the federation
   mid-run ends it (:data:`~proxyfl.launch.flare.EXIT_SITE_LOST`, the site named);
4. once it has ended, its result downloaded from the server: the outcome and the files
   the sites sent back (:func:`~proxyfl.sites.federation.results_that_leave`: metrics, ε,
   every rank's record and send log), written into the local ``RUN_DIR``. The models, the
   predictions and the checkpoints stay at the sites.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxyfl.config import TrainConfig
from proxyfl.engine.validation import EXIT_BAD_INPUT
from proxyfl.launch.flare import (
    EXIT_NO_CONNECTION,
    EXIT_SITE_LOST,
    FlareJobError,
    admin_session,
    site_names,
    write_job,
)
from proxyfl.sites.controller import OUTCOME_FILE, RESULTS_FOLDER
from proxyfl.sites.federation import carried_graph, checked_run_name, write_results

logger = logging.getLogger(__name__)

POLL_S = 1.0
COMPLETED = "FINISHED:COMPLETED"  # FLARE's status of a job whose workflow ended itself
# how long the server may take to archive an ended job's result for download
RESULT_TIMEOUT_S = 60.0
# the run directory's folder of what FLARE gave back (in .dvcignore's flare/, as the local
# launcher's)
FLARE_FOLDER = "flare"


@dataclass(frozen=True)
class FederationOutcome:
    """How a federation's job ended: its status (0, or the first failed rank's), each
    site's, the one line of a site whose rank could not start, the rank whose failure
    ended the job, and the files written into the run directory."""

    status: int
    sites: dict[str, int | None]
    errors: dict[str, str]
    aborted_by_rank: int | None
    files: list[str]


@contextlib.contextmanager
def federation_session(admin_kit: Path, connect_timeout_s: float) -> Iterator[Any]:
    """An admin session with ``admin_kit`` to its server, for one or more
    :func:`submit_run`; a :class:`~proxyfl.launch.flare.FlareJobError` where it cannot
    connect within ``connect_timeout_s``."""
    with contextlib.ExitStack() as stack:
        try:
            session = stack.enter_context(admin_session(admin_kit, connect_timeout_s))
        except Exception as error:  # FLARE's own: no connection, a refused certificate
            raise FlareJobError(f"the administrator's kit {admin_kit.resolve()} could not connect "
                                f"to its FLARE server: {error}",
                                EXIT_NO_CONNECTION) from error  # fmt: skip
        yield session


def submit_run(
    session: Any, config: TrainConfig, run_name: str, connect_timeout_s: float,
    on_status: Callable[[str], None] = logger.info, replace: bool = False,
) -> FederationOutcome:  # fmt: skip
    """Run ``config``'s job on the federation of ``session``
    (:func:`federation_session`; module doc), as ``run_name`` at every site; its outcome,
    its results in ``config.run_dir``. ``replace``: each site's run of that name is
    trained anew (else one of another configuration is refused, an unfinished one
    resumes). Raises :class:`~proxyfl.launch.flare.FlareJobError`."""
    refusal = federation_refusal(config)
    if refusal is not None:
        raise FlareJobError(refusal, EXIT_BAD_INPUT)
    _, run_dir = config.require_paths()
    sites = site_names(config.client_centers(config.job_ranks()), config.job_ranks())
    # an object, not JSON text: FLARE reads "{...}" in a job's strings as its own variables
    values = config.model_dump(mode="json", exclude={"data", "run_dir"})  # the sites' own
    run = {"sites": sites, "placement": [[0, 1]] * len(sites), "config": values,
           "run_name": checked_run_name(run_name), "replace": replace}  # fmt: skip
    graph = carried_graph(config)  # a file: graph's matrices: no site reads a path of ours
    if graph is not None:
        run["graph"] = graph
    workspace = run_dir / FLARE_FOLDER
    _wait_for_sites(session, sites, connect_timeout_s)
    job = write_job(workspace / "job", f"proxyfl-{run_name.replace('/', '-')}", run)
    job_id = session.submit_job(str(job.resolve()))
    on_status(f"{run_name}: job {job_id} submitted to sites {', '.join(sites)}")
    try:
        ended = _follow(session, job_id, sites, connect_timeout_s, on_status)
    except BaseException:
        with contextlib.suppress(Exception):
            session.abort_job(job_id)
        raise
    outcome_file = _download(session, job_id, workspace / "result", ended)
    outcome = json.loads(outcome_file.read_text())
    sent_back = outcome_file.parent / RESULTS_FOLDER
    results = {str(path.relative_to(sent_back)): path.read_bytes()
               for path in sorted(sent_back.rglob("*")) if path.is_file()}  # fmt: skip
    files = write_results(run_dir, results)
    (workspace / OUTCOME_FILE).write_text(outcome_file.read_text())
    return FederationOutcome(int(outcome["status"]), outcome["sites"], outcome.get("errors", {}),
                             outcome.get("aborted_by_rank"), files)  # fmt: skip


def federation_refusal(config: TrainConfig) -> str | None:
    """Why ``config``'s job cannot run across hospitals, or ``None``: Joint pools every
    centre's patches in one place, and PrivateKT's ``public_pool: share`` takes its pool
    from every client's training split, which no other site holds (a public centre's
    store, ``public_pool: center``, is the federated form)."""
    if config.algorithm == "Joint":
        return ("Joint pools every centre's patches in one place: it has no federated form "
                "(run it where the data may be pooled)")  # fmt: skip
    if config.algorithm == "PrivateKT" and config.public_pool == "share":
        return ("PrivateKT with train.options.public_pool: share takes its public pool from "
                "every client's training split, which no other site holds: give every site "
                "a public centre's store (public_pool: center, public_center: C)")  # fmt: skip
    return None


def _connected(session: Any) -> set[str]:
    return {client.name for client in session.get_connected_client_list()}


def _wait_for_sites(session: Any, sites: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while missing := [site for site in sites if site not in _connected(session)]:
        if time.monotonic() > deadline:
            raise FlareJobError(f"site(s) {', '.join(missing)} not joined to the FLARE server "
                                f"within {timeout_s:.0f} s: is each started (`camelyon-proxyfl "
                                "sites start KIT`) and its server's port open to it?",
                                EXIT_NO_CONNECTION)  # fmt: skip
        time.sleep(POLL_S)


def _follow(session: Any, job_id: str, sites: list[str], grace_s: float,
            on_status: Callable[[str], None]) -> str:  # fmt: skip
    """Until the job has ended: its final status. A site of the job missing from the
    server's sites for ``grace_s`` (its connection lost, or dropped after the server's
    heart-beat timeout) is an error naming it."""
    said, missing_since = "", {}
    while True:
        status = str(session.get_job_meta(job_id).get("status", ""))
        if status != said:
            on_status(f"job {job_id}: {status}")
            said = status
        if status.startswith("FINISHED"):
            return status
        connected, now = _connected(session), time.monotonic()
        for site in sites:
            if site in connected:
                missing_since.pop(site, None)
            elif now - missing_since.setdefault(site, now) > grace_s:
                raise FlareJobError(f"site {site} left the federation mid-run (not connected "
                                    f"for {grace_s:.0f} s)", EXIT_SITE_LOST)  # fmt: skip
        time.sleep(POLL_S)


def _download(session: Any, job_id: str, destination: Path, ended: str) -> Path:
    """The job's ``outcome.json`` among its downloaded result (the server archives an
    ended job's result folder, so a download may come before it is there). A job FLARE
    ended otherwise than completed (its configuration refused, a component that failed)
    may have none: then an error with its status."""
    deadline = time.monotonic() + (RESULT_TIMEOUT_S if ended == COMPLETED else 0.0)
    while True:
        shutil.rmtree(destination, ignore_errors=True)  # each download adds a folder
        with contextlib.suppress(Exception):  # not archived yet
            folder = session.download_job_result(job_id, destination=str(destination))
            found = sorted(Path(folder).rglob(OUTCOME_FILE)) if folder else []
            if found:
                return found[0]
        if time.monotonic() > deadline:
            raise FlareJobError(f"job {job_id} ended {ended} without an outcome: the FLARE "
                                "server's log says why", 1)  # fmt: skip
        time.sleep(POLL_S)
