"""Pyramidal, tiled, JPEG BigTIFF slides that OpenSlide and tiffslide read."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import tifffile

from plumbing.atomic import atomic_path
from wsi.synth.config import (
    SYNTHETIC_MARKER,
    _max_levels,
    auto_level_count,
    level_dimensions,
)

_BIG_BUFFER_BYTES = 512 * 2**20


# --------------------------------------------------------------------------------------
# Pyramidal TIFF
# --------------------------------------------------------------------------------------


def halve(image: np.ndarray) -> np.ndarray:
    """2x2 block mean (rounded) of an (H, W, 3) uint8 image; odd last row/column dropped.

    ``(a + b + c + d + 2) >> 2`` in uint16, exact whatever the order of the sums: rows are
    summed first (whole contiguous rows), then column pairs one channel at a time (long
    strided runs, rather than runs of 3 values).
    """
    h, w = image.shape[0] // 2, image.shape[1] // 2
    rows = image[0 : 2 * h : 2, : 2 * w].astype(np.uint16)
    rows += image[1 : 2 * h : 2, : 2 * w]
    pairs = rows.reshape(h, w, 2, 3)
    total = np.empty((h, w, 3), dtype=np.uint16)
    for channel in range(3):
        np.add(pairs[:, :, 0, channel], pairs[:, :, 1, channel], out=total[:, :, channel])
    total += 2
    total >>= 2
    return total.astype(np.uint8)


def _tiles_of(image: np.ndarray, tile_size: int) -> Iterator[np.ndarray]:
    for y in range(0, image.shape[0], tile_size):
        for x in range(0, image.shape[1], tile_size):
            yield image[y : y + tile_size, x : x + tile_size]


def _image_buffer(shape: tuple[int, int, int], directory: Path) -> np.ndarray:
    """A uint8 array, memory-mapped beside the output when it would be large."""
    if math.prod(shape) <= _BIG_BUFFER_BYTES:
        return np.empty(shape, dtype=np.uint8)
    handle = directory / f".level-buffer.{os.getpid()}.partial"
    buffer = np.lib.format.open_memmap(handle, mode="w+", dtype=np.uint8, shape=shape)
    handle.unlink()  # the mapping stays valid; the file goes away with it
    return buffer


def write_pyramidal_tiff(
    path: str | os.PathLike[str],
    level0: np.ndarray | Iterable[np.ndarray],
    *,
    mpp: float,
    tile_size: int = 512,
    levels: int | None = None,
    shape: tuple[int, int] | None = None,
    description: str = f"Synthetic slide ({SYNTHETIC_MARKER})",
    jpeg_quality: int = 90,
) -> list[tuple[int, int]]:
    """Write a tiled, JPEG-compressed pyramidal BigTIFF that OpenSlide and tiffslide read.

    ``level0`` is an (H, W, 3) uint8 array, or an iterable of row bands of it, each
    ``tile_size`` rows tall (the last one may be shorter) and W wide, with
    ``shape=(H, W)`` given; bands are consumed as written, so level 0 is never whole in
    memory. Lower levels are 2x2 block means of the level above (level 1 is kept in
    memory, or memory-mapped when large). ``levels=None`` halves until the longer side is
    <= 512 px. Returns the (width, height) of every level. The file appears at ``path``
    only when complete.
    """
    path = Path(path)
    if tile_size < 16 or tile_size % 16:
        raise ValueError(f"tile_size must be a positive multiple of 16, not {tile_size}")
    if isinstance(level0, np.ndarray):
        if level0.ndim != 3 or level0.shape[2] != 3 or level0.dtype != np.uint8:
            raise ValueError(f"level 0 must be (H, W, 3) uint8, not {level0.shape} {level0.dtype}")
        height, width = level0.shape[:2]
        array = level0
        bands: Iterable[np.ndarray] = (
            array[y : y + tile_size] for y in range(0, height, tile_size)
        )
    else:
        if shape is None:
            raise ValueError("shape=(height, width) is required when level 0 comes in bands")
        height, width = shape
        bands = level0
    levels = auto_level_count(width, height) if levels is None else levels
    if not 1 <= levels <= _max_levels(width, height):
        raise ValueError(f"levels must be in 1..{_max_levels(width, height)} for this size")
    dims = level_dimensions(width, height, levels)
    level1 = _image_buffer((dims[1][1], dims[1][0], 3), path.parent) if levels > 1 else None

    def level0_tiles() -> Iterator[np.ndarray]:
        y = 0
        for band in bands:
            expected = (min(tile_size, height - y), width, 3)
            if band.shape != expected or band.dtype != np.uint8:
                raise ValueError(
                    f"band at row {y} is {band.shape} {band.dtype}, expected {expected} uint8"
                )
            if level1 is not None:
                half = halve(band)
                rows = min(half.shape[0], level1.shape[0] - y // 2)
                level1[y // 2 : y // 2 + rows] = half[:rows, : level1.shape[1]]
            yield from _tiles_of(band, tile_size)
            y += band.shape[0]
        if y != height:
            raise ValueError(f"level-0 bands cover {y} rows, expected {height}")

    def page_options(level: int) -> dict[str, object]:
        pixels_per_cm = 1e4 / (mpp * 2**level)
        options: dict[str, object] = {
            "dtype": np.uint8,
            "photometric": "rgb",
            "tile": (tile_size, tile_size),
            "compression": "jpeg",
            "compressionargs": {"level": jpeg_quality},
            "resolution": (pixels_per_cm, pixels_per_cm),
            "resolutionunit": "CENTIMETER",
            "subfiletype": 1 if level else 0,
            "metadata": None,
            "software": False,
            "maxworkers": 1,  # slides are the unit of parallelism
        }
        if level == 0:
            options["description"] = description
        return options

    with atomic_path(path) as temporary, tifffile.TiffWriter(temporary, bigtiff=True) as writer:
        writer.write(level0_tiles(), shape=(height, width, 3), **page_options(0))
        current = level1
        for level in range(1, levels):
            assert current is not None
            w, h = dims[level]
            current = current[:h, :w]
            writer.write(_tiles_of(current, tile_size), shape=(h, w, 3), **page_options(level))
            if level + 1 < levels:
                current = halve(current)
    return dims
