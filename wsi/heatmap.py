"""Tumour maps of whole slides: a model's probability of tumour for every tissue patch.

A slide's cells are the candidate grid of preprocessing (:func:`wsi.patches.
compute_candidates`): squares of ``patch_size`` pixels at ``level``, aligned to the slide's
origin (and so to its tiles), the same patches the models were trained on. The cells
whose tissue fraction is at least ``tissue_fraction_min`` are read in batches
(:func:`wsi.tiles.read_patches`: decoded tiles, aligned reads) and given to each
predictor; every other cell is NaN (not predicted). One read of the slide serves every
model: a centre's models (one per method) share the pixels.

Memory is bounded by the tissue mask (at ``mask_mpp``, band by band, as preprocessing)
and one batch of patches (``batch_size x patch_size^2 x 3`` bytes, 50 MiB for 64 patches
of 512 px) plus the model's activations: not by the slide's size.

A map is written as HDF5 (:func:`write_map`, atomic, no timestamps: the same map gives
the same bytes) with its SHA-256 recorded beside it (:mod:`plumbing.verified`), and read
back verified (:func:`read_map`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from plumbing.atomic import atomic_path
from plumbing.verified import DamagedFileError, record_digest, verify
from wsi.params import PatchParams
from wsi.slide import Backend, open_slide

log = logging.getLogger(__name__)

Predictor = Callable[[np.ndarray], np.ndarray]
"""uint8 ``(N, S, S, 3)`` RGB patches -> ``(N,)`` probabilities of tumour."""

MAP_FORMAT = 1


@dataclass(frozen=True)
class SlideCells:
    """A slide's grid of patch cells: where they are and how much tissue each holds."""

    slide_id: str
    coords: np.ndarray  # (rows * cols, 2) level-0 (x, y) of each cell, row by row
    tissue_fraction: np.ndarray  # (rows, cols)
    extent: int  # a cell's side in level-0 pixels
    cell_um: float  # a cell's side in µm
    short_side_um: float  # the slide's shorter side in µm: the node rule's section scale

    @property
    def shape(self) -> tuple[int, int]:
        return self.tissue_fraction.shape  # type: ignore[return-value]

    def tissue_cells(self, tissue_fraction_min: float) -> np.ndarray:
        """Flat indices of the cells with enough tissue to be predicted."""
        return np.flatnonzero(self.tissue_fraction.ravel() >= tissue_fraction_min)


@dataclass(frozen=True)
class TumourMap:
    """One model's map of one slide."""

    slide_id: str
    probability: np.ndarray  # float32 (rows, cols); NaN where not predicted
    tissue_fraction: np.ndarray  # float32 (rows, cols)
    cell_um: float
    extent: int
    model: str  # what predicted it: the model file's recorded digest (sha256:HEX)

    @property
    def predicted(self) -> int:
        """How many cells were predicted."""
        return int(np.count_nonzero(~np.isnan(self.probability)))


def slide_cells(
    slide_path: str | os.PathLike[str], params: PatchParams, backend: Backend = "auto"
) -> SlideCells:
    """The cells of the slide at ``slide_path`` (its tissue mask read band by band)."""
    from wsi.patches import compute_candidates

    with open_slide(slide_path, backend) as slide:
        candidates = compute_candidates(slide, None, None, params)
        width, height = slide.dimensions
        assert slide.mpp is not None  # compute_candidates refuses a slide without one
        cell_um = candidates.extent * slide.mpp
        short_side_um = min(width, height) * slide.mpp
    rows = (height - candidates.extent) // candidates.extent + 1
    cols = (width - candidates.extent) // candidates.extent + 1
    return SlideCells(
        slide_id=candidates.slide_id,
        coords=candidates.coords,
        tissue_fraction=candidates.tissue_fraction.reshape(rows, cols).astype(np.float32),
        extent=candidates.extent,
        cell_um=cell_um,
        short_side_um=short_side_um,
    )


def predict_cells(
    slide_path: str | os.PathLike[str],
    cells: SlideCells,
    params: PatchParams,
    predictors: Mapping[str, Predictor],
    *,
    batch_size: int,
    backend: Backend = "auto",
) -> dict[str, np.ndarray]:
    """Each predictor's float32 ``(rows, cols)`` map of the slide (NaN: no tissue), the
    tissue cells read ``batch_size`` at a time, once for all predictors."""
    from wsi.tiles import read_patches

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    inside = cells.tissue_cells(params.tissue_fraction_min)
    maps = {name: np.full(cells.shape, np.nan, dtype=np.float32) for name in predictors}
    started = time.perf_counter()
    for start in range(0, len(inside), batch_size):
        batch = inside[start : start + batch_size]
        patches = read_patches(slide_path, params.level, cells.coords[batch], params.patch_size,
                               backend=backend)  # fmt: skip
        for name, predict in predictors.items():
            probability = np.asarray(predict(patches), dtype=np.float32)
            if probability.shape != (len(batch),):
                raise ValueError(f"predictor {name!r} gave shape {probability.shape} "
                                 f"for {len(batch)} patches")  # fmt: skip
            maps[name].ravel()[batch] = probability
    seconds = time.perf_counter() - started
    log.info("%s: %d tissue cells of %d by %d model(s) in %.2f s", cells.slide_id, len(inside),
             cells.tissue_fraction.size, len(predictors), seconds)  # fmt: skip
    return maps


def write_map(path: str | os.PathLike[str], tumour_map: TumourMap) -> None:
    """``tumour_map`` as HDF5 at ``path`` (atomic, no timestamps), its digest beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as temporary, h5py.File(temporary, "w") as h5:
        h5.attrs["format"] = MAP_FORMAT
        h5.attrs["slide_id"] = tumour_map.slide_id
        h5.attrs["cell_um"] = tumour_map.cell_um
        h5.attrs["extent"] = tumour_map.extent
        h5.attrs["model"] = tumour_map.model
        for name in ("probability", "tissue_fraction"):
            h5.create_dataset(name, data=getattr(tumour_map, name).astype(np.float32),
                              track_times=False)  # fmt: skip
    record_digest(path)


def read_map(path: str | os.PathLike[str], repair: str) -> TumourMap:
    """The map at ``path``, verified against its recorded digest (``repair``: what to do
    when it does not verify, for the :class:`~plumbing.verified.DamagedFileError`)."""
    verify(path, repair)
    try:
        with h5py.File(path, "r") as h5:
            if h5.attrs.get("format") != MAP_FORMAT:
                raise DamagedFileError(path, f"not a tumour map of format {MAP_FORMAT}", repair)
            return TumourMap(
                slide_id=str(h5.attrs["slide_id"]),
                probability=h5["probability"][()],
                tissue_fraction=h5["tissue_fraction"][()],
                cell_um=float(h5.attrs["cell_um"]),
                extent=int(h5.attrs["extent"]),
                model=str(h5.attrs["model"]),
            )
    except (OSError, KeyError) as error:
        raise DamagedFileError(path, f"not a tumour map h5py can read ({error})", repair) from None
