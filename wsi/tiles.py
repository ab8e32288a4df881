"""Fast patch reading: decode a slide's own tiles instead of going through ``read_region``.

A tiled pyramidal TIFF (generic tiled TIFF, Aperio SVS, the synthetic slides of
:mod:`wsi.synth`) stores every pyramid level as a grid of independently compressed tiles.
:class:`TileReader` locates the tiles a patch overlaps from the level's tile offsets and
byte counts, reads their raw bytes with ``os.pread``, decodes each once with
libjpeg-turbo (``imagecodecs.jpeg8_decode``, with the level's JPEGTables and the colour
space its photometric interpretation says) or, for lossless compressions, with the
page's own tifffile decoder, and assembles and crops the patch. Where a patch is exactly
one tile, the tile is decoded straight into the output array.

Semantics match :meth:`wsi.slide.Slide.read_region`:

- levels are the tiled images of the main IFD chain, largest first (as OpenSlide and
  tiffslide list them); the downsample of a level is the mean of the width and height
  ratios to level 0, as in OpenSlide;
- a patch at ``level`` with level-0 top-left ``(x0, y0)`` starts at level pixel
  ``(int(x0 / downsample), int(y0 / downsample))`` (tiffslide's rule; OpenSlide agrees
  wherever that division is exact, and resamples otherwise);
- pixels beyond the level's image (including the padding of edge tiles) are white.

Files this reader does not understand (stripped images, JPEG 2000 or other unusual
compressions, non-RGB or non-8-bit samples, non-TIFF formats) raise
:class:`TileReaderUnsupported`; :func:`read_patches` then falls back to
:meth:`Slide.read_region`. Tiles whose data cannot be decoded raise
:class:`wsi.slide.SlideReadError`, like the slide backends do.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, cast

import imagecodecs
import numpy as np
import tifffile

from plumbing.errors import describe
from wsi.slide import WHITE, Backend, SlideReadError, open_slide

PatchBackend = Literal["auto", "tiles", "openslide", "tiffslide"]
PATCH_BACKENDS: tuple[str, ...] = ("auto", "tiles", "openslide", "tiffslide")

# TIFF tag values used below.
_JPEG = 7
_LOSSLESS = {1: "none", 5: "LZW", 8: "deflate", 32946: "deflate"}
_PHOTOMETRIC_RGB = 2
_PHOTOMETRIC_YCBCR = 6
_SUBFILETYPE_MASK = 4

log = logging.getLogger(__name__)


class TileReaderUnsupported(Exception):
    """The file is not a tiled TIFF this reader decodes; use :meth:`Slide.read_region`."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: tile reader unsupported ({reason})")


@dataclass(frozen=True)
class TileLevel:
    """One pyramid level: its TIFF page and tile grid."""

    page_index: int
    width: int
    height: int
    tile_width: int
    tile_height: int
    downsample: float
    compression: int

    @property
    def tiles_across(self) -> int:
        return math.ceil(self.width / self.tile_width)

    @property
    def tiles_down(self) -> int:
        return math.ceil(self.height / self.tile_height)


def _pyramid_pages(tif: tifffile.TiffFile) -> list[tuple[int, Any]]:
    """The tiled, non-mask pages of the main IFD chain, largest first."""
    pages: list[tuple[int, Any]] = []
    for index, page in enumerate(tif.pages):
        if not isinstance(page, tifffile.TiffPage):
            continue
        if not page.is_tiled or int(page.subfiletype) & _SUBFILETYPE_MASK:
            continue
        pages.append((index, page))
    pages.sort(key=lambda item: (-int(item[1].imagewidth), item[0]))
    return pages


