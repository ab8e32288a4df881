"""A synthetic Camelyon-17-like dataset: pyramidal slides, ASAP annotations, stage labels.

``python -m wsi.synth --out ROOT --patients-per-center N --seed S`` writes the layout of
the real challenge (see ``wsi.catalogue``)::

    ROOT/center_{c}/patient_{ppp}/patient_{ppp}_node_{n}.tif   (--layout flat:
         ROOT/center_{c}/patient_{ppp}_node_{n}.tif)
    ROOT/lesion_annotations/patient_{ppp}_node_{n}.xml          itc, micro and macro slides
    ROOT/stage_labels.csv                                       header "patient,stage"

Rules the generated data follow
-------------------------------
* **Patients and centres.** Centre ``c`` holds patients ``20c .. 20c+N-1`` (N <= 20), so
  centre = patient // 20 as in Camelyon-17; every patient has ``nodes_per_patient`` (5)
  slides, nodes ``0..4``.
* **Node labels.** A node's label is set by the *extent* of its largest lesion, the
  largest distance between two vertices of one ``metastases`` polygon (its maximum
  Feret diameter), against two thresholds:
  ``itc`` if extent < ``T_itc``, ``micro`` if ``T_itc`` <= extent <= ``T_macro``, ``macro``
  if extent > ``T_macro``; ``negative`` when the slide has no lesion. The real thresholds
  are 0.2 mm and 2 mm on sections about 8 mm across; synthetic slides are smaller, so
  both are multiplied by ``label_scale = min(1, slide short side in µm / 8000 µm)``.
  With the defaults (6144 x 4096 px at 0.25 µm/px, short side 1.024 mm) the scale is
  0.128: ``T_itc`` = 25.6 µm (102 px) and ``T_macro`` = 256 µm (1024 px). The CLI prints
  the thresholds it used; :attr:`SynthConfig.itc_max_um` and
  :attr:`SynthConfig.macro_min_um` give them in code.
* **Which labels.** Per patient (with stream ``(seed, patient)``): ``min_negative_nodes``
  (2) nodes are ``negative``, ``min_tumour_nodes`` (2) are ``micro`` or ``macro`` with at
  least one ``macro``, the others are drawn from all four labels; the order is shuffled.
  So every centre has both negative slides (healthy patches) and annotated slides with
  large lesions (tumour patches), even with N = 2; with the defaults every patient is
  ``pN1`` or ``pN2``. Set both minimums to 0 to see every patient stage.
* **Patient stage** (pN rules, as in Camelyon-17): ``pN0`` all nodes negative;
  ``pN0(i+)`` only ITCs; ``pN1mi`` micro-metastases but no macro; ``pN1`` 1-3 positive
  (micro or macro) nodes with at least one macro; ``pN2`` 4-9 positive nodes with at
  least one macro.
* **Annotations.** Every non-negative slide has an ASAP XML file (the real format:
  ``Type="Polygon"``, float level-0 pixel coordinates). Lesions are group
  ``metastases`` (12-40 vertices, irregular, inside tissue); some large lesions have a
  carve-out polygon in group ``normal`` strictly inside them, drawn as healthy tissue.
  The pixels of a lesion are exactly where its polygon (minus carve-outs) lies.
* **Pixels.** White glass (RGB about 235-245, low saturation) around one to three
  irregular tissue blobs covering about 30-55 % of the slide. Healthy tissue, like a
  lymph node: pink eosin stroma with fibrous texture, dense with small, round, dark
  nuclei (lymphocytes). Tumour: cytoplasm shifted towards purple, with large, pale,
  elongated nuclei. Colours come from a Beer-Lambert H&E model.
* **Centres differ like hospitals** (:class:`CenterLook`, fixed per centre, independent
  of the seed): stain (hue and strength of both stains, the glass colour), scanner
  (focus blur, noise), nucleus size, and how purple tumour cytoplasm turns. So centres
  are not IID: colour cues that separate the classes in one centre mislead in another,
  and a classifier trained on one centre scores lower on the others than one trained on
  all of them, while nuclear size and paleness separate the classes everywhere. Each
  slide jitters its centre's stain strengths slightly.
* **Slides.** Tiled pyramidal BigTIFF, JPEG tiles (``tile_size``, a multiple of 16), all
  levels in the main IFD chain, levels > 0 with ``subfiletype=1``, each level half the
  previous down to a longer side <= 512 px, resolution ``1e4 / mpp`` pixels per cm. Both
  OpenSlide (generic-tiff, ``openslide.mpp-x``) and tiffslide (``tiffslide.mpp-x``)
  read them. Level 0 is rendered one row of tiles at a time; lower levels are 2x2 block
  means of the level above.
* **Determinism.** Everything is drawn from ``numpy.random.default_rng`` streams keyed
  by ``(seed, patient, node, purpose)``, no timestamps are written, so the same
  configuration gives byte-identical files whatever the order or the number of
  workers. Each file is written atomically (:mod:`plumbing.atomic`: a temporary beside
  its target, renamed into place).
"""

