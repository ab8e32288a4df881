"""The one base class of the pipeline's errors: what is wrong (``subject``: a file, a slide,
a centre, a parameter) and why (``reason``), printed as ``subject: reason``.

Errors cross process boundaries (process pools, Dask workers, Prefect task results), so
they must pickle whatever their constructor's signature: :meth:`PipelineError.__reduce__`
rebuilds an error from its attributes, never by calling ``__init__`` again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

Subject = str | os.PathLike[str] | None


def describe(error: BaseException) -> str:
    """``"OSError: reason"``: an error from a library, as one line for a report."""
    text = " ".join(str(error).split()) or "no message"
    return f"{type(error).__name__}: {text}"


class PipelineError(Exception):
    """``subject: reason``; ``subject`` may be ``None`` when the reason says it all."""

    def __init__(self, subject: Subject, reason: str) -> None:
        self.subject = Path(subject) if isinstance(subject, os.PathLike) else subject
        self.reason = reason
        # the file concerned, when the subject is one
        self.path: Path | None = self.subject if isinstance(self.subject, Path) else None
        super().__init__(f"{subject}: {reason}" if subject is not None else reason)

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore, (type(self), self.args, self.__dict__)


def _restore(kind: type[PipelineError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    error = kind.__new__(kind)
    error.args = args
    error.__dict__.update(state)
    return error
