"""Lesion annotations in ASAP XML, as distributed with Camelyon-16 and Camelyon-17.

Layout read::

    ASAP_Annotations/Annotations/Annotation[@Name, @Type, @PartOfGroup]
        /Coordinates/Coordinate[@Order, @X, @Y]     float level-0 pixels

Tumour is the union of the areas in the tumour groups minus the union of the areas in the
carve-out groups. ``Polygon``, ``Rectangle`` and ``Spline`` annotations are areas (a spline
is taken as its control polygon); ``Dot`` and ``PointSet`` mark points and are ignored.
Some files write decimals with a comma; both separators are accepted.
"""

from __future__ import annotations

import logging
import os
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TUMOR_GROUPS: frozenset[str] = frozenset({"metastases", "Tumor", "_0", "_1"})
CARVE_OUT_GROUPS: frozenset[str] = frozenset({"normal", "_2", "Exclusion"})
AREA_TYPES: frozenset[str] = frozenset({"Polygon", "Rectangle", "Spline"})
POINT_TYPES: frozenset[str] = frozenset({"Dot", "PointSet"})

log = logging.getLogger(__name__)


class AnnotationError(Exception):
    """An annotation file is missing or malformed."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

    def __reduce__(self) -> tuple[type, tuple[Path, str]]:
        return type(self), (self.path, self.reason)


@dataclass(frozen=True)
class Region:
    """One annotated area: its name, group, ASAP type and (M, 2) level-0 (x, y) vertices."""

    name: str
    group: str
    kind: str
    vertices: np.ndarray

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
        return tuple(r for r in self.regions if r.group in TUMOR_GROUPS)

    @property
    def carve_outs(self) -> tuple[Region, ...]:
        return tuple(r for r in self.regions if r.group in CARVE_OUT_GROUPS)

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
    return Region(name=name, group=group, kind=kind, vertices=vertices)


def read_asap(path: str | os.PathLike[str]) -> SlideAnnotations:
    """Parse an ASAP XML file into level-0 regions.

    Raises :class:`AnnotationError` naming the file for a missing file, broken XML, a
    missing ``Annotations`` element, an unknown annotation type or a bad coordinate.
    Regions of groups that are neither tumour nor carve-out are kept (see
    :attr:`SlideAnnotations.groups`) and logged, but play no part in the tumour mask.
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
        region = _region(element, index, path)
        if region is not None:
            regions.append(region)
    unknown = {r.group for r in regions} - TUMOR_GROUPS - CARVE_OUT_GROUPS
    if unknown:
        log.warning("%s: groups %s are neither tumour nor carve-out; ignored", path, unknown)
    return SlideAnnotations(path=path, regions=tuple(regions))
