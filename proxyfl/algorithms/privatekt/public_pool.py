"""PrivateKT's unlabelled public pool: images of patch stores, never their labels.

Two pools (``--public-pool``):

- ``share`` (the paper's: a random 20 % of the training data with its labels dropped, the
  authors' ``partition_public_dataset``): a share ``--public-share`` of every client's
  training split, drawn by :func:`held_out_rows` from the row count alone. The clients no
  longer train on these rows (:func:`held_out_rows` gives each client the same rows, so it
  can leave them out of its own training data).
- ``center`` (a hospital's realistic pool): every patch of ``center_{public_center}.h5``,
  a centre that is no client, its train split then its test split.

A pool is a list of :class:`PoolPart` (a store's split and rows), indexed 0..N-1 part by
part. Each store is checked against the schema by :func:`wsi.store.reader.read_store_info`
with no split's metadata loaded (``splits=()``: labels, patients and slides stay unread);
images are read by row. Nothing here reads a ``labels`` dataset, so training cannot use
the pool's labels: the pool has none to give. A pool small enough (:data:`CACHE_BYTES`) is
read once and kept in memory: the server scores every item twice a round.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from proxyfl.engine.access import ACCESS_LOG, AccessLog
from proxyfl.rules import held_out_count
from wsi.store.reader import StoreInfo, read_store_info
from wsi.store.schema import SPLITS, StoreError, store_path

CACHE_BYTES = 1 << 30  # pools up to 1 GiB of uint8 pixels are held in memory


def held_out_rows(n: int, share: float, seed: int, center: int) -> np.ndarray:
    """The sorted rows of centre ``center``'s ``n``-row training split held out as public:
    the first ``int(share · n)`` of a permutation drawn from the run ``seed`` and the centre
    (no label involved)."""
    if not 0 < share < 1:
        raise ValueError(f"the public share must be in (0, 1), got {share}")
    entropy = [int(seed) % 2**32, int(center), *b"public-share"]
    order = np.random.default_rng(np.random.SeedSequence(entropy)).permutation(n)
    return np.sort(order[: held_out_count(n, share)]).astype(np.int64)


def kept_rows(n: int, held_out: np.ndarray) -> np.ndarray:
    """The rows of an ``n``-row split a client still trains on (sorted)."""
    keep = np.ones(n, dtype=bool)
    keep[held_out] = False
    return np.flatnonzero(keep).astype(np.int64)


def split_length(path: Path, split: str) -> int:
    """The number of patches of ``split`` in the store at ``path``, from its images' shape."""
    try:
        with h5py.File(path, "r") as h5:
            return int(h5[split]["images"].shape[0])
    except (OSError, KeyError) as error:
        raise StoreError(path, f"not a readable HDF5 patch store ({error})") from error


@dataclass(frozen=True)
class PoolPart:
    """Rows ``rows`` (sorted) of a store's ``split``."""

    path: Path
    split: str
    rows: np.ndarray

    def __len__(self) -> int:
        return len(self.rows)


class PublicPool:
    """Random access to the pool's images (uint8 (S, S, 3)), part after part."""

    def __init__(self, parts: Sequence[PoolPart], log: AccessLog = ACCESS_LOG) -> None:
        if not parts:
            raise ValueError("a public pool needs at least one part")
        self.parts = list(parts)
        infos = {part.path: read_store_info(part.path, splits=()) for part in self.parts}
        shapes = {(info.attrs.patch_size, info.attrs.n_classes) for info in infos.values()}
        if len(shapes) != 1:
            raise StoreError(self.parts[0].path, f"the pool's stores disagree: {sorted(shapes)}")
        self.info: StoreInfo = infos[self.parts[0].path]
        self._offsets = np.cumsum([0, *(len(part) for part in self.parts)])
        self._files: dict[Path, h5py.File] = {}
        self._pid: int | None = None
        self._cache: np.ndarray | None = None
        for part in self.parts:
            log.record(part.path, part.split, images_only=True)

    @classmethod
    def of_center(
        cls, directory: str | os.PathLike[str], center: int, log: AccessLog = ACCESS_LOG
    ) -> PublicPool:
        """Every patch of centre ``center``'s store, train split then test split."""
        path = store_path(directory, center)
        read_store_info(path, splits=(), center=center)  # the schema first: a clear error
        parts = [PoolPart(path, split, np.arange(split_length(path, split), dtype=np.int64))
                 for split in SPLITS]  # fmt: skip
        return cls(parts, log)

    @classmethod
    def held_out_shares(
        cls,
        directory: str | os.PathLike[str],
        centers: Sequence[int],
        share: float,
        seed: int,
        log: AccessLog = ACCESS_LOG,
    ) -> PublicPool:
        """The share ``share`` of each of ``centers``' training splits
        (:func:`held_out_rows` of the run ``seed``), centre by centre."""
        parts = []
        for center in centers:
            path = store_path(directory, center)
            read_store_info(path, splits=(), center=center)
            rows = held_out_rows(split_length(path, "train"), share, seed, center)
            parts.append(PoolPart(path, "train", rows))
        return cls(parts, log)

    @property
    def patch_size(self) -> int:
        return self.info.attrs.patch_size

    @property
    def n_classes(self) -> int:
        return self.info.attrs.n_classes

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def _dataset(self, part: PoolPart) -> h5py.Dataset:
        if self._pid != os.getpid():  # a forked process opens its own handles
            self._files, self._pid, self._cache = {}, os.getpid(), None
        if part.path not in self._files:
            self._files[part.path] = h5py.File(part.path, "r")
        return self._files[part.path][part.split]["images"]

    def _read_all(self) -> np.ndarray:
        return np.concatenate([self._dataset(part)[part.rows] if len(part) else
                               np.empty((0, *self.info.image_shape), np.uint8)
                               for part in self.parts])  # fmt: skip

    def images(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The patches at pool ``indices``, in that order: uint8 (n, S, S, 3)."""
        order = np.asarray(indices, dtype=np.int64).reshape(-1)
        bad = order[(order < 0) | (order >= len(self))]
        if bad.size:
            raise IndexError(f"public item {int(bad[0])} out of range for {len(self)} items")
        if len(self) * int(np.prod(self.info.image_shape)) <= CACHE_BYTES:
            if self._cache is None or self._pid != os.getpid():
                self._cache = self._read_all()
            return self._cache[order]
        out = np.empty((order.size, *self.info.image_shape), dtype=np.uint8)
        for slot, index in enumerate(order):
            number = int(np.searchsorted(self._offsets, index, side="right") - 1)
            part = self.parts[number]
            row = int(part.rows[index - self._offsets[number]])
            self._dataset(part).read_direct(out, np.s_[row : row + 1], np.s_[slot : slot + 1])
        return out

    def close(self) -> None:
        if self._pid == os.getpid():
            for file in self._files.values():
                file.close()
        self._files, self._cache = {}, None
