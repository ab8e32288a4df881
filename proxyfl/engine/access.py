"""Which stores a process has opened: the access log each rank writes (torch-free).

Every split a process opens for training or evaluation is recorded as ``(path, split)``;
PrivateKT's public pool, which reads images and never labels, adds ``images_only``. The
run writes the log per rank (``ranks/rank_{k}.json``: ``opened``), so that anyone can
check that rank k opened no other centre's training split.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any


class AccessLog:
    """Which ``(store path, split)`` pairs this process has opened, in order: per hosted
    client where a rank hosts several (:mod:`proxyfl.hosted`), each client's thread
    declaring itself (:meth:`on_behalf_of`), so that a client's record lists its own."""

    def __init__(self) -> None:
        self._by_client: dict[int | None, list[dict[str, Any]]] = {}
        self._thread = threading.local()

    def on_behalf_of(self, client: int) -> None:
        """What this thread opens from now on, it opens for ``client``."""
        self._thread.client = client

    @property
    def opened(self) -> list[dict[str, Any]]:
        """What this thread's client (the process, where it hosts one) has opened."""
        return self._by_client.setdefault(getattr(self._thread, "client", None), [])

    def record(self, path: Path, split: str, images_only: bool = False) -> None:
        """Note an opened split; ``images_only`` marks a reader that never reads labels
        (PrivateKT's public pool, :mod:`proxyfl.algorithms.privatekt.public_pool`)."""
        entry: dict[str, Any] = {"path": str(Path(path).resolve()), "split": split}
        if images_only:
            entry["images_only"] = True
        if entry not in self.opened:
            self.opened.append(entry)


ACCESS_LOG = AccessLog()
