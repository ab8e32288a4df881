"""The pipeline's checks before any work (:mod:`camelyon_proxyfl.preflight`), as a task."""

from __future__ import annotations

from prefect import task
from prefect.logging import get_run_logger

from camelyon_proxyfl.findings import LOG_LEVELS, Finding, raise_on_errors
from camelyon_proxyfl.params.whole import Params
from camelyon_proxyfl.preflight import preflight


@task(name="preflight checks")
def preflight_checks(params: Params, replace_runs: bool = False) -> list[Finding]:
    """Every finding, logged at its level; a :class:`PreflightFailed` listing the errors."""
    logger = get_run_logger()
    findings = preflight(params, replace_runs)
    for finding in findings:
        logger.log(LOG_LEVELS[finding.level], "%s: %s", finding.subject, finding.message)
    raise_on_errors(findings)
    return findings
