"""The state a "… up to date?" task ends in, so the UI tells what a run keeps and why."""

from __future__ import annotations

from prefect.client.schemas.objects import State
from prefect.logging import get_run_logger
from prefect.states import Completed


def freshness_state(artefact: str, reason: str | None, recorded: str, redo: str) -> State:
    """A Completed state named "Up to date" (data ``False``) when ``reason`` is ``None``,
    else "Stale" (data ``True``) with ``reason`` as its message; either said in the run's
    log: "ARTEFACT: up to date (RECORDED are those recorded beside it): kept", or
    "ARTEFACT: REDO: REASON"."""
    logger = get_run_logger()
    if reason is None:
        logger.info("%s: up to date (%s are those recorded beside it): kept", artefact, recorded)
        return Completed(name="Up to date", message="kept: its inputs are unchanged", data=False)
    logger.info("%s: %s: %s", artefact, redo, reason)
    return Completed(name="Stale", message=reason, data=True)