from __future__ import annotations

import argparse
import logging
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal
from xml.sax.saxutils import quoteattr

import numpy as np
import tifffile
from scipy import ndimage
from scipy.spatial.distance import pdist
from skimage.draw import polygon as fill_polygon
from skimage.measure import points_in_poly

from plumbing.atomic import atomic_path, write_bytes
from wsi.catalogue import ANNOTATIONS_DIR, LABELS_FILE, NODE_LABELS, PATIENTS_PER_CENTER

log = logging.getLogger(__name__)

Layout = Literal["nested", "flat"]
LAYOUTS: tuple[str, ...] = ("nested", "flat")

TUMOUR_GROUP = "metastases"
CARVE_OUT_GROUP = "normal"
TUMOUR_LABELS: tuple[str, ...] = ("micro", "macro")

REAL_ITC_MAX_UM = 200.0
REAL_MACRO_MIN_UM = 2000.0
REFERENCE_SECTION_UM = 8000.0
SMALLEST_LEVEL_SIDE = 512

# Keys of the random streams; a stream is default_rng([seed, patient, node, key, ...]).
_STREAM_LABELS = 1
_STREAM_SLIDE = 2
_STREAM_BAND = 3
_STREAM_STAIN = 4

# Appearance, in micrometres so that it does not depend on the pixel size.
_HEALTHY_NUCLEUS_RADIUS_UM = (1.1, 1.7)
_TUMOUR_NUCLEUS_RADIUS_UM = (2.2, 3.6)
_HEALTHY_AREA_PER_NUCLEUS_UM2 = 50.0
_TUMOUR_AREA_PER_NUCLEUS_UM2 = 60.0
_HEALTHY_NUCLEUS_LOAD = (0.85, 1.15)
_TUMOUR_NUCLEUS_LOAD = (0.5, 0.8)
_TISSUE_FIELD_DOWNSAMPLE = 16
_TEXTURE_FIELD_DOWNSAMPLE = 8
_BIG_BUFFER_BYTES = 512 * 2**20

_ASAP_COLOURS = {TUMOUR_GROUP: ("#F4FA58", "#FF0000"), CARVE_OUT_GROUP: ("#64FE2E", "#64FE2E")}
_ASAP_DEFAULT_COLOURS = ("#F4FA58", "#FF0000")


# --------------------------------------------------------------------------------------
# Configuration and results
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SynthConfig:
    """Every size and count of a synthetic dataset. Output depends on nothing else."""

    centers: tuple[int, ...] = (0, 1, 2, 3, 4)
    patients_per_center: int = 2
    nodes_per_patient: int = 5
    seed: int = 0
    width: int = 6144
    height: int = 4096
    mpp: float = 0.25
    tile_size: int = 512
    levels: int | None = None
    layout: Layout = "nested"
    jpeg_quality: int = 90
    min_negative_nodes: int = 2
    min_tumour_nodes: int = 2
    tissue_fraction: tuple[float, float] = (0.30, 0.55)

    def __post_init__(self) -> None:
        problems = []
        if not self.centers or any(c < 0 for c in self.centers):
            problems.append("centers must be a non-empty list of non-negative integers")
        if len(set(self.centers)) != len(self.centers):
            problems.append("centers must not repeat")
        if not 1 <= self.patients_per_center <= PATIENTS_PER_CENTER:
            problems.append(f"patients_per_center must be in 1..{PATIENTS_PER_CENTER}")
        if self.nodes_per_patient < 1:
            problems.append("nodes_per_patient must be >= 1")
        if self.seed < 0:
            problems.append("seed must be >= 0")
        if self.tile_size < 16 or self.tile_size % 16:
            problems.append("tile_size must be a positive multiple of 16")
        if self.width < 64 or self.height < 64:
            problems.append("width and height must be >= 64")
        if not self.mpp > 0:
            problems.append("mpp must be > 0")
        if self.levels is not None and not 1 <= self.levels <= _max_levels(self.width, self.height):
            problems.append(f"levels must be in 1..{_max_levels(self.width, self.height)}")
        if self.layout not in LAYOUTS:
            problems.append(f"layout must be one of {LAYOUTS}")
        if not 1 <= self.jpeg_quality <= 100:
            problems.append("jpeg_quality must be in 1..100")
        if min(self.min_negative_nodes, self.min_tumour_nodes) < 0 or (
            self.min_negative_nodes + self.min_tumour_nodes > self.nodes_per_patient
        ):
            problems.append("min_negative_nodes + min_tumour_nodes must be <= nodes_per_patient")
        low, high = self.tissue_fraction
        if not 0.05 <= low <= high <= 0.9:
            problems.append("tissue_fraction must satisfy 0.05 <= low <= high <= 0.9")
        if problems:
            raise ValueError("invalid SynthConfig: " + "; ".join(problems))

    @property
    def label_scale(self) -> float:
        """Factor applied to the real ITC / macro thresholds (see the module docstring)."""
        return min(1.0, min(self.width, self.height) * self.mpp / REFERENCE_SECTION_UM)

    @property
    def itc_max_um(self) -> float:
        """Lesions smaller than this are isolated tumour cells."""
        return REAL_ITC_MAX_UM * self.label_scale

    @property
    def macro_min_um(self) -> float:
        """Lesions larger than this are macro-metastases."""
        return REAL_MACRO_MIN_UM * self.label_scale

    @property
    def level_count(self) -> int:
        return self.levels if self.levels is not None else auto_level_count(self.width, self.height)

    def patients(self) -> list[int]:
        return [
            PATIENTS_PER_CENTER * center + index
            for center in self.centers
            for index in range(self.patients_per_center)
        ]


