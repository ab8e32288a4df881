"""The patch store's schema: its version, splits, fields and attributes, where a centre's
store lives, what a batch of patches is, and the one error a store raises."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from plumbing.errors import PipelineError
from wsi.store.provenance import SourceFile

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
UTF8_STRING = h5py.string_dtype(encoding="utf-8")


class StoreError(PipelineError):
    """A patch store is missing, unreadable or does not follow the schema."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(Path(path), reason)

    def with_rebuild_hint(self, center: int) -> StoreError:
        """This error, its reason followed by the commands that rebuild ``center``'s store
        (:func:`rebuild_hint`): for a reader that knows which centre's store it read."""
        return StoreError(self.path, f"{self.reason}; {rebuild_hint(center)}")


class StoreSpaceError(StoreError):
    """The filesystem has no room for a store (found before writing, or by a write): the
    machine's refusal (exit 3, :data:`plumbing.refusals.EXIT_REFUSED`), not the slides' or
    the parameters'."""


def store_path(directory: str | os.PathLike[str], center: int) -> Path:
    """Where centre ``center``'s store lives inside ``directory``."""
    return Path(directory) / f"center_{center}.h5"


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


def shared_patients(train: Iterable[str], test: Iterable[str], shown: int = 5) -> str | None:
    """What is wrong when patients are in both splits (the first ``shown`` of them, sorted),
    or ``None`` when the splits are patient-disjoint."""
    both = sorted(set(train) & set(test))
    if not both:
        return None
    more = f" and {len(both) - shown} more" if len(both) > shown else ""
    return (f"patient(s) {both[:shown]}{more} in both the train and the test split: the "
            "splits must be patient-disjoint")  # fmt: skip


def rebuild_hint(center: int) -> str:
    """The commands that (re)build ``center``'s store, for an error about it: DVC's stage
    exists only for a centre of ``preprocess.centers``, which the caller may not know."""
    return (f"`python -m flows.preprocess --centers {center}` (or `dvc repro "
            f"preprocess@{center}`, where {center} is one of preprocess.centers) "
            "rebuilds it")  # fmt: skip
