"""Where a store's content came from: the project's and the pixel libraries' versions, and
the source slides (stored as the JSON string attribute ``provenance``, sorted keys)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
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
