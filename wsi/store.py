"""The HDF5 patch store: the one definition of its schema, its writer and its reader.

One file per centre (``center_{c}.h5``)::

    attrs: schema_version, center, patch_size, level, mpp, n_classes, params_hash,
           provenance (schema 2: a JSON string, see :class:`Provenance`)
    /train, /test   groups whose datasets are aligned along N:
        images    (N, S, S, 3) uint8, chunked one patch per chunk, uncompressed
        labels    (N,) int64, 0 = healthy, 1 = tumour (or any 0..n_classes-1)
        patients  (N,) UTF-8 strings
        slides    (N,) UTF-8 strings
        coords    (N, 2) int64, level-0 (x, y) of the patch's top-left corner

Uncompressed one-patch chunks: lossless compression costs 10-40x write speed for 5-20 % of
size on H&E patches, and single-patch chunks read at ~1000 patches/s cold.

The writer fills a temporary file beside the target and commits it into place
(:func:`plumbing.atomic.commit`) only when every split is complete, so a crash never
leaves a store that looks whole.
It checks the free space first (:func:`store_bytes_needed`), and a disk that fills up
anyway ends in one :class:`StoreError` with the temporary removed (see
:class:`PatchStoreWriter`). The same inputs give the same bytes: no timestamps are
recorded (h5py's ``track_times`` is off), and the provenance is serialised with sorted keys.
The reader opens the file lazily per process, so it can be handed to DataLoader workers;
it reads schema 1 stores too (they only lack the provenance).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType

import h5py
import numpy as np

from plumbing.atomic import commit, remove_stale_temporaries, temporary_path
from plumbing.errors import PipelineError
from plumbing.versions import distribution_version, library_versions

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS: tuple[int, ...] = (1, 2)
"""Version 1 is version 2 without the ``provenance`` attribute."""
SPLITS: tuple[str, ...] = ("train", "test")
FIELDS: tuple[str, ...] = ("images", "labels", "patients", "slides", "coords")
REQUIRED_ATTRS: tuple[str, ...] = (
    "schema_version",
    "center",
    "patch_size",
    "level",
    "mpp",
    "n_classes",
    "params_hash",
)
_STR = h5py.string_dtype(encoding="utf-8")


class StoreError(PipelineError):
    """A patch store is missing, unreadable or does not follow the schema."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(Path(path), reason)


def store_path(directory: str | os.PathLike[str], center: int) -> Path:
    """Where centre ``center``'s store lives inside ``directory``."""
    return Path(directory) / f"center_{center}.h5"


# --------------------------------------------------------------------------------------
# Provenance
# --------------------------------------------------------------------------------------

PROJECT = "camelyon-proxyfl"
PIXEL_AND_FILE_LIBRARIES: tuple[str, ...] = (
    "numpy",
    "h5py",
    "openslide-python",
    "openslide-bin",
    "tiffslide",
    "tifffile",
    "imagecodecs",
    "scikit-image",
)
"""Distributions whose versions decide a store's pixels (slide decoding, resizing) or its
file (HDF5 layout)."""


@dataclass(frozen=True)
class SourceFile:
    """A source slide as it was when the store was written: its file name, size in bytes
    and modification time in nanoseconds."""

    name: str
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> SourceFile:
        stat = Path(path).stat()
        return cls(name=Path(path).name, size=stat.st_size, mtime_ns=stat.st_mtime_ns)


def source_files(paths: Iterable[str | os.PathLike[str]]) -> tuple[SourceFile, ...]:
    """The :class:`SourceFile` of each path, sorted by name (duplicates once), ready for
    :attr:`StoreAttrs.sources`."""
    unique = {Path(path) for path in paths}
    return tuple(sorted((SourceFile.of(path) for path in unique), key=lambda f: f.name))


def project_version() -> str | None:
    """This project's installed version, ``None`` when it is run from a tree that is not
    installed."""
    return distribution_version(PROJECT)


def pixel_library_versions() -> dict[str, str | None]:
    """The installed version of each of :data:`PIXEL_AND_FILE_LIBRARIES` (``None`` for one
    that is not installed), plus the HDF5 C library's under ``"libhdf5"``."""
    return {**library_versions(PIXEL_AND_FILE_LIBRARIES), "libhdf5": h5py.version.hdf5_version}


