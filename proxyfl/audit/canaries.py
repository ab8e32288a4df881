"""Canaries for the one-run audit: which training patches are canaries, and which of them
a client trains on.

For each audited centre c, ``count`` rows of c's training split are drawn as canaries
(without replacement, from a generator seeded by the audit seed and c). Each canary i
gets a fair coin ``S_i ∈ {IN, OUT}``, independent of everything else (Steinke et al.
2023, §2): an IN canary is in c's training data for the canary run, an OUT canary is not.
With ``labels: flipped`` every canary carries another class than its stored one (IN ones
are trained on with it, and every canary is scored with it): a mislabelled patch is what
a model memorises most visibly, which gives the audit its power on a model without DP.
The rows that are not canaries are trained on as always.

The plan is recorded (``canaries.json``) before the run, read back by every rank
(:func:`training_rows`) and by the audit: the same seed gives the same plan.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

CANARY_FILE = "canaries.json"  # CANARY_DIR/canaries.json: the plan
CANARY_RUN_DIR = "run"  # CANARY_DIR/run: the canary run's run directory
CanaryLabels = Literal["flipped", "kept"]


class CanaryPlanError(ValueError):
    """A canary plan that cannot be drawn (a store missing, more canaries than patches)."""


@dataclass(frozen=True)
class CanarySet:
    """One centre's canaries: rows of its training split, coins, labels trained on."""

    rows: tuple[int, ...]
    included: tuple[bool, ...]  # the coins: True, trained on (IN)
    labels: tuple[int, ...]  # the label each canary is trained on (IN) and scored with


@dataclass(frozen=True)
class CanaryPlan:
    seed: int
    labels: CanaryLabels
    centers: Mapping[int, CanarySet]

    @classmethod
    def draw(
        cls,
        train_labels: Mapping[int, np.ndarray],
        count: int,
        n_classes: int,
        seed: int,
        labels: CanaryLabels = "flipped",
    ) -> CanaryPlan:
        """``count`` canaries in each centre's training split (``train_labels``: the
        stored labels of every row, per centre)."""
        sets = {}
        for center, stored in sorted(train_labels.items()):
            if count > len(stored):
                raise ValueError(f"centre {center}: {count} canaries asked for, its training "
                                 f"split has {len(stored)} patches")  # fmt: skip
            generator = np.random.default_rng([seed, center])
            rows = np.sort(generator.choice(len(stored), size=count, replace=False))
            included = generator.random(count) < 0.5
            given = stored[rows].astype(np.int64)
            if labels == "flipped":
                given = (given + 1 + generator.integers(0, n_classes - 1, size=count)) % n_classes
            sets[int(center)] = CanarySet(
                rows=tuple(int(r) for r in rows),
                included=tuple(bool(i) for i in included),
                labels=tuple(int(label) for label in given),
            )
        return cls(seed=seed, labels=labels, centers=sets)

    def to_json(self) -> str:
        content = {
            "seed": self.seed,
            "labels": self.labels,
            "centers": {str(center): {"rows": list(s.rows), "included": list(s.included),
                                      "labels": list(s.labels)}
                        for center, s in sorted(self.centers.items())},
        }  # fmt: skip
        return json.dumps(content, indent=1) + "\n"

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> CanaryPlan:
        try:
            content = json.loads(Path(path).read_text())
            sets = {int(center): CanarySet(tuple(s["rows"]), tuple(s["included"]),
                                           tuple(s["labels"]))
                    for center, s in content["centers"].items()}  # fmt: skip
            return cls(seed=int(content["seed"]), labels=content["labels"], centers=sets)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}: not a canary plan ({error})") from None

    def training_rows(
        self, center: int, stored_labels: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The rows of ``center``'s training split the canary run trains on (every
        non-canary row and the IN canaries, in order) and their labels (the canaries'
        from the plan)."""
        if center not in self.centers:
            return np.arange(len(stored_labels)), stored_labels.astype(np.int64)
        canaries = self.centers[center]
        if canaries.rows and max(canaries.rows) >= len(stored_labels):
            raise ValueError(f"centre {center}: canary row {max(canaries.rows)} is beyond its "
                             f"training split of {len(stored_labels)}")  # fmt: skip
        labels = stored_labels.astype(np.int64).copy()
        labels[list(canaries.rows)] = canaries.labels
        excluded = [r for r, inside in zip(canaries.rows, canaries.included, strict=True)
                    if not inside]  # fmt: skip
        rows = np.setdiff1d(np.arange(len(stored_labels)), excluded)
        return rows, labels[rows]