def _check_page(path: Path, page: Any) -> None:
    """Raise :class:`TileReaderUnsupported` unless ``page`` is 8-bit RGB tiles we decode."""
    compression = int(page.compression)
    if compression != _JPEG and compression not in _LOSSLESS:
        raise TileReaderUnsupported(path, f"compression {compression}")
    if int(page.samplesperpixel) != 3 or page.extrasamples:
        raise TileReaderUnsupported(path, f"{page.samplesperpixel} samples per pixel")
    if int(page.bitspersample) != 8 or np.dtype(page.dtype) != np.uint8:
        raise TileReaderUnsupported(path, f"{page.bitspersample}-bit samples")
    if int(page.planarconfig) != 1:
        raise TileReaderUnsupported(path, "separate colour planes")
    if int(page.imagedepth) != 1 or int(page.tiledepth) != 1:
        raise TileReaderUnsupported(path, "volumetric tiles")
    photometric = int(page.photometric)
    if photometric not in (_PHOTOMETRIC_RGB, _PHOTOMETRIC_YCBCR):
        raise TileReaderUnsupported(path, f"photometric interpretation {photometric}")
    if photometric == _PHOTOMETRIC_YCBCR and compression != _JPEG:
        raise TileReaderUnsupported(path, "YCbCr without JPEG compression")
    if int(page.tilewidth) <= 0 or int(page.tilelength) <= 0:
        raise TileReaderUnsupported(path, "no tile size")