@dataclass(frozen=True, eq=False)
class SynthSlide:
    """One generated slide: where it is, its label, and the lesions drawn on it."""

    center: int
    patient: int
    node: int
    label: str
    slide_path: Path
    annotation_path: Path | None
    metastases: tuple[np.ndarray, ...]
    carve_outs: tuple[np.ndarray, ...]
    largest_extent_um: float
    tissue_fraction: float

    @property
    def slide_id(self) -> str:
        return slide_id(self.patient, self.node)


@dataclass(frozen=True)
class SynthManifest:
    """What :func:`generate_dataset` wrote."""

    root: Path
    config: SynthConfig
    slides: tuple[SynthSlide, ...]
    stages: Mapping[int, str]
    stage_labels_path: Path
    seconds: float = 0.0

    def for_center(self, center: int) -> list[SynthSlide]:
        return [s for s in self.slides if s.center == center]

    def by_id(self) -> dict[str, SynthSlide]:
        return {s.slide_id: s for s in self.slides}


# --------------------------------------------------------------------------------------
# Labels and stages
# --------------------------------------------------------------------------------------


def slide_id(patient: int, node: int) -> str:
    return f"patient_{patient:03d}_node_{node}"


def node_label_for_extent(extent_um: float | None, config: SynthConfig) -> str:
    """The node label of a slide whose largest lesion spans ``extent_um`` (None: no lesion)."""
    if extent_um is None:
        return "negative"
    if extent_um < config.itc_max_um:
        return "itc"
    if extent_um <= config.macro_min_um:
        return "micro"
    return "macro"


def patient_stage(node_labels: Iterable[str]) -> str:
    """The pN stage of a patient from the labels of its nodes (Camelyon-17 rules)."""
    labels = list(node_labels)
    unknown = set(labels) - set(NODE_LABELS)
    if unknown:
        raise ValueError(f"unknown node labels {sorted(unknown)}")
    positive = sum(label in TUMOUR_LABELS for label in labels)
    if "macro" in labels:
        return "pN1" if positive <= 3 else "pN2"
    if "micro" in labels:
        return "pN1mi"
    if "itc" in labels:
        return "pN0(i+)"
    return "pN0"


def assign_node_labels(config: SynthConfig, patient: int) -> tuple[str, ...]:
    """Target labels of a patient's nodes, from the stream (seed, patient)."""
    rng = np.random.default_rng([config.seed, patient, 0, _STREAM_LABELS])
    labels = ["negative"] * config.min_negative_nodes
    if config.min_tumour_nodes:  # one macro-metastasis: large lesions give tumour patches
        labels.append("macro")
    more_tumour = max(config.min_tumour_nodes - 1, 0)
    labels += [str(rng.choice(TUMOUR_LABELS, p=[0.5, 0.5])) for _ in range(more_tumour)]
    free = config.nodes_per_patient - len(labels)
    labels += [str(rng.choice(NODE_LABELS, p=[0.45, 0.15, 0.15, 0.25])) for _ in range(free)]
    order = rng.permutation(len(labels))
    return tuple(labels[i] for i in order)


def max_feret_diameter(vertices: np.ndarray) -> float:
    """The largest distance between two vertices of a polygon."""
    if len(vertices) < 2:
        return 0.0
    return float(pdist(np.asarray(vertices, dtype=np.float64)).max())


# --------------------------------------------------------------------------------------
# ASAP XML
# --------------------------------------------------------------------------------------


def _asap_number(value: float) -> str:
    """A coordinate as ASAP writes it: a float32 printed with 9 significant digits."""
    return format(float(np.float32(value)), ".9g")


