"""The patches a client's models are audited on: its members and its non-members.

Members are the patches a client trained on with their labels: its centre's training
split (Joint: every client centre's), less PrivateKT's held-out public share. Non-members
are the held-out test patches of the same centre(s): the same hospital, scanners and
staining, never another centre's. Both are read whole into memory as uint8 (N, S, S, 3).
A :class:`Population` holds every training and test patch of its centres, so that the
runs of one audit share it and its reference models; :func:`member_mask` says which of
them one run's client trained on (PrivateKT's public share: neither member nor
non-member, as its labels were never used).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from plumbing.errors import PipelineError
from proxyfl.algorithms.privatekt.public_pool import held_out_rows
from proxyfl.config import TrainConfig
from wsi.store.reader import PatchSplitReader
from wsi.store.schema import store_path


class AuditInputError(PipelineError):
    """An audit that cannot be made: a missing model or store, no held-out data."""


@dataclass(frozen=True)
class Population:
    """The training then the test patches of ``centers``: ``images`` uint8 (N, S, S, 3),
    ``labels`` (N,), ``train_rows`` (N,): the row of the training split, -1 for a test
    patch."""

    centers: tuple[int, ...]
    images: np.ndarray
    labels: np.ndarray
    center_of: np.ndarray  # (N,) the centre of each patch
    train_rows: np.ndarray
    key: str = field(default="")  # equal keys, equal populations (reference models' cache)

    @property
    def in_training_split(self) -> np.ndarray:
        return self.train_rows >= 0


@dataclass(frozen=True)
class Membership:
    """Which patches of a population are one client's members and non-members."""

    members: np.ndarray  # (N,) bool
    non_members: np.ndarray  # (N,) bool


def read_rows(path: Path, split: str, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    try:
        reader = PatchSplitReader(path, split)
    except (OSError, KeyError, ValueError) as error:
        raise AuditInputError(path, f"cannot read its {split} split ({error})") from None
    try:
        labels = np.asarray(reader.labels, dtype=np.int64)
        if rows is None:
            rows = np.arange(len(reader))
        if len(rows) > len(reader) // 4:  # one read of the whole split is faster
            images = np.asarray(reader.images())[rows]
        else:
            images = reader.images(rows.tolist())
        return images, labels[rows]
    finally:
        reader.close()


def member_mask(config: TrainConfig, population: Population) -> Membership:
    """The members (training patches the client used with their labels) and non-members
    (the test patches) of ``population`` for a run of ``config``."""
    members = population.in_training_split.copy()
    if config.algorithm == "PrivateKT" and config.public_pool == "share":
        for center in population.centers:
            here = members & (population.center_of == center)
            n_train = int(here.sum())
            public = held_out_rows(n_train, config.public_share, config.seed, center)
            members[np.flatnonzero(here)[public]] = False
    return Membership(members=members, non_members=~population.in_training_split)


def client_population(data_dir: str | os.PathLike[str], centers: tuple[int, ...]) -> Population:
    """Every training and test patch of ``centers``' stores, training splits first."""
    images, labels, center_of, train_rows = [], [], [], []
    for split in ("train", "test"):
        for center in centers:
            path = store_path(data_dir, center)
            if not path.is_file():
                raise AuditInputError(path, f"no store for centre {center}, whose client "
                                      f"is audited")  # fmt: skip
            block, block_labels = read_rows(path, split, None)
            images.append(block)
            labels.append(block_labels)
            center_of.append(np.full(len(block), center))
            train_rows.append(np.arange(len(block)) if split == "train"
                              else np.full(len(block), -1))  # fmt: skip
    rows = np.concatenate(train_rows)
    if not (rows < 0).any():
        raise AuditInputError(
            f"centre(s) {list(centers)}",
            "no held-out (test) patches, so there are no "
            "non-members to audit against; rebuild the store with test_fraction > 0",
        )
    if not (rows >= 0).any():
        raise AuditInputError(f"centre(s) {list(centers)}", "no training patches")
    all_labels = np.concatenate(labels)
    all_images = np.concatenate(images)
    digest = hashlib.sha256(all_labels.tobytes() + rows.tobytes())
    digest.update(np.ascontiguousarray(all_images[:: max(1, len(all_images) // 64)]))
    return Population(centers=tuple(centers), images=all_images, labels=all_labels,
                      center_of=np.concatenate(center_of), train_rows=rows,
                      key=f"{centers}:{digest.hexdigest()[:16]}")  # fmt: skip
