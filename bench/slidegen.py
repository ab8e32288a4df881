"""A slide of any size, up to Camelyon-17's, written tile by tile: the preprocessing bench's input.

The geometry is a smooth signed field ``f`` on a grid of nodes ``NODE`` level-0 pixels
apart: for each of ``pieces`` tissue sections, ``R(θ) - ρ`` (level-0 pixels) around its
centre, with ``R(θ) = R (1 + Σ_k a_k cos(kθ + φ_k))`` a lobed radius; ``f`` is the maximum
over the sections plus a smooth noise, and tissue is ``f > t`` with ``t`` the quantile that
makes ``tissue_fraction`` of the slide tissue. Tissue coverage is
``α = clip((f - t) / RAMP + 1/2, 0, 1)``, bilinear between nodes.

Every level is rendered from that geometry at its own resolution (no level is made from
another, so nothing larger than a tile is ever in memory): a tile whose nodes all have
``α = 1`` is one of a few pre-encoded tissue textures of that level, one whose nodes all
have ``α = 0`` is the one pre-encoded glass tile, and only the tiles on a tissue edge are
blended and JPEG-encoded. Tiles go to tifffile as encoded bytes, exactly as tifffile would
encode them itself (YCbCr 2x2, the same quality), so the file is the tiled pyramidal
BigTIFF of :func:`wsi.synth.write_pyramidal_tiff`, which OpenSlide and tiffslide read.

A lesion (an irregular polygon well inside the largest section) is written beside it as
ASAP XML. :func:`cached_slide` keeps the pair between runs, keyed on the parameters.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import imagecodecs
import numpy as np
import tifffile
from scipy import ndimage

from plumbing.atomic import atomic_path
from wsi.synth import auto_level_count, level_dimensions, write_asap_xml
from wsi.synth.tiff import halve

log = logging.getLogger(__name__)

GENERATOR_VERSION = 1  # part of the cache key: bump when the rendering changes
NODE = 64  # level-0 pixels between the geometry's nodes
RAMP = 96.0  # level-0 pixels over which tissue fades into glass
VARIANTS = 8  # pre-encoded tissue textures per level
GLASS = np.array([238, 236, 242], dtype=np.float32)
STROMA = np.array([226, 150, 196], dtype=np.float32)
NUCLEUS = np.array([72, 48, 138], dtype=np.float32)
CACHE = Path(__file__).resolve().parent / ".cache"


@dataclass(frozen=True)
class SlideSpec:
    """Everything the written slide depends on."""

    width: int = 100_000
    height: int = 200_000
    mpp: float = 0.243
    tile: int = 512
    jpeg_quality: int = 85
    tissue_fraction: float = 0.20
    pieces: int = 4
    seed: int = 17

    @property
    def key(self) -> str:
        text = json.dumps({**asdict(self), "version": GENERATOR_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def gigapixels(self) -> float:
        return self.width * self.height / 1e9


@dataclass(frozen=True)
class WrittenSlide:
    """A slide on disk, its lesion annotation and how it was made."""

    path: Path
    annotation: Path
    spec: SlideSpec
    write_seconds: float
    tissue_fraction: float
    pieces: int
    levels: int
    bytes: int


# --------------------------------------------------------------------------------------
# Geometry
# --------------------------------------------------------------------------------------


def _centres(spec: SlideSpec, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """Section centres along the slide's long axis and their mean radius (level-0 px)."""
    long_side, short_side = max(spec.width, spec.height), min(spec.width, spec.height)
    area = spec.tissue_fraction * spec.width * spec.height / spec.pieces
    radius = min(math.sqrt(area / math.pi), 0.42 * short_side, 0.42 * long_side / spec.pieces)
    along = (np.arange(spec.pieces) + 0.5) * long_side / spec.pieces
    along += rng.uniform(-0.05, 0.05, spec.pieces) * long_side / spec.pieces
    across = short_side / 2 + rng.uniform(-0.08, 0.08, spec.pieces) * short_side
    if spec.width >= spec.height:
        return np.stack([along, across], axis=1), radius
    return np.stack([across, along], axis=1), radius