def write_asap_xml(
    path: str | os.PathLike[str], groups: Mapping[str, Sequence[np.ndarray]]
) -> None:
    """Write polygons (each (M, 2) level-0 x, y) per group as an ASAP annotation file.

    The format is the one of the Camelyon-17 files: tab-indented, ``Type="Polygon"``,
    ``Coordinate`` elements with ``Order``, ``X`` and ``Y``, then one ``Group`` per group.
    """
    lines = ['<?xml version="1.0"?>', "<ASAP_Annotations>", "\t<Annotations>"]
    index = 0
    for group, polygons in groups.items():
        colour = _ASAP_COLOURS.get(group, _ASAP_DEFAULT_COLOURS)[0]
        for polygon in polygons:
            vertices = np.asarray(polygon, dtype=np.float64)
            if vertices.ndim != 2 or vertices.shape[1] != 2 or len(vertices) < 3:
                raise ValueError(f"polygon {index} of group {group!r} is not (M >= 3, 2)")
            lines.append(
                f'\t\t<Annotation Name="Annotation {index}" Type="Polygon" '
                f'PartOfGroup={quoteattr(group)} Color="{colour}">'
            )
            lines.append("\t\t\t<Coordinates>")
            lines.extend(
                f'\t\t\t\t<Coordinate Order="{order}" X="{_asap_number(x)}" '
                f'Y="{_asap_number(y)}" />'
                for order, (x, y) in enumerate(vertices)
            )
            lines.append("\t\t\t</Coordinates>")
            lines.append("\t\t</Annotation>")
            index += 1
    lines += ["\t</Annotations>", "\t<AnnotationGroups>"]
    for group in groups:
        colour = _ASAP_COLOURS.get(group, _ASAP_DEFAULT_COLOURS)[1]
        lines.append(f'\t\t<Group Name={quoteattr(group)} PartOfGroup="None" Color="{colour}">')
        lines.append("\t\t\t<Attributes />")
        lines.append("\t\t</Group>")
    lines += ["\t</AnnotationGroups>", "</ASAP_Annotations>"]
    write_bytes(Path(path), ("\n".join(lines) + "\n").encode("ascii"))


# --------------------------------------------------------------------------------------
# Pyramidal TIFF
# --------------------------------------------------------------------------------------


def _max_levels(width: int, height: int) -> int:
    levels = 1
    while min(width, height) >> levels >= 1:
        levels += 1
    return levels


def auto_level_count(width: int, height: int, smallest_side: int = SMALLEST_LEVEL_SIDE) -> int:
    """Levels, each half the previous, until the longer side is <= ``smallest_side``."""
    levels = 1
    w, h = width, height
    while max(w, h) > smallest_side and min(w, h) >= 2:
        w, h = w // 2, h // 2
        levels += 1
    return levels


