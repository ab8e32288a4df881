"""Failing together: every rank learns every other rank's setup errors, then all exit.

Each setup phase runs on every rank without collectives inside; its outcome (an error
message or ``None``) is then shared with one ``allgather``, so no rank is ever left waiting
in a collective that a failed rank will not reach. If anyone failed, rank 0 prints every
message (prefixed with the failing rank) and all ranks exit with status 2.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from plumbing.errors import PipelineError

logger = logging.getLogger(__name__)
T = TypeVar("T")
EXIT_BAD_INPUT = 2


class SetupError(PipelineError):
    """Bad input found before training (the message is shown to the user as is)."""

    def __init__(self, reason: str) -> None:
        super().__init__(None, reason)


def run_phase(action: Callable[[], T]) -> tuple[T | None, str | None]:
    """Run ``action`` locally; ``(result, None)`` or ``(None, error message)``."""
    try:
        return action(), None
    except SystemExit:
        raise
    except Exception as error:  # any failure must reach the agreement, never hang a peer
        message = str(error) or type(error).__name__
        if not isinstance(error, PipelineError | ValueError | KeyError | OSError):
            logger.exception("unexpected error during setup")
            message = f"{type(error).__name__}: {message}"
        return None, message


def agree(comm: Any, error: str | None, label: Callable[[int], str] | None = None) -> list[str]:
    """All ranks' error messages (one ``allgather``), each prefixed with its rank."""
    errors = comm.allgather(error)
    unique: list[str] = []
    for rank, message in enumerate(errors):
        if message is None:
            continue
        prefix = label(rank) if label else f"rank {rank}"
        unique.append(f"{prefix}: {message}")
    return unique


def exit_together(comm: Any, messages: list[str], program: str = "proxyfl.run") -> NoReturn:
    """Rank 0 prints ``messages``; every rank exits with status 2."""
    if comm.Get_rank() == 0:
        for message in _deduplicate(messages):
            print(f"{program}: error: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    raise SystemExit(EXIT_BAD_INPUT)


def _deduplicate(messages: list[str]) -> list[str]:
    """Collapse identical messages reported by several ranks into one line."""
    by_text: dict[str, list[str]] = {}
    for message in messages:
        prefix, _, text = message.partition(": ")
        by_text.setdefault(text, []).append(prefix)
    lines = []
    for text, prefixes in by_text.items():
        if len(prefixes) > 1:
            ranks = ", ".join(p.removeprefix("rank ") for p in prefixes)
            lines.append(f"ranks {ranks}: {text}")
        else:
            lines.append(f"{prefixes[0]}: {text}")
    return lines


def check_or_exit(comm: Any, error: str | None, program: str = "proxyfl.run") -> None:
    """Agree on ``error`` across ranks and exit together if any rank has one."""
    messages = agree(comm, error)
    if messages:
        exit_together(comm, messages, program)