class TileReader:
    """Reads patches of one pyramid level of a tiled TIFF by decoding its tiles directly.

    Use as a context manager (or call :meth:`close`). Not thread-safe and not picklable:
    open one per process or thread.

    Raises :class:`TileReaderUnsupported` when the file is not a tiled TIFF with 8-bit
    RGB JPEG (or losslessly compressed) tiles, or when its tiled pages are not
    ``expected_levels`` (the level dimensions of the slide backends, where given), and
    ``ValueError`` for a level that the file does not have.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        level: int = 0,
        *,
        cache_tiles: int = 16,
        expected_levels: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise SlideReadError(self.path, {"filesystem": "no such file"})
        try:
            self._tif = tifffile.TiffFile(self.path)
        except Exception as error:
            raise TileReaderUnsupported(self.path, f"not a TIFF: {describe(error)}") from error
        self._fd = -1
        try:
            self._setup(level, cache_tiles, expected_levels)
            self._fd = os.open(self.path, os.O_RDONLY)
        except BaseException:
            self._tif.close()
            raise

    def _setup(
        self, level: int, cache_tiles: int, expected_levels: Sequence[tuple[int, int]] | None
    ) -> None:
        try:
            pages = _pyramid_pages(self._tif)
        except Exception as error:
            raise TileReaderUnsupported(self.path, describe(error)) from error
        if not pages:
            raise TileReaderUnsupported(self.path, "no tiled images")
        self.level_dimensions: tuple[tuple[int, int], ...] = tuple(
            (int(page.imagewidth), int(page.imagelength)) for _, page in pages
        )
        # an overview page not flagged as reduced, or a stripped level 0 beside tiled
        # ones, made level N here another image than the backends' level N
        if expected_levels is not None and self.level_dimensions != tuple(expected_levels):
            raise TileReaderUnsupported(
                self.path, f"its tiled pages {self.level_dimensions} are not the slide's "
                f"levels {tuple(expected_levels)}")  # fmt: skip
        if not 0 <= level < len(pages):
            raise ValueError(f"{self.path}: level {level} outside 0..{len(pages) - 1}")
        width0, height0 = self.level_dimensions[0]
        self.level_downsamples: tuple[float, ...] = tuple(
            (width0 / w + height0 / h) / 2 for w, h in self.level_dimensions
        )
        index, page = pages[level]
        _check_page(self.path, page)
        self.level = level
        self.info = TileLevel(
            page_index=index,
            width=int(page.imagewidth),
            height=int(page.imagelength),
            tile_width=int(page.tilewidth),
            tile_height=int(page.tilelength),
            downsample=self.level_downsamples[level],
            compression=int(page.compression),
        )
        n_tiles = self.info.tiles_across * self.info.tiles_down
        self._offsets = np.asarray(page.dataoffsets, dtype=np.int64)
        self._counts = np.asarray(page.databytecounts, dtype=np.int64)
        if self._offsets.size < n_tiles or self._counts.size < n_tiles:
            raise TileReaderUnsupported(
                self.path, f"{self._offsets.size} tile offsets for {n_tiles} tiles"
            )
        self._page = page
        self._decode_tile: Callable[[bytes, int], np.ndarray | None]
        self._decode_into: Callable[[bytes, np.ndarray], None] | None
        if self.info.compression == _JPEG:
            self._jpegtables: bytes | None = page.jpegtables
            # YCbCr tiles are converted to RGB; RGB-tagged tiles without a JFIF header
            # (Aperio) hold RGB components that must not be colour-converted.
            photometric = int(page.photometric)
            self._colorspace: str | None = (
                "RGB" if photometric == _PHOTOMETRIC_RGB and not page.is_jfif else None
            )
            self._decode_tile = self._decode_jpeg
            self._decode_into = self._decode_jpeg_into
        else:
            self._page_decode = page.decode
            self._decode_tile = self._decode_lossless
            self._decode_into = None
        self._cache: OrderedDict[int, np.ndarray | None] = OrderedDict()
        self._cache_tiles = max(1, int(cache_tiles))
        self.tiles_decoded = 0

    # -- properties -------------------------------------------------------------------

    @property
    def level_count(self) -> int:
        return len(self.level_dimensions)

    @property
    def dimensions(self) -> tuple[int, int]:
        """(width, height) of the level this reader reads."""
        return self.info.width, self.info.height

    @property
    def tile_size(self) -> tuple[int, int]:
        """(tile width, tile height) of the level this reader reads."""
        return self.info.tile_width, self.info.tile_height

    @property
    def tile_byte_counts(self) -> np.ndarray:
        """Compressed size of every tile of this level, in row-major tile order."""
        return self._counts.copy()

    @property
    def jpeg_arguments(self) -> dict[str, Any]:
        """Keyword arguments of ``imagecodecs.jpeg8_decode`` for this level's tiles."""
        if self.info.compression != _JPEG:
            raise ValueError(f"{self.path}: level {self.level} is not JPEG-compressed")
        return {
            "tables": self._jpegtables,
            "colorspace": self._colorspace,
            "outcolorspace": "RGB",
        }

    def raw_tile(self, col: int, row: int) -> bytes:
        """The compressed bytes of tile (col, row) of this level (empty for a tile with none)."""
        if not (0 <= col < self.info.tiles_across and 0 <= row < self.info.tiles_down):
            raise IndexError(f"{self.path}: no tile ({col}, {row}) at level {self.level}")
        return self._raw(row * self.info.tiles_across + col)

    # -- tile access ------------------------------------------------------------------

    def _raw(self, index: int) -> bytes:
        count = int(self._counts[index])
        if count == 0:
            return b""
        data = os.pread(self._fd, count, int(self._offsets[index]))
        if len(data) != count:
            raise SlideReadError(
                self.path, {"tiles": f"tile {index}: file ends before its {count} bytes"}
            )
        return data

    def _decode_jpeg(self, data: bytes, index: int) -> np.ndarray:
        tile = imagecodecs.jpeg8_decode(
            data, tables=self._jpegtables, colorspace=self._colorspace, outcolorspace="RGB"
        )
        return self._fit_tile(tile, index)

    def _decode_jpeg_into(self, data: bytes, out: np.ndarray) -> None:
        imagecodecs.jpeg8_decode(
            data,
            tables=self._jpegtables,
            colorspace=self._colorspace,
            outcolorspace="RGB",
            out=out,
        )

    def _decode_lossless(self, data: bytes, index: int) -> np.ndarray:
        tile, _, _ = self._page_decode(data, index, jpegtables=None)
        if tile is None:
            raise ValueError("tile has no data")
        return self._fit_tile(np.asarray(tile).reshape(tile.shape[-3:]), index)

    def _fit_tile(self, tile: np.ndarray, index: int) -> np.ndarray:
        """Shape a decoded tile to (tile_height, tile_width, 3), padding with white."""
        th, tw = self.info.tile_height, self.info.tile_width
        if tile.ndim == 2:
            tile = np.repeat(tile[..., None], 3, axis=2)
        if tile.shape == (th, tw, 3):
            return tile
        fitted = np.full((th, tw, 3), WHITE, dtype=np.uint8)
        rows, cols = min(th, tile.shape[0]), min(tw, tile.shape[1])
        fitted[:rows, :cols] = tile[:rows, :cols, :3]
        log.debug("%s: tile %d decoded as %s", self.path, index, tile.shape)
        return fitted

    def _tile(self, index: int) -> np.ndarray | None:
        """Decoded tile ``index`` (cached); ``None`` for a tile with no data (white)."""
        cache = self._cache
        if index in cache:
            cache.move_to_end(index)
            return cache[index]
        data = self._raw(index)
        tile: np.ndarray | None = None
        if data:
            try:
                tile = self._decode_tile(data, index)
            except Exception as error:
                raise SlideReadError(
                    self.path, {"tiles": f"tile {index}: {describe(error)}"}
                ) from error
            self.tiles_decoded += 1
        cache[index] = tile
        if len(cache) > self._cache_tiles:
            cache.popitem(last=False)
        return tile

    # -- patches ----------------------------------------------------------------------

    def level_origin(self, x0: float, y0: float) -> tuple[int, int]:
        """Level pixel of level-0 point (x0, y0): ``x0 / downsample`` rounded toward zero.

        This is tiffslide's rule. OpenSlide instead renders the region at the exact
        fractional position (resampling the pixels), so both agree, and agree with this
        reader, only where ``x0`` and ``y0`` are multiples of the downsample (always at
        level 0, and on the patch grid at every level).
        """
        downsample = self.info.downsample
        return int(x0 / downsample), int(y0 / downsample)

    def read_region(
        self, x0: float, y0: float, size: tuple[int, int], out: np.ndarray | None = None
    ) -> np.ndarray:
        """Pixels of ``size`` = (width, height) at this level, top-left at level-0 (x0, y0).

        Returns (height, width, 3) ``uint8`` RGB (written into ``out`` when given, which
        must be C-contiguous of that shape); areas beyond the image are white.
        """
        width, height = int(size[0]), int(size[1])
        if width <= 0 or height <= 0:
            raise ValueError(f"{self.path}: region size must be positive, got {size}")
        if out is None:
            out = np.empty((height, width, 3), dtype=np.uint8)
        elif out.shape != (height, width, 3) or out.dtype != np.uint8:
            raise ValueError(f"out has shape {out.shape} {out.dtype}, not {(height, width, 3)}")
        info = self.info
        tw, th = info.tile_width, info.tile_height
        lx, ly = self.level_origin(x0, y0)
        # The part of the region that lies inside the level's image.
        ix0, iy0 = max(lx, 0), max(ly, 0)
        ix1, iy1 = min(lx + width, info.width), min(ly + height, info.height)
        if ix0 >= ix1 or iy0 >= iy1:
            out.fill(WHITE)
            return out
        if (ix0, iy0, ix1, iy1) != (lx, ly, lx + width, ly + height):
            out.fill(WHITE)
        col0, col1 = ix0 // tw, (ix1 - 1) // tw
        row0, row1 = iy0 // th, (iy1 - 1) // th
        across = info.tiles_across
        if (
            col0 == col1
            and row0 == row1
            and (lx, ly, width, height) == (col0 * tw, row0 * th, tw, th)
            and self._decode_into is not None
            and out.flags.c_contiguous
        ):
            index = row0 * across + col0
            if index not in self._cache:
                self._read_tile_into(index, out)
                return out
        for row in range(row0, row1 + 1):
            ty = row * th
            sy0, sy1 = max(iy0, ty), min(iy1, ty + th)
            for col in range(col0, col1 + 1):
                tx = col * tw
                sx0, sx1 = max(ix0, tx), min(ix1, tx + tw)
                tile = self._tile(row * across + col)
                target = out[sy0 - ly : sy1 - ly, sx0 - lx : sx1 - lx]
                if tile is None:
                    target.fill(WHITE)
                else:
                    target[...] = tile[sy0 - ty : sy1 - ty, sx0 - tx : sx1 - tx]
        return out

    def _read_tile_into(self, index: int, out: np.ndarray) -> None:
        """Decode one whole tile straight into ``out`` (not cached)."""
        data = self._raw(index)
        if not data:
            out.fill(WHITE)
            return
        assert self._decode_into is not None
        try:
            self._decode_into(data, out)
        except Exception as error:
            # A tile whose JPEG frame is not exactly tile-sized: take the general path.
            log.debug("%s: direct decode of tile %d failed (%s)", self.path, index, error)
            tile = self._tile(index)
            if tile is None:
                out.fill(WHITE)
            else:
                out[...] = tile
            return
        self.tiles_decoded += 1

    def read_patch(self, x0: float, y0: float, size: int) -> np.ndarray:
        """A (size, size, 3) ``uint8`` RGB patch at this level, top-left at level-0 (x0, y0)."""
        return self.read_region(x0, y0, (size, size))

    def read_patches(self, coords: Sequence[Sequence[float]] | np.ndarray, size: int) -> np.ndarray:
        """(N, size, size, 3) patches at level-0 top-lefts ``coords`` ((x, y) pairs).

        Consecutive patches that share tiles decode them once (a small tile cache).
        """
        points = _as_coords(coords)
        out = np.empty((len(points), size, size, 3), dtype=np.uint8)
        for i, (x, y) in enumerate(points):
            self.read_region(x, y, (size, size), out=out[i])
        return out

    # -- lifetime ---------------------------------------------------------------------

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._cache.clear()
        self._tif.close()

    def __enter__(self) -> TileReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        info = self.info
        return (
            f"TileReader({str(self.path)!r}, level={self.level}, "
            f"dimensions={(info.width, info.height)}, "
            f"tile={(info.tile_width, info.tile_height)}, compression={info.compression})"
        )


