"""Where a store's content came from: the project's and the pixel libraries' versions, and
the source slides (stored as the JSON string attribute ``provenance``, sorted keys)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import h5py

from plumbing.versions import distribution_version, library_versions

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
    """A source slide by content: its file name, size in bytes and the SHA-256 of its
    bytes, so that the same slides give the same store on any machine and in any copy
    (a time would differ with every clone). ``mtime_ns`` is read from stores written
    before content digests (schema 2 stores of 2026-11 and earlier), where ``sha256`` is
    ``None``; neither is written when ``None``."""

    name: str
    size: int
    sha256: str | None = None
    mtime_ns: int | None = None

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> SourceFile:
        """``path`` by content: a full read of the file (SHA-256 runs at about 0.5 GB/s
        on one of our CI cores: 4 s for a 2 GB slide)."""
        with open(path, "rb") as handle:
            digest = hashlib.file_digest(handle, "sha256").hexdigest()
        return cls(name=Path(path).name, size=Path(path).stat().st_size, sha256=digest)

    def to_dict(self) -> dict[str, str | int]:
        return {key: value for key, value in asdict(self).items() if value is not None}


def source_files(
    paths: Iterable[str | os.PathLike[str]], threads: int = 4
) -> tuple[SourceFile, ...]:
    """The :class:`SourceFile` of each path, sorted by name (duplicates once), ready for
    :attr:`StoreAttrs.sources`; ``threads`` files are read at once (hashing releases the
    GIL, so this is I/O-bound)."""
    unique = sorted({Path(path) for path in paths})
    with ThreadPoolExecutor(max(1, min(threads, len(unique)))) as pool:
        return tuple(sorted(pool.map(SourceFile.of, unique), key=lambda f: f.name))


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
            "sources": [source.to_dict() for source in self.sources],
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
                SourceFile(
                    str(s["name"]),
                    int(s["size"]),
                    str(s["sha256"]) if "sha256" in s else None,
                    int(s["mtime_ns"]) if "mtime_ns" in s else None,
                )
                for s in content["sources"]
            ),
        )


# --------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------
