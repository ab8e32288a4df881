"""Lesion annotations in ASAP XML, as distributed with Camelyon-16 and Camelyon-17.

Layout read::

    ASAP_Annotations/Annotations/Annotation[@Name, @Type, @PartOfGroup]
        /Coordinates/Coordinate[@Order, @X, @Y]     float level-0 pixels

Tumour is the union of the areas in the tumour groups minus the union of the areas in the
carve-out groups. ``Polygon``, ``Rectangle`` and ``Spline`` annotations are areas (a spline
is taken as its control polygon); ``Dot`` and ``PointSet`` mark points and are ignored.
Some files write decimals with a comma; both separators are accepted.

:func:`read_asap` checks the file on its own; :func:`check_regions_on_slide` then checks
each tumour and carve-out polygon against the slide it annotates (its level-0 size):
degenerate, entirely outside the slide, enclosing the whole slide or implausibly large
polygons are errors, since each would silently mislabel patches. A polygon only partly
outside the slide is fine: the masks clip it.
"""

from __future__ import annotations

import logging
import os
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

import numpy as np

from plumbing.atomic import write_bytes
from plumbing.errors import PipelineError

# group names as Camelyon-16's and Camelyon-17's files write them, matched in any case
TUMOR_GROUPS: frozenset[str] = frozenset({"metastases", "tumor", "tumour", "_0", "_1"})
CARVE_OUT_GROUPS: frozenset[str] = frozenset({"normal", "_2", "exclusion"})
AREA_TYPES: frozenset[str] = frozenset({"Polygon", "Rectangle", "Spline"})
POINT_TYPES: frozenset[str] = frozenset({"Dot", "PointSet"})

log = logging.getLogger(__name__)


