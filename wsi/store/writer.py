"""The store writer: split by split, batch by batch, into a temporary beside the target,
published whole (:func:`plumbing.atomic.commit`) only when every split is complete."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import h5py
import numpy as np

from plumbing.atomic import commit, remove_stale_temporaries, temporary_path
from wsi.store.provenance import Provenance
from wsi.store.schema import (
    SPLITS,
    UTF8_STRING,
    PatchBatch,
    StoreAttrs,
    StoreError,
    StoreSpaceError,
    shared_patients,
)
from wsi.store.space import check_free_space, disk_full_errno, free_bytes, store_bytes_needed

log = logging.getLogger(__name__)


# h5py files whose close failed. HDF5 (2.0, h5py 3.16) leaves such a file half closed, and
# closing it again, or garbage-collecting it, crashes the process (SIGSEGV): so they are
# kept here, never collected, and their descriptors are given up for the run's lifetime.
_UNCLOSABLE: list[h5py.File] = []


class PatchStoreWriter:
    """Write a store split by split, patch batch by patch batch, then publish it atomically.

    >>> with PatchStoreWriter(path, attrs, {"train": 100, "test": 20}) as writer:
    ...     writer.write("train", 0, batch)

    No patient may be in both splits: a batch of one split holding a patient of the
    other's is refused (:class:`StoreError`; a patient's patches on both sides would test
    the model on what it trained on). Every declared slot of every split must be written
    before the context exits; the file appears at ``path`` only then. On an exception
    the temporary file is removed and whatever store was at ``path`` before is left
    untouched.

    Entering removes the temporaries of ``path`` left by killed runs
    (:func:`plumbing.atomic.remove_stale_temporaries`), then raises :class:`StoreSpaceError`
    before creating anything when the filesystem has less free space than
    :func:`store_bytes_needed`. If the disk fills up all the same (another writer), the
    write, flush or close that fails with ENOSPC, EDQUOT or EFBIG ends in one
    :class:`StoreSpaceError` ("no space left on device", the bytes needed and free), chained
    from the HDF5 error, with the temporary removed.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        attrs: StoreAttrs,
        split_sizes: Mapping[str, int],
    ) -> None:
        unknown = set(split_sizes) - set(SPLITS)
        if unknown:
            raise ValueError(f"unknown split(s) {sorted(unknown)}; the schema has {SPLITS}")
        self.path = Path(path)
        self.attrs = attrs
        self.split_sizes = {split: int(split_sizes.get(split, 0)) for split in SPLITS}
        self.bytes_needed = store_bytes_needed(self.split_sizes, attrs.patch_size)
        self._tmp = temporary_path(self.path)
        self._file: h5py.File | None = None
        self._written = {split: np.zeros(n, dtype=bool) for split, n in self.split_sizes.items()}
        self._patients: dict[str, set[str]] = {split: set() for split in SPLITS}

    def __enter__(self) -> PatchStoreWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.path.parent, targets={self.path.name})
        check_free_space(self.path, self.bytes_needed)
        try:
            self._create()
        except BaseException as error:
            self._discard(error)
            self._raise_if_disk_full(error)
            raise
        return self

    def _create(self) -> None:
        # No chunk cache: each patch goes to the file as it is written, so a full disk
        # fails that write, not a flush of up to 8 MiB of cached chunks at close; writing
        # one-patch chunks once, a cache saves nothing (measured: same speed).
        self._file = h5py.File(self._tmp, "w", rdcc_nbytes=0)
        for key, value in self.attrs.scalars().items():
            self._file.attrs[key] = value
        self._file.attrs["provenance"] = Provenance.current(self.attrs.sources).to_json()
        size = self.attrs.patch_size
        for split, n in self.split_sizes.items():
            group = self._file.create_group(split)
            group.create_dataset(
                "images",
                shape=(n, size, size, 3),
                dtype=np.uint8,
                chunks=(1, size, size, 3) if n else None,  # HDF5 cannot chunk an empty axis
                track_times=False,
            )
            group.create_dataset("labels", shape=(n,), dtype=np.int64, track_times=False)
            group.create_dataset("patients", shape=(n,), dtype=UTF8_STRING, track_times=False)
            group.create_dataset("slides", shape=(n,), dtype=UTF8_STRING, track_times=False)
            group.create_dataset("coords", shape=(n, 2), dtype=np.int64, track_times=False)

    def write(self, split: str, start: int, batch: PatchBatch) -> None:
        """Write ``batch`` into slots ``start .. start + len(batch)`` of ``split``."""
        if self._file is None:
            raise RuntimeError("PatchStoreWriter.write called outside its context")
        stop = start + len(batch)
        if start < 0 or stop > self.split_sizes[split]:
            raise IndexError(
                f"slots {start}..{stop} outside split {split!r} of {self.split_sizes[split]}"
            )
        size = self.attrs.patch_size
        if batch.images.shape[1:] != (size, size, 3):
            raise ValueError(f"patches are {batch.images.shape[1:]}, store wants {size}x{size}")
        if len(batch) and (batch.labels.min() < 0 or batch.labels.max() >= self.attrs.n_classes):
            raise ValueError(f"labels outside 0..{self.attrs.n_classes - 1}")
        # the other split's patients so far: refused at the batch, not after the whole store
        other = next(name for name in SPLITS if name != split)
        shared = shared_patients(self._patients[other], batch.patients)
        if shared is not None:
            raise StoreError(self.path, shared)
        group = self._file[split]
        group["images"][start:stop] = batch.images
        group["labels"][start:stop] = batch.labels
        group["patients"][start:stop] = list(batch.patients)
        group["slides"][start:stop] = list(batch.slides)
        group["coords"][start:stop] = batch.coords
        self._written[split][start:stop] = True
        self._patients[split].update(batch.patients)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is not None:
            self._discard(exc)
            self._raise_if_disk_full(exc)
            return  # the exception propagates as it is
        missing = {split: int((~done).sum()) for split, done in self._written.items()}
        if any(missing.values()):
            self._discard(None)
            raise RuntimeError(f"{self.path}: store closed with unwritten slots {missing}")
        assert self._file is not None
        try:
            # Flush before closing: a flush that fails leaves the file open, so that it can
            # still be closed cleanly (a close that fails cannot be retried, see _discard).
            self._file.flush()
            self._file.close()
            self._file = None
            commit(self._tmp, self.path)  # fsync, rename, fsync the directory
        except BaseException as error:
            self._discard(error)
            self._raise_if_disk_full(error)
            raise

    def _discard(self, error: BaseException | None) -> None:
        """Close the temporary file (after ``error``, if any) and remove it."""
        file, self._file = self._file, None
        if file is not None:
            if error is not None and disk_full_errno(error) is not None:
                # Free the temporary's space first: closing flushes HDF5's dirty metadata,
                # which needs room on the full disk. The file is being discarded anyway.
                with contextlib.suppress(OSError):
                    os.truncate(self._tmp, 0)
                # HDF5 2.0 after a failed flush: closing fails ("slist already enabled?")
                # unless a flush is tried once more first, whatever that flush then says.
                with contextlib.suppress(Exception):
                    file.flush()
            try:
                file.close()
            except Exception as close_error:  # never retried: a second close crashes
                _UNCLOSABLE.append(file)
                log.error(
                    "%s: could not close %s (%s); its descriptor stays open",
                    self.path,
                    self._tmp,
                    " ".join(str(close_error).split()),
                )
        self._tmp.unlink(missing_ok=True)

    def _raise_if_disk_full(self, error: BaseException) -> None:
        code = disk_full_errno(error)
        if code is None:
            return
        reason = (
            f"{os.strerror(code).lower()} writing the store: it needs {self.bytes_needed:,} "
            f"bytes, {free_bytes(self.path):,} are free"
        )
        raise StoreSpaceError(self.path, reason) from error


def write_patch_store(
    path: str | os.PathLike[str], attrs: StoreAttrs, splits: Mapping[str, PatchBatch]
) -> None:
    """Write a whole store from in-memory batches (small stores, tests, other datasets)."""
    with PatchStoreWriter(path, attrs, {name: len(batch) for name, batch in splits.items()}) as w:
        for name, batch in splits.items():
            w.write(name, 0, batch)
