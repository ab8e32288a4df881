"""The plan of a slide: tissue, lesions and nuclei, every random draw made once."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import ndimage
from skimage.draw import polygon as fill_polygon
from skimage.measure import points_in_poly

from wsi.catalogue import PATIENTS_PER_CENTER
from wsi.synth.config import _STREAM_SLIDE, SynthConfig
from wsi.synth.rules import max_feret_diameter
from wsi.synth.stain import CenterLook, StainProfile, center_look

_HEALTHY_NUCLEUS_RADIUS_UM = (1.1, 1.7)
_TUMOUR_NUCLEUS_RADIUS_UM = (2.2, 3.6)
_HEALTHY_AREA_PER_NUCLEUS_UM2 = 50.0
_TUMOUR_AREA_PER_NUCLEUS_UM2 = 60.0
_HEALTHY_NUCLEUS_LOAD = (0.85, 1.15)
_TUMOUR_NUCLEUS_LOAD = (0.5, 0.8)
_TISSUE_FIELD_DOWNSAMPLE = 16
_TEXTURE_FIELD_DOWNSAMPLE = 8


# --------------------------------------------------------------------------------------
# The plan of a slide: tissue, lesions, nuclei (everything random, drawn once)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Lesion:
    polygon: np.ndarray  # (M, 2) level-0 x, y
    carve_outs: tuple[np.ndarray, ...]
    extent_px: float


@dataclass(frozen=True, eq=False)
class _Nuclei:
    """Nuclei sorted by y: centre, semi-axes, angle, hematoxylin load."""

    x: np.ndarray
    y: np.ndarray
    radius_a: np.ndarray
    radius_b: np.ndarray
    angle: np.ndarray
    load: np.ndarray

    @staticmethod
    def concatenate(parts: Sequence[_Nuclei]) -> _Nuclei:
        fields = [
            np.concatenate([getattr(p, name) for p in parts]).astype(np.float32)
            for name in ("x", "y", "radius_a", "radius_b", "angle", "load")
        ]
        order = np.argsort(fields[1], kind="stable")
        return _Nuclei(*(f[order] for f in fields))


@dataclass(frozen=True, eq=False)
class SlidePlan:
    """Everything random about one slide; rendering is a pure function of it."""

    center: int
    patient: int
    node: int
    width: int
    height: int
    mpp: float
    seed: int
    look: CenterLook  # the centre's, with this slide's stain jitter
    tissue_field: np.ndarray  # > 0 on tissue, at 1/_TISSUE_FIELD_DOWNSAMPLE
    fibre_field: np.ndarray  # stroma texture, at 1/_TEXTURE_FIELD_DOWNSAMPLE
    lesions: tuple[Lesion, ...]
    nuclei: _Nuclei = field(repr=False)

    @property
    def stain(self) -> StainProfile:
        return self.look.stain

    @property
    def metastases(self) -> tuple[np.ndarray, ...]:
        return tuple(lesion.polygon for lesion in self.lesions)

    @property
    def carve_outs(self) -> tuple[np.ndarray, ...]:
        return tuple(c for lesion in self.lesions for c in lesion.carve_outs)


def _irregular_polygon(
    rng: np.random.Generator, vertices: int, roughness: float
) -> tuple[np.ndarray, np.ndarray]:
    """A star-shaped irregular polygon around the origin: (angles, radii), radii ~ 1."""
    steps = np.arange(vertices) + rng.uniform(-0.35, 0.35, vertices)
    angles = 2 * np.pi * steps / vertices + rng.uniform(0, 2 * np.pi)
    radii = np.ones(vertices)
    for harmonic in range(2, 6):
        amplitude = rng.uniform(0, roughness / harmonic * 2)
        radii += amplitude * np.cos(harmonic * angles + rng.uniform(0, 2 * np.pi))
    radii += rng.uniform(-0.05, 0.05, vertices)
    return angles, np.clip(radii, 0.45, None)


def _round_vertices(vertices: np.ndarray) -> np.ndarray:
    """Round to 0.1 px, then to float32 as ASAP stores them, so files and plan agree."""
    return np.round(vertices, 1).astype(np.float32).astype(np.float64)


def _inscribed_distance(polygon: np.ndarray, point: np.ndarray) -> float:
    """Distance from ``point`` to the nearest edge of ``polygon``."""
    a = polygon
    b = np.roll(polygon, -1, axis=0)
    ab = b - a
    t = np.clip(np.einsum("ij,ij->i", point - a, ab) / np.einsum("ij,ij->i", ab, ab), 0, 1)
    nearest = a + t[:, None] * ab
    return float(np.min(np.linalg.norm(nearest - point, axis=1)))


def _lesion_extents(rng: np.random.Generator, label: str, config: SynthConfig) -> list[float]:
    """Extents (level-0 px) of a slide's lesions, the first being the one that sets the label."""
    itc_px = config.itc_max_um / config.mpp
    macro_px = config.macro_min_um / config.mpp
    short_side = min(config.width, config.height)
    if label == "negative":
        return []
    if label == "itc":
        return [rng.uniform(0.35, 0.9) * itc_px for _ in range(rng.integers(1, 4))]
    if label == "micro":
        main = rng.uniform(max(1.2 * itc_px, 0.3 * macro_px), 0.9 * macro_px)
    elif label == "macro":
        main = rng.uniform(1.1 * macro_px, max(1.15 * macro_px, 0.55 * short_side))
    else:
        raise ValueError(f"unknown label {label!r}")
    satellites = [
        rng.uniform(0.4 * itc_px, min(0.9 * main, 0.6 * macro_px))
        for _ in range(rng.integers(0, 3))
    ]
    return [main, *satellites]


