"""The store reader: a store's validated attributes and per-split metadata without its
pixels (:func:`read_store_info`), and a split's patches, opened lazily per process so that
a reader can be handed to DataLoader workers (:class:`PatchSplitReader`)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from wsi.store.provenance import Provenance
from wsi.store.schema import (
    FIELDS,
    READABLE_SCHEMA_VERSIONS,
    REQUIRED_ATTRS,
    SPLITS,
    StoreAttrs,
    StoreError,
    shared_patients,
)


@dataclass(frozen=True)
class SplitInfo:
    """What a split holds, without its pixels."""

    labels: np.ndarray
    patients: tuple[str, ...]
    slides: tuple[str, ...]
    coords: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def label_counts(self, n_classes: int) -> list[int]:
        return np.bincount(self.labels, minlength=n_classes).tolist()


@dataclass(frozen=True)
class StoreInfo:
    """A validated store's attributes, provenance (``None`` in a schema 1 store) and
    per-split metadata."""

    path: Path
    attrs: StoreAttrs
    splits: dict[str, SplitInfo] = field(default_factory=dict)
    provenance: Provenance | None = None

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.attrs.patch_size, self.attrs.patch_size, 3)


def _decode(values: np.ndarray) -> tuple[str, ...]:
    return tuple(v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values)


def read_store_info(
    path: str | os.PathLike[str], splits: Sequence[str] = SPLITS, center: int | None = None
) -> StoreInfo:
    """Open ``path``, check it against the schema and return the metadata of ``splits``.

    Every split's structure is checked (shapes and types, from the datasets' headers);
    labels, patients, slides and coordinates are read for ``splits`` alone, so a client
    can check another centre's store without reading anything of its training split.
    When both splits are read, they must be patient-disjoint. With ``center``, the store
    must say it is that centre's (its ``center`` attribute): a store copied or renamed under
    another centre's name would train and be reported as that centre.
    Raises :class:`StoreError` naming the file and the first thing wrong with it.
    """
    unknown = set(splits) - set(SPLITS)
    if unknown:
        raise ValueError(f"unknown split(s) {sorted(unknown)}; the schema has {SPLITS}")
    path = Path(path)
    if not path.is_file():
        raise StoreError(path, "no such patch store")
    try:
        with h5py.File(path, "r") as h5:
            missing = [key for key in REQUIRED_ATTRS if key not in h5.attrs]
            if missing:
                raise StoreError(path, f"missing attribute(s) {missing}")
            version = int(h5.attrs["schema_version"])
            if version not in READABLE_SCHEMA_VERSIONS:
                raise StoreError(
                    path, f"schema_version {version}, expected one of {READABLE_SCHEMA_VERSIONS}"
                )
            provenance = _read_provenance(path, h5, version)
            held = int(h5.attrs["center"])
            if center is not None and held != center:
                raise StoreError(path, f"its attribute center is {held}: it holds centre "
                                       f"{held}'s patches, not centre {center}'s")  # fmt: skip
            attrs = StoreAttrs(
                center=held,
                patch_size=int(h5.attrs["patch_size"]),
                level=int(h5.attrs["level"]),
                mpp=float(h5.attrs["mpp"]),
                n_classes=int(h5.attrs["n_classes"]),
                params_hash=str(h5.attrs["params_hash"]),
                schema_version=version,
                sources=provenance.sources if provenance is not None else (),
            )
            loaded: dict[str, SplitInfo] = {}
            for split in SPLITS:
                if split not in h5:
                    raise StoreError(path, f"missing group /{split}")
                group = h5[split]
                absent = [name for name in FIELDS if name not in group]
                if absent:
                    raise StoreError(path, f"/{split} lacks dataset(s) {absent}")
                n = group["labels"].shape[0]
                shape = group["images"].shape
                if shape != (n, *([attrs.patch_size] * 2), 3):
                    raise StoreError(path, f"/{split}/images has shape {shape} for {n} labels")
                if any(group[name].shape[0] != n for name in FIELDS):
                    raise StoreError(path, f"/{split} datasets differ in length")
                problem = _type_problem(group)
                if problem is not None:
                    raise StoreError(path, f"/{split}/{problem}")
                if split not in splits:
                    continue
                labels = group["labels"][()].astype(np.int64)
                if n and (labels.min() < 0 or labels.max() >= attrs.n_classes):
                    raise StoreError(path, f"/{split}/labels outside 0..{attrs.n_classes - 1}")
                loaded[split] = SplitInfo(
                    labels=labels,
                    patients=_decode(group["patients"][()]),
                    slides=_decode(group["slides"][()]),
                    coords=group["coords"][()].astype(np.int64),
                )
        if set(SPLITS) <= set(loaded):
            problem = shared_patients(loaded["train"].patients, loaded["test"].patients)
            if problem is not None:
                raise StoreError(path, problem)
    except StoreError:
        raise
    except (OSError, KeyError, ValueError) as error:
        raise StoreError(path, f"not a readable HDF5 patch store ({error})") from error
    return StoreInfo(path=path, attrs=attrs, splits=loaded, provenance=provenance)


def _type_problem(group: h5py.Group) -> str | None:
    """What in a split's datasets is not of the schema's type (read from their headers), or
    ``None``: a float or 16-bit image would be cast to uint8 into noise or black, a float
    label truncated, without a word."""
    images, labels, coords = group["images"].dtype, group["labels"].dtype, group["coords"]
    if images != np.uint8:
        return f"images are {images}, the schema's are uint8"
    if labels.kind not in "iu":
        return f"labels are {labels}, the schema's are integers"
    if coords.ndim != 2 or coords.shape[1] != 2 or coords.dtype.kind not in "iu":
        shape = f"{coords.dtype} of shape {coords.shape}"
        return f"coords are {shape}, the schema's are (N, 2) integers"
    for name in ("patients", "slides"):
        if h5py.check_string_dtype(group[name].dtype) is None:
            return f"{name} are {group[name].dtype}, the schema's are strings"
    return None


def _read_provenance(path: Path, h5: h5py.File, version: int) -> Provenance | None:
    if version < 2:
        return None
    if "provenance" not in h5.attrs:
        raise StoreError(path, "missing attribute(s) ['provenance']")
    text = h5.attrs["provenance"]
    try:
        return Provenance.from_json(text.decode() if isinstance(text, bytes) else str(text))
    except (ValueError, KeyError, TypeError) as error:
        raise StoreError(path, f"provenance is not valid ({error!r})") from error


class PatchSplitReader:
    """Random access to one split's patches, safe to pass to forked DataLoader workers.

    The HDF5 handle is opened on first access in each process (never inherited across
    a fork), and labels are held in memory since every sampler needs them.
    """

    def __init__(self, path: str | os.PathLike[str], split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; the schema has {SPLITS}")
        self.info = read_store_info(path, splits=(split,))
        self.path = self.info.path
        self.split = split
        self.labels = self.info.splits[split].labels
        self._file: h5py.File | None = None
        self._pid: int | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def _images(self) -> h5py.Dataset:
        if self._file is None or self._pid != os.getpid():
            self._file = h5py.File(self.path, "r")
            self._pid = os.getpid()
        return self._file[self.split]["images"]

    def image(self, index: int) -> np.ndarray:
        """The (S, S, 3) uint8 patch at ``index``."""
        return self._images()[index]

    def images(self, indices: Sequence[int] | slice | None = None) -> np.ndarray:
        """Several patches at once, in the order asked (all of them by default)."""
        dataset = self._images()
        if indices is None:
            return dataset[()]
        if isinstance(indices, slice):
            return dataset[indices]
        order = np.asarray(indices, dtype=np.int64)
        if order.size == 0:
            return np.empty((0, *dataset.shape[1:]), dtype=np.uint8)
        # One hyperslab read per patch: h5py's fancy indexing (dataset[list]) builds a
        # point selection that reads ~500x slower than this loop over one-patch chunks.
        out = np.empty((order.size, *dataset.shape[1:]), dtype=dataset.dtype)
        for slot, index in enumerate(order):
            if not -len(dataset) <= index < len(dataset):
                raise IndexError(f"patch {index} out of range for {len(dataset)} patches")
            index = int(index) % len(dataset)
            dataset.read_direct(out, np.s_[index : index + 1], np.s_[slot : slot + 1])
        return out

    def __iter__(self) -> Iterator[tuple[np.ndarray, int]]:
        for index in range(len(self)):
            yield self.image(index), int(self.labels[index])

    def close(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_file"] = None
        state["_pid"] = None
        return state