def _as_coords(coords: Sequence[Sequence[float]] | np.ndarray) -> list[tuple[int, int]]:
    points = np.asarray(coords, dtype=np.float64)
    if points.size == 0:
        return []
    if points.ndim != 2 or points.shape[1] != 2:
        raise ValueError(f"coords must be (N, 2) (x, y) pairs, got shape {points.shape}")
    return [(int(x), int(y)) for x, y in points]


def slide_levels(path: Path) -> tuple[tuple[int, int], ...] | None:
    """The level dimensions :func:`open_slide` gives the file, which the candidates were
    computed from (``None``: it opens it not). The slide libraries open a file once per
    identity (size, mtime): a store reads a slide's patches by chunks, and each chunk's
    read checks its levels; :func:`forget_slide_levels` empties that cache."""
    if not path.is_file():
        return None
    stat = path.stat()
    return _backend_levels(str(path), (stat.st_size, stat.st_mtime_ns))


def forget_slide_levels() -> None:
    """Empty :func:`slide_levels`' cache: the next check of every slide opens it again."""
    _backend_levels.cache_clear()


@functools.lru_cache(maxsize=64)
def _backend_levels(path: str, identity: tuple[int, int]) -> tuple[tuple[int, int], ...] | None:
    """:func:`slide_levels`, once per file and identity."""
    try:
        with open_slide(path) as slide:
            return slide.level_dimensions
    except SlideReadError:
        return None