@dataclass(frozen=True)
class Provenance:
    """Where a store's content came from: the project's and libraries' versions, and the
    source slides. Stored as the JSON string attribute ``provenance``."""

    project_version: str | None
    libraries: Mapping[str, str | None]
    sources: tuple[SourceFile, ...]

    @classmethod
    def current(cls, sources: Sequence[SourceFile] = ()) -> Provenance:
        """This process's versions, with ``sources``."""
        return cls(project_version(), pixel_library_versions(), tuple(sources))

    def to_json(self) -> str:
        """Compact JSON with sorted keys: the same provenance always gives the same bytes."""
        content = {
            "project": {"name": PROJECT, "version": self.project_version},
            "libraries": dict(self.libraries),
            "sources": [asdict(source) for source in self.sources],
        }
        return json.dumps(content, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Provenance:
        """Parse :meth:`to_json`'s output; raises ``ValueError`` (or ``KeyError``,
        ``TypeError``) for anything else."""
        content = json.loads(text)
        return cls(
            project_version=content["project"]["version"],
            libraries=dict(content["libraries"]),
            sources=tuple(
                SourceFile(str(s["name"]), int(s["size"]), int(s["mtime_ns"]))
                for s in content["sources"]
            ),
        )


# --------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreAttrs:
    """File-level attributes of a store.

    ``sources`` are the slides the patches come from (:func:`source_files`); the writer
    records them in the store's provenance with the versions of this process.
    """

    center: int
    patch_size: int
    level: int
    mpp: float
    n_classes: int
    params_hash: str
    schema_version: int = SCHEMA_VERSION
    sources: tuple[SourceFile, ...] = ()

    def scalars(self) -> dict[str, int | float | str]:
        """The attributes stored one HDF5 attribute each (``sources`` go in provenance)."""
        return {
            "schema_version": self.schema_version,
            "center": self.center,
            "patch_size": self.patch_size,
            "level": self.level,
            "mpp": self.mpp,
            "n_classes": self.n_classes,
            "params_hash": self.params_hash,
        }


@dataclass
class PatchBatch:
    """Aligned arrays for a run of patches of one split."""

    images: np.ndarray
    labels: np.ndarray
    patients: Sequence[str]
    slides: Sequence[str]
    coords: np.ndarray

    def __post_init__(self) -> None:
        self.images = np.asarray(self.images, dtype=np.uint8)
        self.labels = np.asarray(self.labels, dtype=np.int64)
        self.coords = np.asarray(self.coords, dtype=np.int64).reshape(-1, 2)
        n = len(self.images)
        lengths = {len(self.labels), len(self.patients), len(self.slides), len(self.coords)}
        if lengths != {n}:
            raise ValueError(f"patch batch fields have different lengths: {lengths | {n}}")
        if self.images.ndim != 4 or self.images.shape[-1] != 3:
            raise ValueError(f"images must be (N, S, S, 3), got {self.images.shape}")

    def __len__(self) -> int:
        return len(self.images)


STORE_FIXED_OVERHEAD = 256 * 1024
"""Bytes a store needs besides its patches, whatever their number: superblock, groups,
object headers, attributes, provenance (measured: about 20 KB with no source listed)."""

STORE_PER_PATCH_OVERHEAD = 512
"""Bytes per patch besides its pixels: label (8), coordinates (16), the chunk index entry
and two variable-length strings in the global heap (measured: 195-325 bytes with
Camelyon-style patient and slide names, ``patient_004`` and ``patient_004_node_4``)."""

DISK_FULL_ERRNOS: frozenset[int] = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

# HDF5's POSIX drivers describe a failed write as "..., errno = 28, error message = ...".
_HDF5_ERRNO = re.compile(r"\berrno = (\d+)")


def store_bytes_needed(split_sizes: Mapping[str, int], patch_size: int) -> int:
    """Upper bound of the size of a store of ``split_sizes`` patches of ``patch_size``:
    the pixels (N x S x S x 3) plus :data:`STORE_PER_PATCH_OVERHEAD` per patch and
    :data:`STORE_FIXED_OVERHEAD`."""
    n = sum(int(count) for count in split_sizes.values())
    return n * (patch_size * patch_size * 3 + STORE_PER_PATCH_OVERHEAD) + STORE_FIXED_OVERHEAD


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes free to this user on the filesystem that holds ``path`` (or would)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_free_space(path: str | os.PathLike[str], needed: int) -> None:
    """Raise :class:`StoreError` naming ``path``, the bytes needed and the bytes free when
    the filesystem that would hold ``path`` has fewer than ``needed`` bytes free."""
    free = free_bytes(path)
    if free < needed:
        raise StoreError(
            path, f"needs {needed:,} bytes but only {free:,} are free on its filesystem"
        )


def disk_full_errno(error: BaseException) -> int | None:
    """The errno of ``error`` if it says the disk (or quota, or file size limit) is full.

    Python's own I/O raises ``OSError`` with ``errno`` set. h5py raises ``OSError`` with
    ``errno`` parsed from HDF5's message for a failed write or flush ("Can't synchronously
    write data", "Driver write request failed"), but a ``RuntimeError`` (no errno, the
    HDF5 message inside) when the failure surfaces elsewhere, e.g. "Can't decrement id
    ref count": both are recognised, nothing else is.
    """
    if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
        return error.errno
    if isinstance(error, OSError | RuntimeError):
        for match in _HDF5_ERRNO.finditer(str(error)):
            if int(match[1]) in DISK_FULL_ERRNOS:
                return int(match[1])
    return None


# h5py files whose close failed. HDF5 (2.0, h5py 3.16) leaves such a file half closed, and
# closing it again, or garbage-collecting it, crashes the process (SIGSEGV): so they are
# kept here, never collected, and their descriptors are given up for the run's lifetime.
_UNCLOSABLE: list[h5py.File] = []


class PatchStoreWriter:
    """Write a store split by split, patch batch by patch batch, then publish it atomically.

    >>> with PatchStoreWriter(path, attrs, {"train": 100, "test": 20}) as writer:
    ...     writer.write("train", 0, batch)

    Every declared slot of every split must be written before the context exits; the
    file appears at ``path`` only then. On an exception the temporary file is removed
    and whatever store was at ``path`` before is left untouched.

    Entering removes the temporaries of ``path`` left by killed runs
    (:func:`plumbing.atomic.remove_stale_temporaries`), then raises :class:`StoreError`
    before creating anything when the filesystem has less free space than
    :func:`store_bytes_needed`. If the disk fills up all the same (another writer), the
    write, flush or close that fails with ENOSPC, EDQUOT or EFBIG ends in one
    :class:`StoreError` ("no space left on device", the bytes needed and free), chained
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
            group.create_dataset("patients", shape=(n,), dtype=_STR, track_times=False)
            group.create_dataset("slides", shape=(n,), dtype=_STR, track_times=False)
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
        group = self._file[split]
        group["images"][start:stop] = batch.images
        group["labels"][start:stop] = batch.labels
        group["patients"][start:stop] = list(batch.patients)
        group["slides"][start:stop] = list(batch.slides)
        group["coords"][start:stop] = batch.coords
        self._written[split][start:stop] = True

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
                log.error("%s: could not close %s (%s); its descriptor stays open",
                          self.path, self._tmp, " ".join(str(close_error).split()))
        self._tmp.unlink(missing_ok=True)

    def _raise_if_disk_full(self, error: BaseException) -> None:
        code = disk_full_errno(error)
        if code is None:
            return
        reason = (
            f"{os.strerror(code).lower()} writing the store: it needs {self.bytes_needed:,} "
            f"bytes, {free_bytes(self.path):,} are free"
        )
        raise StoreError(self.path, reason) from error


def write_patch_store(
    path: str | os.PathLike[str], attrs: StoreAttrs, splits: Mapping[str, PatchBatch]
) -> None:
    """Write a whole store from in-memory batches (small stores, tests, other datasets)."""
    with PatchStoreWriter(path, attrs, {name: len(batch) for name, batch in splits.items()}) as w:
        for name, batch in splits.items():
            w.write(name, 0, batch)


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


def rebuild_hint(center: int) -> str:
    """The commands that (re)build ``center``'s store, for an error about it."""
    return (f"`dvc repro preprocess@{center}` (or `python -m flows.preprocess --centers "
            f"{center}`) rebuilds it")  # fmt: skip


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
    path: str | os.PathLike[str], splits: Sequence[str] = SPLITS
) -> StoreInfo:
    """Open ``path``, check it against the schema and return the metadata of ``splits``.

    Every split's structure is checked (shapes only); labels, patients, slides and
    coordinates are read for ``splits`` alone, so a client can check another centre's
    store without reading anything of its training split.
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
            attrs = StoreAttrs(
                center=int(h5.attrs["center"]),
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
    except StoreError:
        raise
    except (OSError, KeyError, ValueError) as error:
        raise StoreError(path, f"not a readable HDF5 patch store ({error})") from error
    return StoreInfo(path=path, attrs=attrs, splits=loaded, provenance=provenance)


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
