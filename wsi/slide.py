"""Whole-slide images behind one small interface, read by openslide or tiffslide.

Both libraries expose the OpenSlide API, so one :class:`Slide` wraps either handle and
adds what the pipeline relies on: level-0 coordinates everywhere, RGB ``uint8`` arrays
with transparent or missing areas composited onto white, microns per pixel, the tile
grid, and thumbnails at a requested resolution. Every failure to open or read a slide
raises :class:`SlideReadError`, which names the file and what each backend said.

Thumbnails are made in bounded memory: :meth:`Slide.thumbnail_blocks` decodes the chosen
level a band of tiles at a time (at most about ``region_pixels`` pixels) and area-averages
each band onto the thumbnail grid (:func:`area_sums`), so a whole level is never in memory
however large the slide; :meth:`Slide.thumbnail_at_downsample` only assembles the blocks.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np

from plumbing.errors import PipelineError, describe

Backend = Literal["openslide", "tiffslide", "auto"]
BACKENDS: tuple[str, ...] = ("openslide", "tiffslide")
WHITE = 255
READ_LEVEL_MAX_PIXELS = 64 * 2**20  # read_level refuses larger levels
REGION_PIXELS = 2 * 2**20  # pixels decoded at once by thumbnail_blocks: 6 MB of RGB
STRIPPED_TILE = 256  # the read granularity assumed for a level that has no tiles

log = logging.getLogger(__name__)


class SlideReadError(PipelineError):
    """A slide could not be opened or read; ``reasons`` maps each backend tried to its error."""

    def __init__(self, path: str | os.PathLike[str], reasons: dict[str, str]) -> None:
        detail = "; ".join(f"{backend}: {reason}" for backend, reason in reasons.items())
        super().__init__(Path(path), f"cannot read slide ({detail})")
        self.reasons = dict(reasons)


def _open_openslide(path: Path) -> Any:
    import openslide

    return openslide.OpenSlide(str(path))


def _open_tiffslide(path: Path) -> Any:
    import tiffslide

    problem = tiff_structure_problem(path)  # tiffslide would open what it can of it
    if problem is not None:
        raise ValueError(problem)
    return tiffslide.TiffSlide(str(path))


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def tiff_structure_problem(path: str | os.PathLike[str]) -> str | None:
    """Why a TIFF is cut short or damaged, or None: its chain of pages (IFDs) leads past
    the end of the file, or a page's tile data does (a truncated copy or download). tifffile
    only logs a broken chain and opens the pages before it, so a truncated slide would
    otherwise look like one with fewer levels."""
    import tifffile

    path = Path(path)
    size = path.stat().st_size
    broken = _Messages()
    tiff_log = logging.getLogger("tifffile")
    tiff_log.addHandler(broken)
    try:
        with tifffile.TiffFile(path) as tif:
            pages = list(tif.pages)
            for index, page in enumerate(pages):
                ends = [o + c for o, c in zip(page.dataoffsets, page.databytecounts, strict=False)]
                if ends and max(ends) > size:
                    return (f"truncated or corrupt TIFF: page {index}'s image data ends at byte "
                            f"{max(ends)}, past the end of the file ({size} bytes)")  # fmt: skip
    finally:
        tiff_log.removeHandler(broken)
    if broken.messages:
        first = broken.messages[0].split("> ")[-1]
        return (f"truncated or corrupt TIFF: {first} (the file has {size} bytes; only "
                f"{len(pages)} page(s) before it could be read)")  # fmt: skip
    return None


_OPENERS: dict[str, Callable[[Path], Any]] = {
    "openslide": _open_openslide,
    "tiffslide": _open_tiffslide,
}


def composite_on_white(pixels: np.ndarray) -> np.ndarray:
    """RGB(A) ``uint8`` -> RGB ``uint8``, alpha-blending onto white where alpha < 255.

    ``out = (rgb * a + 255 * (255 - a) + 127) // 255``, computed only for the pixels that
    are not opaque (inside a slide, usually none), so no widened copy of the image is made.
    """
    if pixels.ndim != 3:
        raise ValueError(f"expected an (H, W, C) image, got shape {pixels.shape}")
    if pixels.shape[2] == 3:
        return pixels
    rgb = np.ascontiguousarray(pixels[..., :3])
    translucent = pixels[..., 3] < 255
    if translucent.any():
        alpha = pixels[..., 3][translucent].astype(np.uint16)[:, None]
        blended = (rgb[translucent] * alpha + WHITE * (255 - alpha) + 127) // 255
        rgb[translucent] = blended.astype(np.uint8)
    return rgb


@dataclass(frozen=True)
class EmptyTiles:
    """The tiles of a level stored with no data: ``grid[row, col]`` is True for tile
    (col, row) of ``tile_size`` = (width, height) level pixels."""

    tile_size: tuple[int, int]
    grid: np.ndarray


def empty_tile_grid(
    byte_counts: Sequence[int], tiles_across: int, tiles_down: int
) -> np.ndarray | None:
    """``(tiles_down, tiles_across)`` booleans, True where a tile's byte count is 0 (TIFF's
    mark of a tile left out of a sparse file); ``None`` when every tile has data."""
    counts = np.asarray(byte_counts, dtype=np.int64)[: tiles_across * tiles_down]
    if counts.size < tiles_across * tiles_down or counts.all():
        return None
    return (counts == 0).reshape(tiles_down, tiles_across)


def in_empty_tiles(
    rows: np.ndarray, cols: np.ndarray, tile_size: tuple[int, int], grid: np.ndarray
) -> np.ndarray:
    """``(len(rows), len(cols))`` booleans: whether level pixel (row, col) lies in a tile
    that ``grid`` marks empty. Pixels outside the grid are not."""
    tile_width, tile_height = tile_size
    tile_rows, tile_cols = rows // tile_height, cols // tile_width
    rows_in = (tile_rows >= 0) & (tile_rows < grid.shape[0])
    cols_in = (tile_cols >= 0) & (tile_cols < grid.shape[1])
    hit = np.zeros((len(rows), len(cols)), dtype=bool)
    hit[np.ix_(rows_in, cols_in)] = grid[np.ix_(tile_rows[rows_in], tile_cols[cols_in])]
    return hit


def _tiffslide_empty_tiles(handle: Any, level: int) -> EmptyTiles | None:
    """What :func:`empty_tile_grid` finds in the page tiffslide reads ``level`` from; ``None``
    where the level is stripped or its page cannot be matched to the level."""
    try:
        series = handle.ts_tifffile.series[int(handle.properties["tiffslide.series-index"])]
        page = series.levels[level].keyframe
        width, height = handle.level_dimensions[level]
        if not page.is_tiled or (int(page.imagewidth), int(page.imagelength)) != (width, height):
            return None
        tile_size = (int(page.tilewidth), int(page.tilelength))
    except Exception as error:  # a backing store without a TIFF (kerchunk), an odd layout
        log.debug("no tile map of level %d: %s", level, describe(error))
        return None
    grid = empty_tile_grid(
        page.databytecounts, -(-width // tile_size[0]), -(-height // tile_size[1])
    )
    return None if grid is None else EmptyTiles(tile_size, grid)


class Slide:
    """An open whole-slide image. Use :func:`open_slide` to make one.

    Coordinates given to :meth:`read_region` are level-0 pixels; sizes are pixels of the
    level read, as in OpenSlide.
    """

    def __init__(self, path: Path, backend: str, handle: Any, mpp: float | None) -> None:
        self.path = path
        self.backend = backend
        self._handle = handle
        self.level_count: int = int(handle.level_count)
        self.level_dimensions: tuple[tuple[int, int], ...] = tuple(
            (int(w), int(h)) for w, h in handle.level_dimensions
        )
        self.level_downsamples: tuple[float, ...] = tuple(
            float(d) for d in handle.level_downsamples
        )
        self.mpp = mpp
        self._empty_tiles_by_level: dict[int, EmptyTiles | None] = {}

    @property
    def dimensions(self) -> tuple[int, int]:
        """Level-0 (width, height) in pixels."""
        return self.level_dimensions[0]

    @property
    def properties(self) -> dict[str, str]:
        return dict(self._handle.properties)

    @property
    def tile_size(self) -> tuple[int, int] | None:
        """Level-0 (tile width, tile height) of the file, or ``None`` for a stripped file."""
        return self.level_tile_size(0)

    def level_mpp(self, level: int) -> float | None:
        """Microns per pixel at ``level`` (``None`` when the file does not say)."""
        if self.mpp is None:
            return None
        return self.mpp * self.level_downsamples[level]

    def best_level_for_downsample(self, downsample: float) -> int:
        """The coarsest level whose downsample does not exceed ``downsample``."""
        candidates = [i for i, d in enumerate(self.level_downsamples) if d <= downsample + 1e-6]
        return max(candidates) if candidates else 0

    def read_region(self, x: int, y: int, level: int, size: tuple[int, int]) -> np.ndarray:
        """Pixels of ``size`` = (width, height) at ``level``, top-left at level-0 (x, y).

        Returns an (height, width, 3) ``uint8`` array; areas outside the slide or
        transparent in the file are white.
        """
        if not 0 <= level < self.level_count:
            raise ValueError(f"{self.path}: level {level} outside 0..{self.level_count - 1}")
        width, height = int(size[0]), int(size[1])
        if width <= 0 or height <= 0:
            raise ValueError(f"{self.path}: region size must be positive, got {size}")
        try:
            region = self._handle.read_region((int(x), int(y)), level, (width, height))
        except Exception as error:
            raise SlideReadError(self.path, {self.backend: describe(error)}) from error
        pixels = composite_on_white(np.asarray(region))
        return self._whiten_unstored(pixels, x, y, level)

    def _whiten_unstored(self, pixels: np.ndarray, x: int, y: int, level: int) -> np.ndarray:
        """White where the file stores no pixels: beyond the level's edge (openslide returns
        them transparent, tiffslide black) and in tiles stored empty (a sparse TIFF: openslide
        returns them transparent and the tile reader white, tiffslide black)."""
        downsample = self.level_downsamples[level]
        level_width, level_height = self.level_dimensions[level]
        height, width = pixels.shape[:2]
        cols = np.floor(x / downsample + np.arange(width)).astype(np.int64)
        rows = np.floor(y / downsample + np.arange(height)).astype(np.int64)
        outside_cols = (cols < 0) | (cols >= level_width)
        outside_rows = (rows < 0) | (rows >= level_height)
        empty = self._empty_tiles(level) if self.backend == "tiffslide" else None
        if not (outside_cols.any() or outside_rows.any() or empty is not None):
            return pixels
        pixels = pixels.copy()
        if empty is not None:
            pixels[in_empty_tiles(rows, cols, empty.tile_size, empty.grid)] = WHITE
        pixels[:, outside_cols] = WHITE
        pixels[outside_rows, :] = WHITE
        return pixels

    def _empty_tiles(self, level: int) -> EmptyTiles | None:
        """The tiles of ``level`` that the file stores with no data (read once a level)."""
        if level not in self._empty_tiles_by_level:
            self._empty_tiles_by_level[level] = _tiffslide_empty_tiles(self._handle, level)
        return self._empty_tiles_by_level[level]

    def level_tile_size(self, level: int) -> tuple[int, int] | None:
        """(tile width, tile height) of ``level`` in its own pixels, ``None`` when untiled."""
        props = self._handle.properties
        width = props.get(f"{self.backend}.level[{level}].tile-width")
        height = props.get(f"{self.backend}.level[{level}].tile-height")
        if width is None or height is None or int(width) <= 0 or int(height) <= 0:
            return None  # tiffslide says 0 of a stripped level
        return int(width), int(height)

    def read_level(self, level: int, *, max_pixels: int = READ_LEVEL_MAX_PIXELS) -> np.ndarray:
        """A whole level as RGB. Refuses levels over ``max_pixels``: never load level 0.

        Nothing in the pipeline reads whole levels; thumbnails and masks go through
        :meth:`thumbnail_blocks`, which reads any level by regions.
        """
        width, height = self.level_dimensions[level]
        if width * height > max_pixels:
            raise MemoryError(
                f"{self.path}: level {level} is {width}x{height}; read it by regions instead"
            )
        return self.read_region(0, 0, level, (width, height))

    def read_level_pixels(
        self, level: int, col: int, row: int, size: tuple[int, int]
    ) -> np.ndarray:
        """Like :meth:`read_region`, with the top-left given in pixels of ``level`` itself."""
        downsample = self.level_downsamples[level]
        return self.read_region(_level0(col, downsample), _level0(row, downsample), level, size)

    def thumbnail_shape(self, downsample: float) -> tuple[int, int]:
        """(rows, cols) of the slide at ``downsample``: ``floor(level-0 size / downsample)``.

        At least 1; a ratio within 1e-6 of an integer counts as that integer, so that the
        downsample ``width / cols`` of a grid gives back ``cols``.
        """
        width0, height0 = self.dimensions
        return (
            max(1, math.floor(height0 / downsample + 1e-6)),
            max(1, math.floor(width0 / downsample + 1e-6)),
        )

    def thumbnail_blocks(
        self, downsample: float, *, region_pixels: int = REGION_PIXELS
    ) -> Iterator[tuple[int, int, np.ndarray]]:
        """The slide at ``downsample``, as ``(row, col, rgb)`` blocks of its thumbnail grid.

        Thumbnail pixel (r, c) is the area mean of level-0 pixels
        ``[c d, (c + 1) d) x [r d, (r + 1) d)`` (``d = downsample``), taken from the
        coarsest level at least that fine, whose pixel i covers level-0
        ``[i D, (i + 1) D)`` (``D`` its downsample): in that level's pixels the thumbnail
        pixel spans ``[c s, (c + 1) s)`` with ``s = d / D`` (at least 1 up to rounding),
        generally not an integer,
        and pixels cut by an edge count by the part inside (:func:`area_sums`); areas
        beyond the level are white. Means are rounded to ``uint8``.

        The level is decoded in tile-aligned bands of about ``region_pixels`` pixels, full
        width when a band of tiles that wide fits, otherwise in vertical stripes (a
        pyramid-less slide); the few level rows a thumbnail row shares with the next band
        are carried over, so every tile is decoded once per stripe. Blocks come in
        row-major order and tile the grid of :meth:`thumbnail_shape` exactly.
        """
        if downsample < 1:
            raise ValueError(f"{self.path}: downsample {downsample} is finer than level 0")
        rows, cols = self.thumbnail_shape(downsample)
        level = self.best_level_for_downsample(downsample)
        scale = downsample / self.level_downsamples[level]
        tile_width, tile_height = self.level_tile_size(level) or (STRIPPED_TILE, STRIPPED_TILE)
        col_edges = np.arange(cols + 1) * scale
        row_edges = np.arange(rows + 1) * scale
        # Stripes: the whole width when one band of tiles that wide fits in the budget.
        stripe_cols = cols
        if math.ceil(col_edges[-1]) * tile_height > region_pixels:
            width = max(tile_width, region_pixels // tile_height // tile_width * tile_width)
            stripe_cols = max(1, math.floor(width / scale))
        for col0 in range(0, cols, stripe_cols):
            col1 = min(cols, col0 + stripe_cols)
            x0 = math.floor(col_edges[col0])
            x1 = max(x0 + 1, math.ceil(col_edges[col1]))
            band = max(tile_height, region_pixels // (x1 - x0) // tile_height * tile_height)
            band = min(band, -(-math.ceil(row_edges[-1]) // tile_height) * tile_height)
            yield from self._stripe_blocks(
                level, x0, x1, band, row_edges, col_edges[col0 : col1 + 1] - x0, col0
            )

    def _stripe_blocks(
        self,
        level: int,
        x0: int,
        x1: int,
        band: int,
        row_edges: np.ndarray,
        col_edges: np.ndarray,
        col0: int,
    ) -> Iterator[tuple[int, int, np.ndarray]]:
        """One stripe of level columns ``[x0, x1)``, top to bottom, ``band`` rows a read."""
        held = np.empty((0, x1 - x0, 3), dtype=np.uint8)  # level rows [held_y0, read_y)
        held_y0 = read_y = row = 0
        rows = len(row_edges) - 1
        while row < rows:
            pixels = self.read_level_pixels(level, x0, read_y, (x1 - x0, band))
            held = np.concatenate([held, pixels]) if len(held) else pixels
            read_y += band
            # Thumbnail rows whose level rows have all been read.
            done = int(np.searchsorted(row_edges, read_y, side="right")) - 1
            done = min(done, rows)
            if done <= row:
                continue
            sums = area_sums(held, row_edges[row : done + 1] - held_y0, col_edges)
            areas = np.diff(row_edges[row : done + 1])[:, None] * np.diff(col_edges)[None, :]
            sums /= areas.astype(np.float32)[..., None]
            # Means of uint8 values lie in [0, 255]: rounding needs no clipping.
            yield row, col0, np.rint(sums, out=sums).astype(np.uint8)
            row = done
            keep = min(math.floor(row_edges[row]), read_y)
            held, held_y0 = held[keep - held_y0 :], keep

    def thumbnail_at_downsample(
        self, downsample: float, *, region_pixels: int = REGION_PIXELS
    ) -> np.ndarray:
        """The slide at ``downsample`` relative to level 0, read from the nearest finer level.

        The output has ``floor(level-0 size / downsample)`` pixels per side; it is made by
        exact area averaging from the coarsest level that is at least as fine as requested,
        read by regions (:meth:`thumbnail_blocks`), so only the thumbnail itself is whole
        in memory.
        """
        if downsample < 1:
            raise ValueError(f"{self.path}: downsample {downsample} is finer than level 0")
        out = np.empty((*self.thumbnail_shape(downsample), 3), dtype=np.uint8)
        for row, col, block in self.thumbnail_blocks(downsample, region_pixels=region_pixels):
            out[row : row + block.shape[0], col : col + block.shape[1]] = block
        return out

    def thumbnail(self, mpp: float) -> np.ndarray:
        """The slide at ``mpp`` microns per pixel (needs the slide's own resolution)."""
        if self.mpp is None:
            raise SlideReadError(
                self.path, {self.backend: "the file gives no resolution (microns per pixel)"}
            )
        return self.thumbnail_at_downsample(mpp / self.mpp)

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> Slide:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Slide({str(self.path)!r}, backend={self.backend!r}, "
            f"dimensions={self.dimensions}, levels={self.level_count}, mpp={self.mpp})"
        )


def _level0(pixel: int, downsample: float) -> int:
    """The smallest level-0 coordinate that the backends map to level pixel ``pixel``.

    tiffslide takes ``int(x / downsample)`` (OpenSlide renders from ``x / downsample``, the
    same pixel when the division is exact); ``ceil(pixel * downsample)`` is that coordinate
    up to the rounding of the product, which the two loops settle.
    """
    x = math.ceil(pixel * downsample)
    while int(x / downsample) < pixel:
        x += 1
    while x > 0 and int((x - 1) / downsample) >= pixel:
        x -= 1
    return x


def box_taps(edges: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Source pixels and weights of the cells ``[edges[j], edges[j + 1])`` of one axis.

    Returns ``(index, weight)``, both (K, cells): cell j is ``sum_t weight[t, j] *
    x[index[t, j]]``, where ``weight`` is the length of pixel ``[i, i + 1)`` inside the
    cell (1 for a pixel wholly inside, less for one cut by an edge, 0 for a padding tap)
    and K the most pixels any cell touches (``ceil(s) + 1`` at most for cells of length
    ``s``). ``0 <= edges <= size``.
    """
    edges = np.asarray(edges, dtype=np.float64)
    low, high = edges[:-1], edges[1:]
    first = np.floor(low).astype(np.intp)
    taps = max(1, math.ceil(float((high - first).max()))) if len(low) else 1
    index = first[None, :] + np.arange(taps)[:, None]
    weight = np.clip(np.minimum(high, index + 1) - np.maximum(low, index), 0, None)
    return np.minimum(index, size - 1), weight.astype(np.float32)


def _integrate(values: np.ndarray, edges: np.ndarray, axis: int) -> np.ndarray:
    """Sums of ``values`` over the cells of ``edges`` along ``axis`` (float32, :func:`box_taps`).

    One gather and one multiply-add per tap, so the cost is about one pass over the input
    however the cells fall; whole pixels have weight 1, so integer edges give exact sums
    (integers below 2**24 are exact in float32).
    """
    index, weight = box_taps(edges, values.shape[axis])
    shape = [1] * values.ndim
    shape[axis] = weight.shape[1]
    out_shape = list(values.shape)
    out_shape[axis] = weight.shape[1]
    sums = np.zeros(out_shape, dtype=np.float32)
    term: np.ndarray | None = None
    for taken, scale in zip(index, weight, strict=True):
        used = np.flatnonzero(scale)
        if len(used) < len(scale) // 2:
            # A tap few cells reach (the last one, for s just above an integer): only those.
            if len(used):
                where: list[slice | np.ndarray] = [slice(None)] * values.ndim
                where[axis] = used
                part = np.take(values, taken[used], axis=axis) * scale[used].reshape(
                    [len(used) if i == axis else 1 for i in range(values.ndim)]
                )
                sums[tuple(where)] += part
            continue
        pixels = np.take(values, taken, axis=axis)
        if (scale == 1).all():
            np.add(sums, pixels, out=sums)  # cast on the fly: no float copy of the input
            continue
        if term is None:
            term = np.empty(out_shape, dtype=np.float32)
        np.multiply(pixels, scale.reshape(shape), out=term)
        np.add(sums, term, out=sums)
    return sums


def area_sums(pixels: np.ndarray, row_edges: np.ndarray, col_edges: np.ndarray) -> np.ndarray:
    """Area integrals of ``pixels`` over the cells of a grid of fractional edges.

    Cell (i, j) is ``[row_edges[i], row_edges[i + 1]) x [col_edges[j], col_edges[j + 1])``
    in pixel units; the result (float32, one value per cell and channel) is
    ``sum_p w_p x_p`` with ``w_p`` the area of pixel p inside the cell. The weights are
    separable (``w_p`` = row overlap x column overlap), so columns then rows are summed
    with :func:`box_taps`: the cost is linear in the pixels whatever the ratio, with no
    dense weight matrix. Integer edges give exact block sums; dividing by the cell areas
    gives area means. Edges must lie in ``[0, size]`` of their axis.
    """
    # Columns first: their gathers are the slow, strided ones, and cheapest on the uint8 input.
    cols = _integrate(pixels, np.asarray(col_edges, dtype=np.float64), axis=1)
    return _integrate(cols, np.asarray(row_edges, dtype=np.float64), axis=0)


SQUARE_TOLERANCE = 0.01
"""How far, as a fraction, a file's µm/px across (mpp-x) and down (mpp-y) may differ for
its pixels to count as square: a patch of non-square pixels is tissue stretched."""


def _mpp_of(handle: Any, backend: str, axis: str = "x") -> float | None:
    value = handle.properties.get(f"{backend}.mpp-{axis}")
    try:
        mpp = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return mpp if mpp and mpp > 0 else None


def _check_square_pixels(handle: Any, backend: str) -> None:
    across, down = _mpp_of(handle, backend, "x"), _mpp_of(handle, backend, "y")
    if across is not None and down is not None and abs(across - down) > SQUARE_TOLERANCE * across:
        raise ValueError(f"its pixels are not square ({across:.4g} µm across, {down:.4g} µm "
                         "down): its patches would be stretched tissue")  # fmt: skip


def _probe(handle: Any) -> None:
    """Decode one pixel of the coarsest level, so a file whose pixels cannot be read fails
    now, as must one whose pixels are not 8-bit RGB(A) (a greyscale or 16-bit image, which
    tiffslide hands over as it is and openslide converts)."""
    level = handle.level_count - 1
    pixel = np.asarray(handle.read_region((0, 0), level, (1, 1)))
    channels = pixel.shape[2] if pixel.ndim == 3 else 1
    if pixel.dtype != np.uint8 or channels not in (3, 4):
        raise ValueError(f"its pixels are {channels} channel(s) of {pixel.dtype}, "
                         "not 8-bit RGB")  # fmt: skip


def open_slide(
    path: str | os.PathLike[str],
    backend: Backend = "auto",
    *,
    mpp: float | None = None,
) -> Slide:
    """Open a whole-slide image.

    ``backend="auto"`` tries openslide, then tiffslide. ``mpp`` overrides the file's
    resolution (for files that lack one). The file is probed by decoding one pixel, so a
    slide that opens but cannot be decoded fails here rather than mid-pipeline, as does
    one whose pixels are not square (:data:`SQUARE_TOLERANCE`).
    """
    path = Path(path)
    if backend not in (*BACKENDS, "auto"):
        raise ValueError(f"unknown slide backend {backend!r}; choose from {(*BACKENDS, 'auto')}")
    if not path.is_file():
        raise SlideReadError(path, {"filesystem": "no such file"})
    order = BACKENDS if backend == "auto" else (backend,)
    reasons: dict[str, str] = {}
    for name in order:
        handle = None
        try:
            handle = _OPENERS[name](path)
            _probe(handle)
            if mpp is None:  # a resolution given overrides the file's
                _check_square_pixels(handle, name)
        except Exception as error:
            reasons[name] = describe(error)
            if handle is not None:
                handle.close()
            continue
        slide_mpp = mpp if mpp is not None else _mpp_of(handle, name)
        if reasons:
            log.debug("%s opened with %s after %s", path, name, reasons)
        return Slide(path, name, handle, slide_mpp)
    raise SlideReadError(path, reasons)


def is_synthetic_slide(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a slide that :mod:`wsi.synth` wrote (its marker in the first
    page's TIFF ImageDescription, read from the header alone); ``False`` for any other
    file, or one that is not a TIFF."""
    import tifffile

    from wsi.synth.config import SYNTHETIC_MARKER

    try:
        with tifffile.TiffFile(path) as tiff:
            return bool(tiff.pages) and f"({SYNTHETIC_MARKER}" in tiff.pages[0].description
    except (OSError, ValueError, tifffile.TiffFileError):
        return False
