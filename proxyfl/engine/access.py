"""Which stores a process has opened: the access log each rank writes (torch-free).

Every split a process opens for training or evaluation is recorded as ``(path, split)``;
PrivateKT's public pool, which reads images and never labels, adds ``images_only``. The
run writes the log per rank (``ranks/rank_{k}.json``: ``opened``), so that anyone can
check that rank k opened no other centre's training split.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class AccessLog:
    """Which ``(store path, split)`` pairs this process has opened, in order."""

    opened: list[dict[str, Any]] = field(default_factory=list)

    def record(self, path: Path, split: str, images_only: bool = False) -> None:
        """Note an opened split; ``images_only`` marks a reader that never reads labels
        (PrivateKT's public pool, :mod:`proxyfl.algorithms.privatekt.public_pool`)."""
        entry: dict[str, Any] = {"path": str(Path(path).resolve()), "split": split}
        if images_only:
            entry["images_only"] = True
        if entry not in self.opened:
            self.opened.append(entry)


ACCESS_LOG = AccessLog()