class AnnotationError(PipelineError):
    """An annotation file is missing or malformed."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(Path(path), reason)


@dataclass(frozen=True)
class Region:
    """One annotated area: its name, group, ASAP type and (M, 2) level-0 (x, y) vertices.

    ``index`` is the annotation's position among the file's ``Annotation`` elements
    (counting point annotations too), ``None`` for a region not read from a file.
    """

    name: str
    group: str
    kind: str
    vertices: np.ndarray
    index: int | None = None

    @property
    def description(self) -> str:
        """How an error names the region: as the XML has it."""
        where = f"annotation {self.index} " if self.index is not None else "annotation "
        return f"{where}{self.name!r} ({self.kind}, group {self.group!r})"

    @property
    def is_tumor(self) -> bool:
        """In a tumour group (:data:`TUMOR_GROUPS`, any case)."""
        return self.group.casefold() in TUMOR_GROUPS

    @property
    def is_carve_out(self) -> bool:
        """In a carve-out group (:data:`CARVE_OUT_GROUPS`, any case)."""
        return self.group.casefold() in CARVE_OUT_GROUPS

    @property
    def area(self) -> float:
        return polygon_area(self.vertices)

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """(x_min, y_min, x_max, y_max) in level-0 pixels."""
        x_min, y_min = self.vertices.min(axis=0)
        x_max, y_max = self.vertices.max(axis=0)
        return float(x_min), float(y_min), float(x_max), float(y_max)


@dataclass(frozen=True)
class SlideAnnotations:
    """The areas annotated on one slide, split into tumour and carve-outs."""

    path: Path
    regions: tuple[Region, ...]

    @property
    def tumor(self) -> tuple[Region, ...]:
        return tuple(r for r in self.regions if r.is_tumor)

    @property
    def carve_outs(self) -> tuple[Region, ...]:
        return tuple(r for r in self.regions if r.is_carve_out)

    @property
    def ignored_groups(self) -> list[str]:
        """The groups that are neither tumour nor carve-out: they play no part."""
        return sorted({r.group for r in self.regions if not (r.is_tumor or r.is_carve_out)})

    @property
    def groups(self) -> dict[str, tuple[Region, ...]]:
        by_group: dict[str, list[Region]] = {}
        for region in self.regions:
            by_group.setdefault(region.group, []).append(region)
        return {group: tuple(regions) for group, regions in by_group.items()}


def polygon_area(vertices: np.ndarray) -> float:
    """Area enclosed by a simple polygon (shoelace formula), in squared input units."""
    x, y = vertices[:, 0], vertices[:, 1]
    return float(abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))) / 2.0)


def _number(text: str | None, what: str, path: Path) -> float:
    if text is None:
        raise AnnotationError(path, f"{what} is missing")
    try:
        return float(text.strip().replace(",", "."))
    except ValueError:
        raise AnnotationError(path, f"{what} is not a number: {text!r}") from None


def _region(element: ElementTree.Element, index: int, path: Path) -> Region | None:
    name = element.get("Name", f"Annotation {index}")
    kind = element.get("Type")
    group = element.get("PartOfGroup")
    if kind is None or group is None:
        raise AnnotationError(path, f"annotation {name!r} lacks its Type or PartOfGroup")
    if kind in POINT_TYPES:
        return None
    if kind not in AREA_TYPES:
        raise AnnotationError(path, f"annotation {name!r} has unknown Type {kind!r}")
    points: list[tuple[float, float, float]] = []
    for coordinate in element.iterfind("./Coordinates/Coordinate"):
        where = f"annotation {name!r} coordinate {coordinate.get('Order')!r}"
        points.append(
            (
                _number(coordinate.get("Order"), f"{where} Order", path),
                _number(coordinate.get("X"), f"{where} X", path),
                _number(coordinate.get("Y"), f"{where} Y", path),
            )
        )
    if len(points) < 3:
        raise AnnotationError(
            path, f"annotation {name!r} ({kind}) has {len(points)} vertices; an area needs 3"
        )
    points.sort(key=lambda point: point[0])
    vertices = np.array([(x, y) for _, x, y in points], dtype=np.float64)
    if not np.isfinite(vertices).all():
        raise AnnotationError(path, f"annotation {name!r} has non-finite coordinates")
    return Region(name=name, group=group, kind=kind, vertices=vertices, index=index)


def read_asap(path: str | os.PathLike[str]) -> SlideAnnotations:
    """Parse an ASAP XML file into level-0 regions.

    Raises :class:`AnnotationError` naming the file for a missing file, broken XML, a
    missing ``Annotations`` element, an unknown annotation type or a bad coordinate.
    Group names are matched in any case (``Tumor``, ``tumor``). Regions of groups that
    are neither tumour nor carve-out are kept (see :attr:`SlideAnnotations.groups`) and
    logged, but play no part in the tumour mask; one of them that is malformed (a
    two-point ruler, an unknown type) is skipped with a warning, not an error.
    """
    path = Path(path)
    try:
        root = ElementTree.parse(path).getroot()
    except FileNotFoundError:
        raise AnnotationError(path, "no such annotation file") from None
    except ElementTree.ParseError as error:
        raise AnnotationError(path, f"not well-formed XML ({error})") from None
    except OSError as error:
        raise AnnotationError(path, f"cannot read ({error})") from None
    if root.tag != "ASAP_Annotations":
        raise AnnotationError(path, f"root element is <{root.tag}>, not <ASAP_Annotations>")
    annotations = root.find("Annotations")
    if annotations is None:
        raise AnnotationError(path, "no <Annotations> element")
    regions = []
    for index, element in enumerate(annotations.iterfind("Annotation")):
        try:
            region = _region(element, index, path)
        except AnnotationError as error:
            group = element.get("PartOfGroup")
            if group is None or group.casefold() in TUMOR_GROUPS | CARVE_OUT_GROUPS:
                raise
            # a ruler or a note in a group that plays no part: it labels nothing
            log.warning("%s: annotation %d of group %r skipped: %s", path, index, group,
                        error.reason)  # fmt: skip
            continue
        if region is not None:
            regions.append(region)
    read = SlideAnnotations(path=path, regions=tuple(regions))
    if read.ignored_groups:
        log.warning("%s: groups %s are neither tumour nor carve-out; ignored", path,
                    read.ignored_groups)  # fmt: skip
    return read


# --------------------------------------------------------------------------------------
# Regions checked against the slide they annotate
# --------------------------------------------------------------------------------------

MIN_REGION_AREA = 1.0
"""Least area (level-0 pixels squared) of a real region; below it a polygon is degenerate
(collinear or repeated vertices, a self-cancelling figure of eight)."""


def _clip_half_plane(
    points: list[tuple[float, float]], axis: int, bound: float, keep_below: bool
) -> list[tuple[float, float]]:
    """One Sutherland-Hodgman pass: the part of the polygon on one side of an axis line."""

    def inside(point: tuple[float, float]) -> bool:
        return point[axis] <= bound if keep_below else point[axis] >= bound

    clipped: list[tuple[float, float]] = []
    previous = points[-1]
    for current in points:
        if inside(current) != inside(previous):
            t = (bound - previous[axis]) / (current[axis] - previous[axis])
            crossing = [
                previous[0] + t * (current[0] - previous[0]),
                previous[1] + t * (current[1] - previous[1]),
            ]
            crossing[axis] = bound  # exactly on the line, whatever the rounding
            clipped.append((crossing[0], crossing[1]))
        if inside(current):
            clipped.append(current)
        previous = current
    return clipped


def clip_to_rectangle(vertices: np.ndarray, width: float, height: float) -> np.ndarray:
    """The part of a polygon inside ``[0, width] x [0, height]`` (Sutherland-Hodgman).

    Exact in area for a simple polygon, convex or not (a concave one may come back with
    zero-width bridges along the rectangle's edges, which enclose nothing). Returns a
    (K, 2) array, K = 0 when nothing of the polygon lies inside.
    """
    points = [(float(x), float(y)) for x, y in np.asarray(vertices, dtype=np.float64)]
    for axis, bound, keep_below in (
        (0, 0.0, False),
        (0, float(width), True),
        (1, 0.0, False),
        (1, float(height), True),
    ):
        if not points:
            break
        points = _clip_half_plane(points, axis, bound, keep_below)
    return np.array(points, dtype=np.float64).reshape(-1, 2)


def contains_points(vertices: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Which of ``points`` (N, 2) lie inside the polygon (even-odd rule), as (N,) bools."""
    x, y = vertices[:, 0], vertices[:, 1]
    x_next, y_next = np.roll(x, -1), np.roll(y, -1)
    inside = np.zeros(len(points), dtype=bool)
    for k, (px, py) in enumerate(np.asarray(points, dtype=np.float64)):
        spans = (y > py) != (y_next > py)
        with np.errstate(divide="ignore", invalid="ignore"):
            x_cross = x + (py - y) * (x_next - x) / (y_next - y)
        inside[k] = bool(np.count_nonzero(spans & (px < x_cross)) % 2)
    return inside


def region_problem(region: Region, width: int, height: int, max_area_fraction: float) -> str | None:
    """Why ``region`` cannot be a lesion or carve-out of a ``width`` x ``height`` slide,
    or ``None`` when it can. See :func:`check_regions_on_slide`."""
    vertices = np.asarray(region.vertices, dtype=np.float64)
    if vertices.ndim != 2 or vertices.shape[1] != 2:
        return f"has vertices of shape {vertices.shape}, not (M, 2)"
    if not np.isfinite(vertices).all():
        return "has non-finite coordinates"
    distinct = len(np.unique(vertices, axis=0))
    if distinct < 3:
        return f"is degenerate: {distinct} distinct vertices, an area needs 3"
    area = polygon_area(vertices)
    if area < MIN_REGION_AREA:
        return f"is degenerate: it encloses no area ({area:.3g} px^2)"
    x_min, y_min = vertices.min(axis=0)
    x_max, y_max = vertices.max(axis=0)
    box = f"x {x_min:.0f}..{x_max:.0f}, y {y_min:.0f}..{y_max:.0f}"
    inside_area = polygon_area(clip_to_rectangle(vertices, width, height))
    if inside_area < MIN_REGION_AREA:
        return (
            f"lies entirely outside the slide: its bounding box ({box}) does not meet the "
            f"slide's level-0 extent 0..{width} x 0..{height}"
        )
    corners = np.array(
        [[0.5, 0.5], [width - 0.5, 0.5], [width - 0.5, height - 0.5], [0.5, height - 0.5]]
    )
    if contains_points(vertices, corners).all():
        return (
            f"encloses the whole slide: all four corners of the {width} x {height} level-0 "
            f"extent lie inside it (bounding box {box})"
        )
    fraction = inside_area / (float(width) * float(height))
    if fraction > max_area_fraction:
        return (
            f"is implausibly large: it covers {fraction:.0%} of the {width} x {height} slide "
            f"({inside_area:.0f} px^2), more than max_area_fraction {max_area_fraction:g}"
        )
    return None


def check_regions_on_slide(
    annotations: SlideAnnotations,
    dimensions: tuple[int, int],
    *,
    max_area_fraction: float = 0.5,
) -> None:
    """Check every tumour and carve-out polygon against the slide's level-0 ``dimensions``
    (width, height), as :attr:`wsi.slide.Slide.dimensions` gives them.

    Raises :class:`AnnotationError` naming the annotation file, the polygon (index, name,
    type and group as the XML has them) and why, for the first polygon that is
    degenerate (fewer than 3 distinct vertices, less than :data:`MIN_REGION_AREA` of area,
    non-finite coordinates), lies entirely outside the slide (the message gives its
    bounding box and the slide's size), encloses the whole slide (contains all four
    corners) or covers more than ``max_area_fraction`` of the slide. A polygon partly
    outside the slide is fine, and only its part inside counts towards the area.
    Regions of other groups play no part in the labels and are not checked.
    """
    width, height = (int(side) for side in dimensions)
    if width <= 0 or height <= 0:
        raise ValueError(f"slide dimensions must be positive, got {dimensions}")
    if not 0.0 < max_area_fraction <= 1.0:
        raise ValueError(f"max_area_fraction must be in (0, 1], got {max_area_fraction}")
    for region in (*annotations.tumor, *annotations.carve_outs):
        problem = region_problem(region, width, height, max_area_fraction)
        if problem is not None:
            raise AnnotationError(annotations.path, f"{region.description} {problem}")


# --------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------

# (annotation colour, group colour) as ASAP draws them, by group
_ASAP_COLOURS = {"metastases": ("#F4FA58", "#FF0000"), "normal": ("#64FE2E", "#64FE2E")}
_ASAP_DEFAULT_COLOURS = ("#F4FA58", "#FF0000")


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