def tissue_field(spec: SlideSpec) -> np.ndarray:
    """Tissue coverage α in [0, 1] at the nodes, (rows, cols) float32 (module docstring)."""
    rng = np.random.default_rng(spec.seed)
    rows, cols = spec.height // NODE + 2, spec.width // NODE + 2
    ys = (np.arange(rows, dtype=np.float32) * NODE)[:, None]
    xs = (np.arange(cols, dtype=np.float32) * NODE)[None, :]
    centres, radius = _centres(spec, rng)
    field = np.full((rows, cols), -np.inf, dtype=np.float32)
    for cx, cy in centres:
        theta = np.arctan2(ys - np.float32(cy), xs - np.float32(cx))
        lobes = np.ones_like(theta)
        for k in range(2, 6):
            lobes += np.float32(rng.uniform(0.02, 0.16) / k * 2) * np.cos(
                k * theta + np.float32(rng.uniform(0, 2 * np.pi))
            )
        rho = np.hypot(ys - np.float32(cy), xs - np.float32(cx))
        np.maximum(field, np.float32(radius * rng.uniform(0.8, 1.15)) * lobes - rho, out=field)
        del theta, lobes, rho
    sigma = max(2.0, radius / NODE / 6)
    noise = ndimage.gaussian_filter(rng.standard_normal((rows, cols)).astype(np.float32), sigma)
    noise *= np.float32(0.08 * radius / (noise.std() + 1e-6))
    field += noise
    del noise
    inside = field[: spec.height // NODE, : spec.width // NODE]
    threshold = np.quantile(inside, 1 - spec.tissue_fraction)
    field -= np.float32(threshold - RAMP / 2)
    field *= np.float32(1 / RAMP)
    return np.clip(field, 0, 1, out=field)


def lesion_polygon(spec: SlideSpec, alpha: np.ndarray) -> np.ndarray:
    """An irregular lesion of about 1.5 mm, centred on the deepest tissue of the slide."""
    rng = np.random.default_rng(spec.seed + 1)
    depth = ndimage.distance_transform_edt(alpha >= 1)
    row, col = np.unravel_index(int(np.argmax(depth)), depth.shape)
    radius = min(750 / spec.mpp, 0.5 * float(depth[row, col]) * NODE)
    angles = np.linspace(0, 2 * np.pi, 48, endpoint=False)
    radii = radius * (1 + 0.15 * np.sin(3 * angles + rng.uniform(0, 6)))
    radii *= rng.uniform(0.9, 1.1, len(angles))
    return np.stack(
        [col * NODE + radii * np.cos(angles), row * NODE + radii * np.sin(angles)], axis=1
    )


# --------------------------------------------------------------------------------------
# Pixels
# --------------------------------------------------------------------------------------


def _texture(rng: np.random.Generator, size: int) -> np.ndarray:
    """One level-0 tile of tissue: eosin stroma with fibres, haematoxylin nuclei, grain."""
    shape = (size, size)
    fibre = ndimage.gaussian_filter(rng.standard_normal(shape).astype(np.float32), (0.7, 4.0))
    fibre = np.rot90(fibre, int(rng.integers(4))) * 24
    impulses = (rng.random(shape, dtype=np.float32) < rng.uniform(0.002, 0.006)).astype(np.float32)
    nuclei = np.clip(ndimage.gaussian_filter(impulses, rng.uniform(1.8, 2.6)) * 60, 0, 1)
    # Mild, slightly blurred grain: real tissue tiles compress to about 40-60 KB at q85.
    grain = ndimage.gaussian_filter(rng.random(shape, dtype=np.float32) * 12 - 6, 0.8)
    tone = STROMA * np.float32(rng.uniform(0.9, 1.02))
    rgb = (tone + (fibre + grain)[..., None]) * (1 - nuclei[..., None])
    rgb += NUCLEUS * nuclei[..., None]
    return np.clip(rgb, 0, 255).astype(np.uint8)


def level_textures(rng: np.random.Generator, size: int, levels: int) -> list[list[np.ndarray]]:
    """``VARIANTS`` tissue tiles per level; level k's are 2x2 mosaics of level k-1's, halved.

    Each halved mosaic is blurred a little, as a scanner's own pyramid is (and so that the
    coarser levels compress like real ones instead of getting busier at every level).
    """
    textures = [[_texture(rng, size) for _ in range(VARIANTS)]]
    for _ in range(1, levels):
        previous = textures[-1]
        current = []
        for _ in range(VARIANTS):
            picks = [previous[int(i)] for i in rng.integers(VARIANTS, size=4)]
            top, bottom = np.concatenate(picks[:2], axis=1), np.concatenate(picks[2:], axis=1)
            mosaic = np.concatenate([top, bottom], axis=0)
            smooth = ndimage.gaussian_filter(halve(mosaic).astype(np.float32), (0.7, 0.7, 0))
            current.append(np.clip(smooth + 0.5, 0, 255).astype(np.uint8))
        textures.append(current)
    return textures


def _glass(rng: np.random.Generator, size: int) -> np.ndarray:
    """Empty glass: a faint, smooth unevenness (what a scanner's background looks like)."""
    grain = ndimage.gaussian_filter(rng.standard_normal((size, size)).astype(np.float32), 16)
    grain *= np.float32(1.5 / (grain.std() + 1e-6))
    return np.clip(GLASS + grain[..., None] + 0.5, 0, 255).astype(np.uint8)


def _encode(tile: np.ndarray, quality: int) -> bytes:
    # What tifffile does for compression="jpeg" on RGB: YCbCr, 2x2 chroma subsampling.
    return imagecodecs.jpeg8_encode(
        tile, level=quality, colorspace="RGB", outcolorspace="YCBCR", subsampling=(2, 2)
    )


def _tile_extremes(alpha: np.ndarray, span: int, across: int, down: int) -> tuple[np.ndarray, ...]:
    """Min and max of α over the nodes each tile of ``span`` level-0 px touches (bilinear)."""
    low = ndimage.minimum_filter(alpha, size=3, mode="nearest")
    high = ndimage.maximum_filter(alpha, size=3, mode="nearest")
    starts_r = np.minimum(np.arange(down) * span // NODE, alpha.shape[0] - 1)
    starts_c = np.minimum(np.arange(across) * span // NODE, alpha.shape[1] - 1)
    low = np.minimum.reduceat(np.minimum.reduceat(low, starts_r, axis=0), starts_c, axis=1)
    high = np.maximum.reduceat(np.maximum.reduceat(high, starts_r, axis=0), starts_c, axis=1)
    return low, high


def _edge_alpha(alpha: np.ndarray, x0: float, y0: float, scale: float, size: int) -> np.ndarray:
    """α at the tile's pixels (each ``scale`` level-0 px), sampled every 8 level-0 px or finer."""
    step = max(1, int(8 // scale))
    while size % step:
        step //= 2
    centres = (np.arange(0, size, step) + step / 2) * scale
    grid = np.meshgrid((y0 + centres) / NODE, (x0 + centres) / NODE, indexing="ij")
    coarse = ndimage.map_coordinates(alpha, grid, order=1, mode="nearest").astype(np.float32)
    return np.repeat(np.repeat(coarse, step, 0), step, 1)[..., None]


def _level_tiles(
    spec: SlideSpec,
    alpha: np.ndarray,
    level: int,
    shape: tuple[int, int],
    textures: list[np.ndarray],
    encoded: list[bytes],
    glass: np.ndarray,
    glass_bytes: bytes,
    pool: ThreadPoolExecutor,
) -> Iterator[bytes]:
    """The encoded tiles of one level, row by row; only edge tiles are rendered here."""
    size, scale = spec.tile, float(2**level)
    height, width = shape
    across, down = math.ceil(width / size), math.ceil(height / size)
    low, high = _tile_extremes(alpha, size * 2**level, across, down)
    rng = np.random.default_rng(spec.seed + 100 + level)
    choice = rng.integers(VARIANTS, size=(down, across))

    def tile(index: int) -> bytes:
        row, col = divmod(index, across)
        if low[row, col] >= 1:
            return encoded[choice[row, col]]
        if high[row, col] <= 0:
            return glass_bytes
        weight = _edge_alpha(alpha, col * size * scale, row * size * scale, scale, size)
        texture = textures[choice[row, col]].astype(np.float32)
        blended = glass + (texture - glass) * weight
        return _encode(np.clip(blended + 0.5, 0, 255).astype(np.uint8), spec.jpeg_quality)

    # Edge tiles are encoded on a thread pool (imagecodecs releases the GIL), a bounded
    # batch at a time so encoded tiles never pile up ahead of the writer.
    indices = iter(range(across * down))
    while batch := list(itertools.islice(indices, 256)):
        yield from pool.map(tile, batch)


def write_slide(spec: SlideSpec, path: Path, annotation: Path) -> WrittenSlide:
    """Write the slide of ``spec`` at ``path`` (and its lesion at ``annotation``), streaming."""
    start = time.perf_counter()
    alpha = tissue_field(spec)
    interior = alpha[: spec.height // NODE, : spec.width // NODE]
    tissue = float((interior > 0.5).mean())
    pieces = int(ndimage.label(interior > 0.5)[1])
    write_asap_xml(annotation, {"metastases": [lesion_polygon(spec, alpha)]})

    levels = auto_level_count(spec.width, spec.height)
    dims = level_dimensions(spec.width, spec.height, levels)
    rng = np.random.default_rng(spec.seed + 2)
    textures = level_textures(rng, spec.tile, levels)
    glass = _glass(rng, spec.tile)
    glass_bytes = _encode(glass, spec.jpeg_quality)
    glass_float = glass.astype(np.float32)
    with (
        atomic_path(path) as temporary,
        tifffile.TiffWriter(temporary, bigtiff=True) as writer,
        ThreadPoolExecutor(max(1, len(os.sched_getaffinity(0)))) as pool,
    ):
        for level, (w, h) in enumerate(dims):
            encoded = [_encode(t, spec.jpeg_quality) for t in textures[level]]
            pixels_per_cm = 1e4 / (spec.mpp * 2**level)
            writer.write(
                _level_tiles(
                    spec, alpha, level, (h, w), textures[level], encoded,
                    glass_float, glass_bytes, pool,
                ),
                shape=(h, w, 3),
                dtype=np.uint8,
                photometric="rgb",
                tile=(spec.tile, spec.tile),
                compression="jpeg",
                compressionargs={"level": spec.jpeg_quality},
                resolution=(pixels_per_cm, pixels_per_cm),
                resolutionunit="CENTIMETER",
                subfiletype=1 if level else 0,
                description="Synthetic slide (bench.slidegen)" if level == 0 else None,
                metadata=None,
                software=False,
            )  # fmt: skip
            log.info("level %d (%dx%d) written", level, w, h)
    return WrittenSlide(
        path=path,
        annotation=annotation,
        spec=spec,
        write_seconds=time.perf_counter() - start,
        tissue_fraction=tissue,
        pieces=pieces,
        levels=levels,
        bytes=path.stat().st_size,
    )


def cached_slide(spec: SlideSpec, folder: Path = CACHE) -> WrittenSlide:
    """The slide of ``spec`` under ``folder``, written on the first call for these parameters."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"slide_{spec.width}x{spec.height}_{spec.key}"
    path, annotation = folder / f"{stem}.tif", folder / f"{stem}.xml"
    record = folder / f"{stem}.json"
    if path.is_file() and annotation.is_file() and record.is_file():
        stats = json.loads(record.read_text())
        return WrittenSlide(path=path, annotation=annotation, spec=spec, **stats)
    written = write_slide(spec, path, annotation)
    stats = {
        "write_seconds": written.write_seconds,
        "tissue_fraction": written.tissue_fraction,
        "pieces": written.pieces,
        "levels": written.levels,
        "bytes": written.bytes,
    }
    record.write_text(json.dumps(stats))
    return written