def _upsample(
    field_: np.ndarray, downsample: int, y0: int, y1: int, x0: int, x1: int
) -> np.ndarray:
    """Bilinear interpolation of a low-resolution field onto level-0 block [y0:y1, x0:x1].

    Low-resolution sample (row i, column k) sits at level-0 (x, y) = (k, i) * downsample;
    ``x0`` must be a multiple of ``downsample`` and the field must reach one sample past
    ``x1`` and ``y1``.
    """
    rows_low = field_.shape[0]
    fy = np.arange(y0, y1, dtype=np.float32) / downsample
    iy = np.minimum(fy.astype(np.int64), rows_low - 2)
    wy = (fy - iy)[:, None]
    first = x0 // downsample
    blocks = -(-(x1 - x0) // downsample)
    columns = field_[:, first : first + blocks + 1]
    rows = columns[iy] * (1 - wy) + columns[iy + 1] * wy
    left = rows[:, :blocks, None]
    step = rows[:, 1 : blocks + 1, None] - left
    weights = np.arange(downsample, dtype=np.float32) / downsample
    out = (left + step * weights).reshape(len(rows), blocks * downsample)
    return out[:, : x1 - x0]


def _sample_field(field_: np.ndarray, downsample: int, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Bilinear samples of a low-resolution field at level-0 points (same grid as above)."""
    coords = np.stack([y / downsample, x / downsample])
    return ndimage.map_coordinates(field_, coords, order=1, mode="nearest")


def _tissue_field(rng: np.random.Generator, config: SynthConfig) -> np.ndarray:
    """A low-resolution field, > 0 on tissue: one to three noisy blobs away from the edges."""
    ds = _TISSUE_FIELD_DOWNSAMPLE
    rows, cols = -(-config.height // ds) + 1, -(-config.width // ds) + 1
    y, x = np.mgrid[0:rows, 0:cols].astype(np.float64) * ds
    short = min(config.width, config.height)
    blob_field = np.full((rows, cols), -np.inf)
    for _ in range(int(rng.integers(1, 4))):
        cx = rng.uniform(0.3, 0.7) * config.width
        cy = rng.uniform(0.3, 0.7) * config.height
        a, b = rng.uniform(0.2, 0.42, 2) * short
        theta = rng.uniform(0, np.pi)
        u = ((x - cx) * np.cos(theta) + (y - cy) * np.sin(theta)) / a
        v = (-(x - cx) * np.sin(theta) + (y - cy) * np.cos(theta)) / b
        blob_field = np.maximum(blob_field, 1 - np.sqrt(u**2 + v**2))
    noise = ndimage.gaussian_filter(rng.standard_normal((rows, cols)), 0.06 * min(rows, cols))
    noise /= noise.std() + 1e-12
    values = blob_field + 0.3 * noise
    # Fade towards the borders so that the tissue rarely touches them and never squarely.
    to_border = np.minimum.reduce([x, y, config.width - x, config.height - y]) / (0.2 * short)
    values -= 1.5 * np.clip(1 - to_border, 0, 1) ** 2
    coverage = rng.uniform(*config.tissue_fraction)
    values -= np.quantile(values, 1 - coverage)
    return values.astype(np.float32)


def _fibre_field(rng: np.random.Generator, config: SynthConfig) -> np.ndarray:
    """Low-resolution anisotropic noise (std 1): streaks of stroma."""
    ds = _TEXTURE_FIELD_DOWNSAMPLE
    rows, cols = -(-config.height // ds) + 1, -(-config.width // ds) + 1
    side = math.ceil(math.hypot(rows, cols)) + 2
    fine = ndimage.gaussian_filter(rng.standard_normal((side, side)), (0.7, 3.0))
    coarse = ndimage.gaussian_filter(rng.standard_normal((side, side)), (6.0, 2.0))
    values = fine / (fine.std() + 1e-12) + 0.6 * coarse / (coarse.std() + 1e-12)
    # Streaks along a random direction: rotate the square, keep its middle.
    values = ndimage.rotate(values, rng.uniform(0, 180), reshape=False, order=1, mode="reflect")
    top, left = (side - rows) // 2, (side - cols) // 2
    values = values[top : top + rows, left : left + cols]
    return ((values - values.mean()) / (values.std() + 1e-12)).astype(np.float32)


def _place_lesions(
    rng: np.random.Generator,
    extents: Sequence[float],
    tissue: np.ndarray,
    config: SynthConfig,
) -> list[Lesion]:
    ds = _TISSUE_FIELD_DOWNSAMPLE
    depth = ndimage.distance_transform_edt(tissue > 0) * ds  # level-0 px to the tissue edge
    rows, cols = np.nonzero(depth > 0)
    placed: list[tuple[np.ndarray, float]] = []
    lesions = []
    for rank, extent in enumerate(extents):
        angles, radii = _irregular_polygon(rng, int(rng.integers(12, 41)), roughness=0.22)
        offsets = np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)
        offsets *= extent / max_feret_diameter(offsets)
        reach = float(np.linalg.norm(offsets, axis=1).max())
        centres = np.stack([cols, rows], axis=1).astype(np.float64) * ds
        fits = depth[rows, cols] >= reach + ds
        for other, other_reach in placed:
            fits &= np.linalg.norm(centres - other, axis=1) > reach + other_reach + ds
        if fits.any():
            choice = rng.choice(np.flatnonzero(fits))
        else:  # the deepest point; the tissue is extended under the lesion afterwards
            choice = int(np.argmax(depth[rows, cols]))
        centre = centres[choice] + rng.uniform(-ds / 2, ds / 2, 2)
        polygon = _round_vertices(centre + offsets)
        carve_outs: tuple[np.ndarray, ...] = ()
        big = extent >= 0.5 * config.macro_min_um / config.mpp
        if big and (rank == 0 or rng.random() < 0.5) and rng.random() < 0.6:
            carve = _carve_out(rng, polygon, centre)
            carve_outs = (carve,) if carve is not None else ()
        placed.append((centre, reach))
        lesions.append(Lesion(polygon, carve_outs, max_feret_diameter(polygon)))
    return lesions


def _carve_out(
    rng: np.random.Generator, lesion: np.ndarray, centre: np.ndarray
) -> np.ndarray | None:
    """A small healthy island strictly inside a lesion, or None if it does not fit."""
    inscribed = _inscribed_distance(lesion, centre)
    radius = rng.uniform(0.3, 0.45) * inscribed
    direction = rng.uniform(0, 2 * np.pi)
    shift = rng.uniform(0, 0.4) * (inscribed - 1.2 * radius)
    middle = centre + shift * np.array([np.cos(direction), np.sin(direction)])
    angles, radii = _irregular_polygon(rng, int(rng.integers(12, 21)), roughness=0.08)
    radii = radii / radii.max() * radius
    carve = _round_vertices(middle + np.stack([radii * np.cos(angles), radii * np.sin(angles)], 1))
    if radius < 4 or not points_in_poly(carve, lesion).all():
        return None
    return carve


def _in_tumour(points: np.ndarray, lesions: Sequence[Lesion]) -> np.ndarray:
    """Which (x, y) points lie in a lesion and outside its carve-outs."""
    inside = np.zeros(len(points), dtype=bool)
    for lesion in lesions:
        here = points_in_poly(points, lesion.polygon)
        for carve in lesion.carve_outs:
            here &= ~points_in_poly(points, carve)
        inside |= here
    return inside


def _draw_nuclei(
    rng: np.random.Generator,
    count: int,
    box: tuple[float, float, float, float],
    radius_um: tuple[float, float],
    elongation: float,
    load: tuple[float, float],
    mpp: float,
) -> _Nuclei:
    x0, y0, x1, y1 = box
    x = rng.uniform(x0, x1, count)
    y = rng.uniform(y0, y1, count)
    radius = rng.uniform(*radius_um, count) / mpp
    aspect = rng.uniform(1.0, elongation, count)
    return _Nuclei(
        x=x,
        y=y,
        radius_a=radius * np.sqrt(aspect),
        radius_b=radius / np.sqrt(aspect),
        angle=rng.uniform(0, np.pi, count),
        load=rng.uniform(*load, count),
    )


def _scaled(interval: tuple[float, float], factor: float) -> tuple[float, float]:
    return interval[0] * factor, interval[1] * factor


def _keep(nuclei: _Nuclei, mask: np.ndarray) -> _Nuclei:
    return _Nuclei(
        *(getattr(nuclei, n)[mask] for n in ("x", "y", "radius_a", "radius_b", "angle", "load"))
    )


def plan_slide(config: SynthConfig, patient: int, node: int, label: str) -> SlidePlan:
    """Draw everything random about a slide from the stream (seed, patient, node)."""
    rng = np.random.default_rng([config.seed, patient, node, _STREAM_SLIDE])
    center = patient // PATIENTS_PER_CENTER
    look = center_look(center)
    look = replace(look, stain=look.stain.jittered(rng))
    tissue = _tissue_field(rng, config)
    fibre = _fibre_field(rng, config)
    lesions = _place_lesions(rng, _lesion_extents(rng, label, config), tissue, config)

    # Lesions lie in tissue: extend the tissue under (and a little around) each of them.
    ds = _TISSUE_FIELD_DOWNSAMPLE
    under = np.zeros(tissue.shape, dtype=bool)
    for lesion in lesions:
        rr, cc = fill_polygon(lesion.polygon[:, 1] / ds, lesion.polygon[:, 0] / ds, tissue.shape)
        under[rr, cc] = True
    if under.any():
        under = ndimage.binary_dilation(under, iterations=3)
        tissue = np.where(under, np.maximum(tissue, 0.05), tissue).astype(np.float32)

    mpp = config.mpp
    area_um2 = config.width * config.height * mpp * mpp
    healthy = _draw_nuclei(
        rng,
        int(rng.poisson(area_um2 / _HEALTHY_AREA_PER_NUCLEUS_UM2)),
        (0, 0, config.width, config.height),
        _scaled(_HEALTHY_NUCLEUS_RADIUS_UM, look.nucleus_scale),
        1.25,
        _HEALTHY_NUCLEUS_LOAD,
        mpp,
    )
    points = np.stack([healthy.x, healthy.y], axis=1)
    keep = _sample_field(tissue, ds, healthy.x, healthy.y) > 0
    keep[keep] &= ~_in_tumour(points[keep], lesions)
    parts = [_keep(healthy, keep)]
    for lesion in lesions:
        (x0, y0), (x1, y1) = lesion.polygon.min(axis=0), lesion.polygon.max(axis=0)
        box_um2 = (x1 - x0) * (y1 - y0) * mpp * mpp
        tumour = _draw_nuclei(
            rng,
            int(rng.poisson(box_um2 / _TUMOUR_AREA_PER_NUCLEUS_UM2)),
            (x0, y0, x1, y1),
            _scaled(_TUMOUR_NUCLEUS_RADIUS_UM, look.nucleus_scale),
            1.7,
            _TUMOUR_NUCLEUS_LOAD,
            mpp,
        )
        inside = _in_tumour(np.stack([tumour.x, tumour.y], axis=1), [lesion])
        parts.append(_keep(tumour, inside))
    return SlidePlan(
        center=center,
        patient=patient,
        node=node,
        width=config.width,
        height=config.height,
        mpp=mpp,
        seed=config.seed,
        look=look,
        tissue_field=tissue,
        fibre_field=fibre,
        lesions=tuple(lesions),
        nuclei=_Nuclei.concatenate(parts),
    )
