"""Whole-slide images behind one small interface, read by openslide or tiffslide.

Both libraries expose the OpenSlide API, so one :class:`Slide` wraps either handle and
adds what the pipeline relies on: level-0 coordinates everywhere, RGB ``uint8`` arrays
with transparent or missing areas composited onto white, microns per pixel, the tile
grid, and thumbnails at a requested resolution. Every failure to open or read a slide
raises :class:`SlideReadError`, which names the file and what each backend said.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np

Backend = Literal["openslide", "tiffslide", "auto"]
BACKENDS: tuple[str, ...] = ("openslide", "tiffslide")
WHITE = 255

log = logging.getLogger(__name__)


class SlideReadError(Exception):
    """A slide could not be opened or read; ``reasons`` maps each backend tried to its error."""

    def __init__(self, path: str | os.PathLike[str], reasons: dict[str, str]) -> None:
        self.path = Path(path)
        self.reasons = dict(reasons)
        detail = "; ".join(f"{backend}: {reason}" for backend, reason in self.reasons.items())
        super().__init__(f"cannot read slide {self.path} ({detail})")

    def __reduce__(self) -> tuple[type, tuple[Path, dict[str, str]]]:
        return type(self), (self.path, self.reasons)


def _open_openslide(path: Path) -> Any:
    import openslide

    return openslide.OpenSlide(str(path))


def _open_tiffslide(path: Path) -> Any:
    import tiffslide

    return tiffslide.TiffSlide(str(path))


_OPENERS: dict[str, Callable[[Path], Any]] = {
    "openslide": _open_openslide,
    "tiffslide": _open_tiffslide,
}


def _describe(error: BaseException) -> str:
    text = str(error).strip() or "no message"
    return f"{type(error).__name__}: {text}"


def composite_on_white(pixels: np.ndarray) -> np.ndarray:
    """RGB(A) ``uint8`` -> RGB ``uint8``, alpha-blending onto white where alpha < 255."""
    if pixels.ndim != 3:
        raise ValueError(f"expected an (H, W, C) image, got shape {pixels.shape}")
    if pixels.shape[2] == 3:
        return pixels
    rgb = pixels[..., :3].astype(np.uint16)
    alpha = pixels[..., 3:4].astype(np.uint16)
    blended = (rgb * alpha + WHITE * (255 - alpha) + 127) // 255
    return blended.astype(np.uint8)


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
        props = self._handle.properties
        width = props.get(f"{self.backend}.level[0].tile-width")
        height = props.get(f"{self.backend}.level[0].tile-height")
        if width is None or height is None:
            return None
        return int(width), int(height)

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
            raise SlideReadError(self.path, {self.backend: _describe(error)}) from error
        pixels = composite_on_white(np.asarray(region))
        return self._whiten_outside(pixels, x, y, level)

    def _whiten_outside(self, pixels: np.ndarray, x: int, y: int, level: int) -> np.ndarray:
        # openslide returns transparent pixels beyond the slide's edge, tiffslide black ones.
        downsample = self.level_downsamples[level]
        level_width, level_height = self.level_dimensions[level]
        height, width = pixels.shape[:2]
        cols = np.floor(x / downsample + np.arange(width))
        rows = np.floor(y / downsample + np.arange(height))
        outside_cols = (cols < 0) | (cols >= level_width)
        outside_rows = (rows < 0) | (rows >= level_height)
        if outside_cols.any() or outside_rows.any():
            pixels = pixels.copy()
            pixels[:, outside_cols] = WHITE
            pixels[outside_rows, :] = WHITE
        return pixels

    def read_level(self, level: int) -> np.ndarray:
        """A whole level as RGB. Refuses levels over 64 megapixels: never load level 0."""
        width, height = self.level_dimensions[level]
        if width * height > 64 * 2**20:
            raise MemoryError(
                f"{self.path}: level {level} is {width}x{height}; read it by regions instead"
            )
        return self.read_region(0, 0, level, (width, height))

    def thumbnail_at_downsample(self, downsample: float) -> np.ndarray:
        """The slide at ``downsample`` relative to level 0, read from the nearest finer level.

        The output has ``floor(level-0 size / downsample)`` pixels per side; it is made by
        area averaging from the coarsest level that is at least as fine as requested.
        """
        if downsample < 1:
            raise ValueError(f"{self.path}: downsample {downsample} is finer than level 0")
        level = self.best_level_for_downsample(downsample)
        pixels = self.read_level(level)
        width0, height0 = self.dimensions
        target = (max(1, int(height0 / downsample)), max(1, int(width0 / downsample)))
        return _resize_area(pixels, target)

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


def _resize_area(pixels: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Area-average ``pixels`` to ``shape`` (rows, cols); exact block means when it divides."""
    rows, cols = shape
    if pixels.shape[:2] == (rows, cols):
        return pixels
    from skimage.transform import resize

    resized = resize(pixels, (rows, cols), order=1, anti_aliasing=True, preserve_range=True)
    return np.clip(np.rint(resized), 0, 255).astype(np.uint8)


def _mpp_of(handle: Any, backend: str) -> float | None:
    value = handle.properties.get(f"{backend}.mpp-x")
    try:
        mpp = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return mpp if mpp and mpp > 0 else None


def _probe(handle: Any) -> None:
    """Decode one pixel of the coarsest level, so a file whose pixels cannot be read fails now."""
    level = handle.level_count - 1
    handle.read_region((0, 0), level, (1, 1))


def open_slide(
    path: str | os.PathLike[str],
    backend: Backend = "auto",
    *,
    mpp: float | None = None,
) -> Slide:
    """Open a whole-slide image.

    ``backend="auto"`` tries openslide, then tiffslide. ``mpp`` overrides the file's
    resolution (for files that lack one). The file is probed by decoding one pixel, so a
    slide that opens but cannot be decoded fails here rather than mid-pipeline.
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
        except Exception as error:
            reasons[name] = _describe(error)
            if handle is not None:
                handle.close()
            continue
        slide_mpp = mpp if mpp is not None else _mpp_of(handle, name)
        if reasons:
            log.debug("%s opened with %s after %s", path, name, reasons)
        return Slide(path, name, handle, slide_mpp)
    raise SlideReadError(path, reasons)
