"""PrivateKT's unlabelled public pool: the images of the public centre's store, never its labels.

The pool is every patch of ``center_{public_center}.h5`` (``--public-center``, default 4,
the Camelyon-17 centre that is no client), its train split then its test split, indexed
0..N-1 in that order. The store is checked against the schema by
:func:`wsi.store.reader.read_store_info` with no split's metadata loaded (``splits=()``: labels,
patients and slides stay unread), and images are then read one patch per chunk as
:class:`wsi.store.reader.PatchSplitReader` reads them. Nothing here reads a ``labels`` dataset,
so training cannot use the public centre's labels: the pool has none to give.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from proxyfl.engine.access import ACCESS_LOG, AccessLog
from wsi.store.reader import StoreInfo, read_store_info
from wsi.store.schema import SPLITS, StoreError, store_path


class PublicPool:
    """Random access to the public store's images (uint8 (S, S, 3)), both splits in turn."""

    def __init__(self, path: str | os.PathLike[str], log: AccessLog = ACCESS_LOG) -> None:
        self.path = Path(path)
        self.info: StoreInfo = read_store_info(self.path, splits=())  # no labels read
        try:
            with h5py.File(self.path, "r") as h5:
                self.split_sizes = tuple(int(h5[split]["images"].shape[0]) for split in SPLITS)
        except (OSError, KeyError) as error:
            raise StoreError(self.path, f"not a readable HDF5 patch store ({error})") from error
        self._offsets = np.cumsum([0, *self.split_sizes])
        self._file: h5py.File | None = None
        self._pid: int | None = None
        for split in SPLITS:
            log.record(self.path, split, images_only=True)

    @classmethod
    def of_center(cls, directory: str | os.PathLike[str], center: int) -> PublicPool:
        return cls(store_path(directory, center))

    @property
    def patch_size(self) -> int:
        return self.info.attrs.patch_size

    @property
    def n_classes(self) -> int:
        return self.info.attrs.n_classes

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def _dataset(self, part: int) -> h5py.Dataset:
        if self._file is None or self._pid != os.getpid():
            self._file = h5py.File(self.path, "r")
            self._pid = os.getpid()
        return self._file[SPLITS[part]]["images"]

    def images(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The patches at pool ``indices``, in that order: uint8 (n, S, S, 3)."""
        order = np.asarray(indices, dtype=np.int64).reshape(-1)
        size = self.patch_size
        out = np.empty((order.size, size, size, 3), dtype=np.uint8)
        for slot, index in enumerate(order):
            if not 0 <= index < len(self):
                raise IndexError(f"public item {index} out of range for {len(self)} items")
            part = int(np.searchsorted(self._offsets, index, side="right") - 1)
            local = int(index - self._offsets[part])
            self._dataset(part).read_direct(out, np.s_[local : local + 1], np.s_[slot : slot + 1])
        return out

    def close(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None
