"""The canary plan a run plants, shared by the library (:mod:`proxyfl.run` trains on it)
and the audit (:mod:`analysis.audit` writes it and scores it): which patches are canaries
for the one-run audit, and which of them a client trains on.

For each audited centre c there are ``count`` canaries, and each canary i gets a fair coin
``S_i ∈ {IN, OUT}`` drawn from a generator seeded by the audit seed and c, independent of
everything else (Steinke et al. 2023, §2): an IN canary is in c's training data for the
canary run, an OUT canary is not. Two kinds:

- ``noise`` (the default): patches of uniform random pixels, each with a random label,
  generated from the seed (the plan records how, not the pixels). Nothing in a centre's
  data predicts their labels, so a model can only get an IN canary right by memorising
  it: the most visible kind of canary ("input-space canaries"), which gives the audit its
  power on a model without DP. The centre's own patches are all trained on as always.
- ``flipped``: ``count`` rows of c's training split, each carrying another class than its
  stored one; IN rows are trained on with it, OUT rows are left out.

The plan is recorded (``canaries.json``) before the run, read back by every rank
(:meth:`CanaryPlan.training_data`) and by the audit (:meth:`CanaryPlan.patches`): the same
seed gives the same plan.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from plumbing.errors import PipelineError

CANARY_FILE = "canaries.json"  # CANARY_DIR/canaries.json: the plan
CANARY_RUN_DIR = "run"  # CANARY_DIR/run: the canary run's run directory
CanaryKind = Literal["noise", "flipped"]


class CanaryPlanError(PipelineError):
    """A canary plan that cannot be drawn (a store missing, more canaries than patches)."""


@dataclass(frozen=True)
class CanarySet:
    """One centre's canaries: their coins and labels, and for ``flipped`` their rows."""

    included: tuple[bool, ...]  # the coins: True, trained on (IN)
    labels: tuple[int, ...]  # the label each canary is trained on (IN) and scored with
    rows: tuple[int, ...] = ()  # flipped: rows of the centre's training split


@dataclass(frozen=True)
class TrainingData:
    """What a client of the canary run trains on from one centre: rows of its training
    split with their labels, then the IN noise canaries (uint8 (n, S, S, 3)) with theirs."""

    rows: np.ndarray
    labels: np.ndarray
    extra_images: np.ndarray | None = None
    extra_labels: np.ndarray | None = None


@dataclass(frozen=True)
class CanaryPlan:
    seed: int
    kind: CanaryKind
    patch_size: int
    centers: Mapping[int, CanarySet]

    @classmethod
    def draw(
        cls,
        train_labels: Mapping[int, np.ndarray],
        count: int,
        n_classes: int,
        patch_size: int,
        seed: int,
        kind: CanaryKind = "noise",
    ) -> CanaryPlan:
        """``count`` canaries for each centre (``train_labels``: the stored labels of every
        row of its training split)."""
        sets = {}
        for center, stored in sorted(train_labels.items()):
            generator = np.random.default_rng([seed, center])
            included = tuple(bool(i) for i in generator.random(count) < 0.5)
            if kind == "noise":
                labels = generator.integers(0, n_classes, size=count)
                sets[int(center)] = CanarySet(included, tuple(int(y) for y in labels))
                continue
            if count > len(stored):
                raise CanaryPlanError(f"centre {center}", f"{count} canaries asked for, its "
                                      f"training split has {len(stored)} patches")  # fmt: skip
            rows = np.sort(generator.choice(len(stored), size=count, replace=False))
            shift = 1 + generator.integers(0, n_classes - 1, size=count)
            labels = (stored[rows].astype(np.int64) + shift) % n_classes
            sets[int(center)] = CanarySet(
                included, tuple(int(y) for y in labels), tuple(int(r) for r in rows)
            )
        return cls(seed=seed, kind=kind, patch_size=patch_size, centers=sets)

    def to_json(self) -> str:
        centers = {
            str(center): {"included": list(s.included), "labels": list(s.labels),
                          **({"rows": list(s.rows)} if self.kind == "flipped" else {})}
            for center, s in sorted(self.centers.items())
        }  # fmt: skip
        content = {"seed": self.seed, "kind": self.kind, "patch_size": self.patch_size,
                   "noise": NOISE_RECIPE if self.kind == "noise" else None,
                   "centers": centers}  # fmt: skip
        return json.dumps(content, indent=1) + "\n"

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> CanaryPlan:
        try:
            content = json.loads(Path(path).read_text())
            sets = {int(center): CanarySet(tuple(s["included"]), tuple(s["labels"]),
                                           tuple(s.get("rows", ())))
                    for center, s in content["centers"].items()}  # fmt: skip
            kind = content["kind"]
            if kind not in ("noise", "flipped"):
                raise ValueError(f"unknown kind {kind!r}")
            return cls(seed=int(content["seed"]), kind=kind,
                       patch_size=int(content["patch_size"]), centers=sets)  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise CanaryPlanError(path, f"not a canary plan ({error})") from None

    def noise_images(self, center: int) -> np.ndarray:
        """``center``'s noise canaries: uint8 (count, S, S, 3), uniform on 0..255, from a
        generator seeded by (seed, centre, 1) (:data:`NOISE_RECIPE`)."""
        count, size = len(self.centers[center].included), self.patch_size
        generator = np.random.default_rng([self.seed, center, 1])
        return generator.integers(0, 256, size=(count, size, size, 3), dtype=np.uint8)

    def training_data(self, center: int, stored_labels: np.ndarray) -> TrainingData:
        """What the canary run trains on from ``center``: every row of its training split
        (flipped: less the OUT canaries, the IN ones relabelled), then its IN noise
        canaries."""
        stored = np.asarray(stored_labels).astype(np.int64)
        every = np.arange(len(stored))
        if center not in self.centers:
            return TrainingData(every, stored)
        canaries = self.centers[center]
        inside = np.asarray(canaries.included, dtype=bool)
        if self.kind == "noise":
            labels = np.asarray(canaries.labels, dtype=np.int64)
            return TrainingData(every, stored, self.noise_images(center)[inside], labels[inside])
        if canaries.rows and max(canaries.rows) >= len(stored):
            raise CanaryPlanError(f"centre {center}", f"canary row {max(canaries.rows)} is beyond "
                                  f"its training split of {len(stored)}")  # fmt: skip
        labels = stored.copy()
        labels[list(canaries.rows)] = canaries.labels
        excluded = np.asarray(canaries.rows)[~inside]
        rows = np.setdiff1d(every, excluded)
        return TrainingData(rows, labels[rows])


NOISE_RECIPE = (
    "numpy.random.default_rng([seed, centre, 1]).integers(0, 256, (count, patch_size, "
    "patch_size, 3), dtype=uint8)"
)
