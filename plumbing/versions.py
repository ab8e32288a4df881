"""Which versions of which libraries made a result: recorded beside every store and run."""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Iterable


def distribution_version(name: str) -> str | None:
    """The installed version of the distribution ``name`` (``None`` when not installed)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def library_versions(names: Iterable[str]) -> dict[str, str | None]:
    """The installed version of each distribution of ``names``, in order (``None`` for one
    that is not installed)."""
    return {name: distribution_version(name) for name in names}


def runtime_versions(names: Iterable[str]) -> dict[str, str | None]:
    """The interpreter's version (``python``), then :func:`library_versions` of ``names``:
    what a recorded result says it was computed with."""
    return {"python": sys.version.split()[0], **library_versions(names)}