def level_dimensions(width: int, height: int, levels: int) -> list[tuple[int, int]]:
    """(width, height) of each level: each is the previous one halved (rounded down)."""
    dims = [(width, height)]
    for _ in range(levels - 1):
        w, h = dims[-1]
        dims.append((w // 2, h // 2))
    return dims


def _halve(image: np.ndarray) -> np.ndarray:
    """2x2 block mean (rounded) of an (H, W, 3) uint8 image; odd last row/column dropped."""
    h, w = image.shape[0] // 2, image.shape[1] // 2
    total = image[0 : 2 * h : 2, 0 : 2 * w : 2].astype(np.uint16)
    total += image[1 : 2 * h : 2, 0 : 2 * w : 2]
    total += image[0 : 2 * h : 2, 1 : 2 * w : 2]
    total += image[1 : 2 * h : 2, 1 : 2 * w : 2]
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
    description: str = "Synthetic slide (wsi.synth)",
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
                half = _halve(band)
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
                current = _halve(current)
    return dims


# --------------------------------------------------------------------------------------
# Stains
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StainProfile:
    """How a centre stains: optical-density directions and strengths, and its glass."""

    hematoxylin_od: tuple[float, float, float]
    eosin_od: tuple[float, float, float]
    hematoxylin_strength: float
    eosin_strength: float
    background_rgb: tuple[float, float, float]

    def jittered(self, rng: np.random.Generator, amount: float = 0.06) -> StainProfile:
        h, e = rng.uniform(1 - amount, 1 + amount, size=2)
        return StainProfile(
            self.hematoxylin_od,
            self.eosin_od,
            self.hematoxylin_strength * float(h),
            self.eosin_strength * float(e),
            self.background_rgb,
        )


_CENTER_STAINS: dict[int, StainProfile] = {
    # Ruifrok & Johnston's H&E directions, a neutral glass.
    0: StainProfile((0.65, 0.70, 0.29), (0.07, 0.99, 0.11), 1.00, 1.00, (240.0, 238.0, 240.0)),
    # Strong, bluer hematoxylin; light eosin; bright glass.
    1: StainProfile((0.52, 0.74, 0.42), (0.10, 0.95, 0.20), 1.30, 0.75, (244.0, 243.0, 242.0)),
    # Pink-red: strong eosin, weak hematoxylin.
    2: StainProfile((0.70, 0.68, 0.22), (0.02, 0.97, 0.03), 0.85, 1.40, (238.0, 235.0, 236.0)),
    # Dark and purple: both stains strong, a purplish eosin; greyer glass.
    3: StainProfile((0.62, 0.72, 0.33), (0.20, 0.92, 0.30), 1.20, 1.20, (236.0, 235.0, 238.0)),
    # Pale and faded, warm glass.
    4: StainProfile((0.72, 0.64, 0.28), (0.05, 0.88, 0.30), 0.70, 0.70, (245.0, 242.0, 236.0)),
}


def center_stain(center: int) -> StainProfile:
    """The stain profile of a centre: fixed presets for 0-4, derived ones beyond."""
    if center in _CENTER_STAINS:
        return _CENTER_STAINS[center]
    rng = np.random.default_rng([_STREAM_STAIN, center])
    base = _CENTER_STAINS[center % len(_CENTER_STAINS)]
    h = np.clip(np.array(base.hematoxylin_od) + rng.normal(0, 0.06, 3), 0.05, None)
    e = np.clip(np.array(base.eosin_od) + rng.normal(0, 0.06, 3), 0.01, None)
    strengths = rng.uniform(0.7, 1.35, 2)
    glass = np.clip(np.array(base.background_rgb) + rng.normal(0, 2.0, 3), 235, 246)
    return StainProfile(
        (float(h[0]), float(h[1]), float(h[2])),
        (float(e[0]), float(e[1]), float(e[2])),
        float(strengths[0]),
        float(strengths[1]),
        (float(glass[0]), float(glass[1]), float(glass[2])),
    )


@dataclass(frozen=True)
class CenterLook:
    """Everything about a centre's slides that is not the patient: stain, scanner, lab.

    * ``stain``: :class:`StainProfile` (the hue and strength of both stains, the glass);
    * ``focus_blur_um``: how far the scanner's point spread smears an edge (µm): nuclei
      get a soft rim of that width, so fine chromatin detail fades at a blurry centre;
    * ``noise``: the scanner's sensor and stain grain, as a multiple of centre 0's;
    * ``nucleus_scale``: every nucleus radius is multiplied by it (section thickness and
      fixation swell or shrink cells alike in healthy and tumour tissue);
    * ``tumour_contrast``: how far tumour cytoplasm moves from stroma towards hematoxylin
      (1: centre 0; < 1: a lab whose tumour cytoplasm is almost as pink as its stroma).

    The presets make the centres differ the way Camelyon-17's hospitals do, enough that a
    classifier trained on one centre's colours misreads another's (the premise of federated
    learning across hospitals) while nuclear size and paleness separate the classes
    everywhere.
    """

    stain: StainProfile
    focus_blur_um: float = 0.0
    noise: float = 1.0
    nucleus_scale: float = 1.0
    tumour_contrast: float = 1.0


_CENTER_LOOKS: dict[int, tuple[float, float, float, float]] = {
    # (focus_blur_um, noise, nucleus_scale, tumour_contrast)
    0: (0.0, 1.0, 1.00, 1.0),
    1: (1.5, 0.6, 1.15, 0.45),
    2: (0.5, 2.0, 0.85, 0.7),
    3: (2.5, 1.4, 1.05, 0.35),
    4: (1.0, 1.0, 0.95, 0.6),
}


def center_look(center: int) -> CenterLook:
    """The :class:`CenterLook` of a centre: presets for 0-4, derived ones beyond."""
    stain = center_stain(center)
    if center in _CENTER_LOOKS:
        return CenterLook(stain, *_CENTER_LOOKS[center])
    rng = np.random.default_rng([_STREAM_STAIN, center, 1])
    return CenterLook(
        stain,
        focus_blur_um=float(rng.uniform(0.0, 2.5)),
        noise=float(rng.uniform(0.6, 2.0)),
        nucleus_scale=float(rng.uniform(0.85, 1.15)),
        tumour_contrast=float(rng.uniform(0.35, 1.0)),
    )


def _unit(vector: Sequence[float]) -> np.ndarray:
    array = np.asarray(vector, dtype=np.float32)
    return array / np.linalg.norm(array)


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


# --------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------


def _tumour_mask(plan: SlidePlan, y0: int, y1: int, x0: int, x1: int) -> np.ndarray | None:
    """Tumour (lesions minus carve-outs) over the block, or None when there is none."""
    mask = None
    for lesion in plan.lesions:
        (left, top), (right, bottom) = lesion.polygon.min(axis=0), lesion.polygon.max(axis=0)
        if bottom < y0 or top >= y1 or right < x0 or left >= x1:
            continue
        if mask is None:
            mask = np.zeros((y1 - y0, x1 - x0), dtype=bool)
        # Pixel (r, c) is tumour when its centre (x0 + c + 0.5, y0 + r + 0.5) is.
        rr, cc = fill_polygon(
            lesion.polygon[:, 1] - (y0 + 0.5), lesion.polygon[:, 0] - (x0 + 0.5), mask.shape
        )
        mask[rr, cc] = True
        for carve in lesion.carve_outs:
            rr, cc = fill_polygon(carve[:, 1] - (y0 + 0.5), carve[:, 0] - (x0 + 0.5), mask.shape)
            mask[rr, cc] = False
    return mask


def _stamp_nuclei(
    plan: SlidePlan, candidates: np.ndarray, y0: int, y1: int, x0: int, x1: int
) -> np.ndarray:
    """Hematoxylin load of the nuclei over the block (max where nuclei overlap).

    A nucleus is full strength inside, with a linear rim ``1 + blur`` px wide across its
    edge, ``blur`` being the centre's focus blur in level-0 px (an anti-aliased edge when 0).
    """
    load = np.zeros((y1 - y0, x1 - x0), dtype=np.float32)
    nuclei = plan.nuclei
    rim = 1.0 + _blur_px(plan)
    for i in candidates:
        cx, cy, a, b = nuclei.x[i], nuclei.y[i], nuclei.radius_a[i], nuclei.radius_b[i]
        r = int(a + rim / 2) + 2
        top, bottom = max(int(cy) - r, y0), min(int(cy) + r + 1, y1)
        left, right = max(int(cx) - r, x0), min(int(cx) + r + 1, x1)
        if top >= bottom or left >= right:
            continue
        dy = np.arange(top, bottom, dtype=np.float32)[:, None] + 0.5 - cy
        dx = np.arange(left, right, dtype=np.float32)[None, :] + 0.5 - cx
        cos, sin = math.cos(nuclei.angle[i]), math.sin(nuclei.angle[i])
        u = (dx * cos + dy * sin) / a
        v = (dy * cos - dx * sin) / b
        edge = np.clip((1 - np.sqrt(u * u + v * v)) * b / rim + 0.5, 0, 1)
        window = load[top - y0 : bottom - y0, left - x0 : right - x0]
        np.maximum(window, edge * nuclei.load[i], out=window)
    return load


def _blur_px(plan: SlidePlan) -> float:
    return plan.look.focus_blur_um / plan.mpp


_BLOCK_WIDTH = 1024  # columns rendered at a time: small arrays stay in the allocator's pool


def render_rows(plan: SlidePlan, y0: int, y1: int) -> np.ndarray:
    """Level-0 pixels of rows [y0, y1) of a planned slide, (y1 - y0, width, 3) uint8."""
    # The noise of a band is keyed by its first row, so it does not depend on render order.
    rng = np.random.default_rng([plan.seed, plan.patient, plan.node, _STREAM_BAND, y0])
    nuclei = plan.nuclei
    reach = float(np.max(nuclei.radius_a, initial=0.0)) + _blur_px(plan) / 2 + 3
    first, last = np.searchsorted(nuclei.y, [y0 - reach, y1 + reach])
    in_rows = np.arange(first, last)
    rgb = np.empty((y1 - y0, plan.width, 3), dtype=np.uint8)
    for x0 in range(0, plan.width, _BLOCK_WIDTH):
        x1 = min(x0 + _BLOCK_WIDTH, plan.width)
        near = np.abs(nuclei.x[in_rows] - (x0 + x1) / 2) <= (x1 - x0) / 2 + reach
        rgb[:, x0:x1] = _render_block(plan, rng, in_rows[near], y0, y1, x0, x1)
    return rgb


def _render_block(
    plan: SlidePlan,
    rng: np.random.Generator,
    nuclei_near: np.ndarray,
    y0: int,
    y1: int,
    x0: int,
    x1: int,
) -> np.ndarray:
    shape = (y1 - y0, x1 - x0)
    # Unit-variance uniform noise: as good as Gaussian for grain, three times cheaper.
    grain = rng.random(shape, dtype=np.float32)
    grain -= np.float32(0.5)
    grain *= np.float32(math.sqrt(12))
    tissue = _upsample(plan.tissue_field, _TISSUE_FIELD_DOWNSAMPLE, y0, y1, x0, x1) > 0
    fibre = _upsample(plan.fibre_field, _TEXTURE_FIELD_DOWNSAMPLE, y0, y1, x0, x1)
    tumour = _tumour_mask(plan, y0, y1, x0, x1)
    nuclei = _stamp_nuclei(plan, nuclei_near, y0, y1, x0, x1)

    # Concentrations of the two stains. Healthy: eosin stroma in streaks, a trace of
    # hematoxylin. Tumour: cytoplasm moved towards purple (more hematoxylin, less eosin)
    # by the centre's tumour contrast, less streaky.
    look = plan.look
    eosin = fibre * np.float32(0.14)
    eosin += np.float32(0.42)
    hema = fibre * np.float32(0.01)
    hema += np.float32(0.05)
    if tumour is not None:
        shift = np.float32(look.tumour_contrast)
        eosin = np.where(tumour, 0.42 - 0.12 * shift + (0.14 - 0.11 * shift) * fibre, eosin)
        hema = np.where(tumour, 0.05 + 0.25 * shift + (0.01 + 0.03 * shift) * fibre, hema)
    grain *= np.float32(look.noise)
    eosin *= 1 + np.float32(0.12) * grain
    hema *= 1 + np.float32(0.25) * grain
    np.maximum(hema, nuclei * (1 + np.float32(0.12) * grain), out=hema)
    eosin *= 1 - np.float32(0.5) * np.minimum(nuclei, 1)
    np.maximum(eosin, 0.12, out=eosin)
    np.maximum(hema, 0, out=hema)
    on_tissue = tissue.astype(np.float32)
    eosin *= on_tissue
    hema *= on_tissue

    stain = plan.stain
    h_od = _unit(stain.hematoxylin_od) * np.float32(stain.hematoxylin_strength)
    e_od = _unit(stain.eosin_od) * np.float32(stain.eosin_strength)
    glass_noise = grain * np.float32(1.2)
    rgb = np.empty((*shape, 3), dtype=np.uint8)
    for channel in range(3):
        optical_density = hema * -h_od[channel]
        optical_density -= eosin * e_od[channel]
        value = np.exp(optical_density, out=optical_density)
        value *= glass_noise + np.float32(stain.background_rgb[channel] + 0.5)
        np.clip(value, 0, 255, out=value)
        rgb[..., channel] = value
    return rgb


def render_slide_bands(plan: SlidePlan, band_height: int) -> Iterator[np.ndarray]:
    """Level 0 of a planned slide as row bands ``band_height`` tall (the last may be less)."""
    for y0 in range(0, plan.height, band_height):
        yield render_rows(plan, y0, min(y0 + band_height, plan.height))


def render_slide(plan: SlidePlan, band_height: int = 512) -> np.ndarray:
    """The whole level 0 of a planned slide, (height, width, 3) uint8 (small slides only)."""
    return np.concatenate(list(render_slide_bands(plan, band_height)), axis=0)


# --------------------------------------------------------------------------------------
# The dataset
# --------------------------------------------------------------------------------------


def slide_path(root: Path, patient: int, node: int, layout: Layout) -> Path:
    center_dir = root / f"center_{patient // PATIENTS_PER_CENTER}"
    name = f"{slide_id(patient, node)}.tif"
    if layout == "flat":
        return center_dir / name
    return center_dir / f"patient_{patient:03d}" / name


def annotation_path(root: Path, patient: int, node: int) -> Path:
    return root / ANNOTATIONS_DIR / f"{slide_id(patient, node)}.xml"


@dataclass(frozen=True)
class _SlideTask:
    root: Path
    config: SynthConfig
    patient: int
    node: int
    label: str


def generate_slide(task: _SlideTask) -> SynthSlide:
    """Plan, render and write one slide (and its annotation when it has lesions)."""
    config = task.config
    plan = plan_slide(config, task.patient, task.node, task.label)
    extent_um = max((lesion.extent_px for lesion in plan.lesions), default=None)
    extent_um = None if extent_um is None else extent_um * config.mpp
    label = node_label_for_extent(extent_um, config)
    if label != task.label:  # cannot happen: extents are drawn inside the label's range
        raise RuntimeError(f"{slide_id(task.patient, task.node)}: drew {label}, not {task.label}")
    path = slide_path(task.root, task.patient, task.node, config.layout)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_pyramidal_tiff(
        path,
        render_slide_bands(plan, config.tile_size),
        shape=(config.height, config.width),
        mpp=config.mpp,
        tile_size=config.tile_size,
        levels=config.level_count,
        description=(
            f"Synthetic Camelyon-17-like slide {slide_id(task.patient, task.node)} "
            f"(wsi.synth, seed {config.seed}); level-0 mpp {config.mpp}"
        ),
        jpeg_quality=config.jpeg_quality,
    )
    xml_path = None
    if plan.lesions:
        xml_path = annotation_path(task.root, task.patient, task.node)
        xml_path.parent.mkdir(parents=True, exist_ok=True)
        groups = {TUMOUR_GROUP: list(plan.metastases)}
        if plan.carve_outs:
            groups[CARVE_OUT_GROUP] = list(plan.carve_outs)
        write_asap_xml(xml_path, groups)
    return SynthSlide(
        center=plan.center,
        patient=task.patient,
        node=task.node,
        label=label,
        slide_path=path,
        annotation_path=xml_path,
        metastases=plan.metastases,
        carve_outs=plan.carve_outs,
        largest_extent_um=0.0 if extent_um is None else float(extent_um),
        tissue_fraction=float((plan.tissue_field > 0).mean()),
    )


def stage_labels_text(labels: Mapping[int, Sequence[str]]) -> str:
    """``stage_labels.csv`` for {patient: node labels}: a patient row, then its nodes."""
    lines = ["patient,stage"]
    for patient in sorted(labels):
        lines.append(f"patient_{patient:03d}.zip,{patient_stage(labels[patient])}")
        lines.extend(
            f"{slide_id(patient, node)}.tif,{label}" for node, label in enumerate(labels[patient])
        )
    return "\n".join(lines) + "\n"


def generate_dataset(
    out: str | os.PathLike[str],
    config: SynthConfig,
    *,
    workers: int = 1,
    on_slide: Callable[[SynthSlide], None] | None = None,
) -> SynthManifest:
    """Write a synthetic Camelyon-17 dataset under ``out``; see the module docstring.

    ``workers`` > 1 renders slides in a process pool (the output does not change).
    ``on_slide`` is called in this process after each slide is written. Existing files of
    the same names are replaced; other files under ``out`` are left alone.
    """
    started = time.perf_counter()
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    labels = {patient: assign_node_labels(config, patient) for patient in config.patients()}
    tasks = [
        _SlideTask(root, config, patient, node, label)
        for patient, node_labels in labels.items()
        for node, label in enumerate(node_labels)
    ]
    slides: list[SynthSlide] = []

    def done(slide: SynthSlide) -> None:
        slides.append(slide)
        log.debug("wrote %s (%s)", slide.slide_path, slide.label)
        if on_slide is not None:
            on_slide(slide)

    if workers > 1 and len(tasks) > 1:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(min(workers, len(tasks)), mp_context=context) as pool:
            for slide in pool.map(generate_slide, tasks):
                done(slide)
    else:
        for task in tasks:
            done(generate_slide(task))

    stage_labels_path = root / LABELS_FILE
    write_bytes(stage_labels_path, stage_labels_text(labels).encode("ascii"))
    slides.sort(key=lambda s: (s.patient, s.node))
    return SynthManifest(
        root=root,
        config=config,
        slides=tuple(slides),
        stages={patient: patient_stage(node_labels) for patient, node_labels in labels.items()},
        stage_labels_path=stage_labels_path,
        seconds=time.perf_counter() - started,
    )


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    defaults = SynthConfig()
    parser = argparse.ArgumentParser(
        prog="python -m wsi.synth",
        description=(
            "Write a synthetic Camelyon-17-like dataset: pyramidal JPEG BigTIFF slides, "
            "ASAP lesion annotations and stage_labels.csv. A node is itc / micro / macro by "
            "the largest lesion's extent against the real 0.2 mm / 2 mm thresholds scaled by "
            "min(1, slide short side / 8 mm); see the module docstring for every rule."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="dataset root to write")
    parser.add_argument("--patients-per-center", type=int, default=defaults.patients_per_center)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--centers", type=int, nargs="+", default=list(defaults.centers))
    which.add_argument("--num-centers", type=int, help="centres 0 .. N-1 (instead of --centers)")
    parser.add_argument("--nodes-per-patient", type=int, default=defaults.nodes_per_patient)
    parser.add_argument("--width", type=int, default=defaults.width, help="level-0 px")
    parser.add_argument("--height", type=int, default=defaults.height, help="level-0 px")
    parser.add_argument("--mpp", type=float, default=defaults.mpp, help="level-0 µm per px")
    parser.add_argument("--tile-size", type=int, default=defaults.tile_size)
    parser.add_argument(
        "--levels", type=int, default=None, help="pyramid levels (default: down to <= 512 px)"
    )
    parser.add_argument("--layout", choices=LAYOUTS, default=defaults.layout)
    parser.add_argument("--jpeg-quality", type=int, default=defaults.jpeg_quality)
    parser.add_argument("--min-negative-nodes", type=int, default=defaults.min_negative_nodes)
    parser.add_argument("--min-tumour-nodes", type=int, default=defaults.min_tumour_nodes)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--no-progress", action="store_true", help="log instead of a bar")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = SynthConfig(
            centers=tuple(
                range(args.num_centers) if args.num_centers is not None else args.centers
            ),
            patients_per_center=args.patients_per_center,
            nodes_per_patient=args.nodes_per_patient,
            seed=args.seed,
            width=args.width,
            height=args.height,
            mpp=args.mpp,
            tile_size=args.tile_size,
            levels=args.levels,
            layout=args.layout,
            jpeg_quality=args.jpeg_quality,
            min_negative_nodes=args.min_negative_nodes,
            min_tumour_nodes=args.min_tumour_nodes,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    total = len(config.patients()) * config.nodes_per_patient
    log.info(
        "writing %d slides of %dx%d px at %g µm/px (%d levels) to %s; labels: itc < %.1f µm, "
        "micro %.1f-%.1f µm, macro > %.1f µm (largest lesion extent)",
        total,
        config.width,
        config.height,
        config.mpp,
        config.level_count,
        args.out,
        config.itc_max_um,
        config.itc_max_um,
        config.macro_min_um,
        config.macro_min_um,
    )
    if args.no_progress:
        manifest = generate_dataset(
            args.out,
            config,
            workers=args.workers,
            on_slide=lambda s: log.info("wrote %s (%s)", s.slide_path, s.label),
        )
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        ) as progress:
            bar = progress.add_task("slides", total=total)
            manifest = generate_dataset(
                args.out,
                config,
                workers=args.workers,
                on_slide=lambda s: progress.update(
                    bar, advance=1, description=f"{s.slide_id} {s.label}"
                ),
            )
    counts = {label: sum(s.label == label for s in manifest.slides) for label in NODE_LABELS}
    log.info(
        "done in %.1f s: %s; %d annotation files; %s",
        manifest.seconds,
        ", ".join(f"{n} {label}" for label, n in counts.items()),
        sum(s.annotation_path is not None for s in manifest.slides),
        manifest.stage_labels_path,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
