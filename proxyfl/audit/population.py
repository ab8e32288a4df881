"""The patches a client's models are audited on: its members and its non-members.

Members are the patches a client trained on with their labels: its centre's training
split (Joint: every client centre's), less PrivateKT's held-out public share. Non-members
are the held-out test patches of the same centre(s): the same hospital, scanners and
staining, never another centre's. Both are read whole into memory as uint8 (N, S, S, 3).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from proxyfl.algorithms.privatekt.public_pool import held_out_rows, kept_rows
from proxyfl.config import TrainConfig
from wsi.store.reader import PatchSplitReader
from wsi.store.schema import store_path


class AuditInputError(ValueError):
    """An audit that cannot be made: a missing model or store, no held-out data."""


@dataclass(frozen=True)
class Population:
    """Members then non-members: ``images`` uint8 (N, S, S, 3), ``labels`` (N,),
    ``is_member`` (N,)."""

    centers: tuple[int, ...]
    images: np.ndarray
    labels: np.ndarray
    is_member: np.ndarray
    key: str = field(default="")  # equal keys, equal populations (reference models' cache)

    @property
    def n_members(self) -> int:
        return int(self.is_member.sum())

    @property
    def n_non_members(self) -> int:
        return int((~self.is_member).sum())


def read_rows(path: Path, split: str, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    try:
        reader = PatchSplitReader(path, split)
    except (OSError, KeyError, ValueError) as error:
        raise AuditInputError(f"{path}: cannot read its {split} split ({error})") from None
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


def member_rows(config: TrainConfig, center: int, n_train: int) -> np.ndarray | None:
    """The rows of ``center``'s training split its client trained on with labels
    (``None``: all of them)."""
    if config.algorithm == "PrivateKT" and config.public_pool == "share":
        return kept_rows(n_train, held_out_rows(n_train, config.public_share, config.seed,
                                                center))  # fmt: skip
    return None


def client_population(
    config: TrainConfig, data_dir: str | os.PathLike[str], centers: tuple[int, ...]
) -> Population:
    """The members and non-members of the client that trained on ``centers``' data."""
    images, labels, member = [], [], []
    for split in ("train", "test"):
        for center in centers:
            path = store_path(data_dir, center)
            if not path.is_file():
                raise AuditInputError(f"{path}: no store for centre {center}, whose client "
                                      f"is audited")  # fmt: skip
            rows = None
            if split == "train":
                n_train = len(PatchSplitReader(path, "train"))
                rows = member_rows(config, center, n_train)
            block, block_labels = read_rows(path, split, rows)
            images.append(block)
            labels.append(block_labels)
            member.append(np.full(len(block), split == "train"))
    population = Population(
        centers=tuple(centers),
        images=np.concatenate(images),
        labels=np.concatenate(labels),
        is_member=np.concatenate(member),
    )
    if population.n_non_members == 0:
        raise AuditInputError(
            f"centre(s) {list(centers)}: no held-out (test) patches, so there are no "
            f"non-members to audit against; rebuild the store with test_fraction > 0"
        )
    if population.n_members == 0:
        raise AuditInputError(f"centre(s) {list(centers)}: no training patches")
    digest = hashlib.sha256(population.labels.tobytes() + population.is_member.tobytes())
    digest.update(np.ascontiguousarray(population.images[:: max(1, len(population.images) // 64)]))
    return Population(population.centers, population.images, population.labels,
                      population.is_member, key=f"{centers}:{digest.hexdigest()[:16]}")  # fmt: skip
