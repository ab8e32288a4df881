"""A variable of this process's environment for the length of a block, and what it was
before afterwards: what this process's children started in the block inherit (a Prefect
API's address, a shared warm server's folder)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def environment_variable(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` inside the block; unset, or its earlier value, after."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