def read_patches(
    slide_path: str | os.PathLike[str],
    level: int,
    coords: Sequence[Sequence[float]] | np.ndarray,
    size: int,
    backend: PatchBackend = "auto",
) -> np.ndarray:
    """Read (N, size, size, 3) ``uint8`` RGB patches of ``slide_path`` at ``level``.

    ``coords`` are the level-0 (x, y) top-left corners. ``backend``:

    - ``"auto"``: decode the file's tiles with :class:`TileReader`; when the file is not
      one it understands, fall back to :meth:`Slide.read_region` (openslide, then
      tiffslide);
    - ``"tiles"``: :class:`TileReader` only (raises :class:`TileReaderUnsupported`);
    - ``"openslide"`` / ``"tiffslide"``: ``read_region`` of that library, patch by patch.

    Pixels are the same whichever path reads them. A file that cannot be read raises
    :class:`wsi.slide.SlideReadError`.
    """
    if backend not in PATCH_BACKENDS:
        raise ValueError(f"unknown patch backend {backend!r}; choose from {PATCH_BACKENDS}")
    if size <= 0:
        raise ValueError(f"patch size must be positive, got {size}")
    points = _as_coords(coords)
    if backend in ("auto", "tiles"):
        levels = slide_levels(Path(slide_path))
        if levels is None and backend == "auto" and Path(slide_path).is_file():
            # the slide libraries refuse the file (it changed since its candidates were
            # computed, say): so does this read, with their reasons; "tiles" reads it alone
            open_slide(slide_path).close()
        try:
            with TileReader(slide_path, level, expected_levels=levels) as reader:
                return reader.read_patches(points, size)
        except TileReaderUnsupported as error:
            if backend == "tiles":
                raise
            log.debug("%s; falling back to read_region", error)
    slide_backend: Backend = "auto" if backend == "auto" else cast(Backend, backend)
    out = np.empty((len(points), size, size, 3), dtype=np.uint8)
    with open_slide(slide_path, slide_backend) as slide:
        for i, (x, y) in enumerate(points):
            out[i] = slide.read_region(x, y, level, (size, size))
    return out
