"""What a check before any work finds: an error (the run would fail), a warning (something
will be left out) or a note (what was found, or what cannot be checked yet)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from plumbing.errors import PipelineError

Level = Literal["error", "warning", "note"]
LOG_LEVELS = {"error": logging.ERROR, "warning": logging.WARNING, "note": logging.INFO}


@dataclass(frozen=True)
class Finding:
    """One thing checked: how bad (``level``), about what (``subject``), and what."""

    level: Level
    subject: str
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.subject}: {self.message}"


@dataclass(frozen=True)
class CentreSize:
    """A centre's training and test sizes, and where they come from: ``plan`` (exact, from
    the cached candidates), ``store`` (exact, a store built with these parameters) or
    ``bound`` (``train`` is an upper bound, ``test`` unknown)."""

    train: int
    test: int | None
    source: Literal["plan", "store", "bound"]


class PreflightFailed(PipelineError):
    """Raised by a run whose checks found errors; the message lists them."""


def errors(findings: Sequence[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.level == "error"]


def raise_on_errors(findings: Sequence[Finding]) -> None:
    """:class:`PreflightFailed` listing the errors among ``findings``, if any."""
    failed = errors(findings)
    if failed:
        raise PreflightFailed(None, "; ".join(f"{f.subject}: {f.message}" for f in failed))
