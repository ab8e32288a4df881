from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wsi.annotations import AnnotationError, polygon_area, read_asap


def _asap(*annotations: str) -> str:
    return (
        '<?xml version="1.0"?>\n<ASAP_Annotations><Annotations>'
        + "".join(annotations)
        + "</Annotations><AnnotationGroups /></ASAP_Annotations>"
    )


def _annotation(name: str, kind: str, group: str, points: list[tuple[str, str]]) -> str:
    coordinates = "".join(
        f'<Coordinate Order="{i}" X="{x}" Y="{y}" />' for i, (x, y) in enumerate(points)
    )
    return (
        f'<Annotation Name="{name}" Type="{kind}" PartOfGroup="{group}" Color="#F4FA58">'
        f"<Coordinates>{coordinates}</Coordinates></Annotation>"
    )


SQUARE = [("0", "0"), ("100", "0"), ("100", "100"), ("0", "100")]


def test_real_camelyon17_file(camelyon_annotation: Path) -> None:
    annotations = read_asap(camelyon_annotation)
    assert len(annotations.regions) == 3
    assert len(annotations.tumor) == 3 and annotations.carve_outs == ()
    assert {r.group for r in annotations.regions} == {"Tumor"}
    areas = [region.area for region in annotations.tumor]
    assert areas == pytest.approx([93_494, 92_491, 66_961], abs=1)
    first = annotations.tumor[0].vertices
    assert first.shape == (8, 2)
    assert first[0].tolist() == pytest.approx([12711.2998, 88778.1016])
    x_min, y_min, x_max, y_max = annotations.tumor[0].bounds
    assert 12_500 < x_min < x_max < 13_000 and 88_700 < y_min < y_max < 89_200


def test_groups_types_and_comma_decimals(tmp_path: Path) -> None:
    path = tmp_path / "a.xml"
    comma_square = [("0,5", "0,5"), ("100,5", "0,5"), ("100,5", "100,5"), ("0,5", "100,5")]
    path.write_text(
        _asap(
            _annotation("t", "Polygon", "metastases", comma_square),
            _annotation("r", "Rectangle", "_0", SQUARE),
            _annotation("s", "Spline", "_1", SQUARE),
            _annotation("n", "Polygon", "normal", SQUARE),
            _annotation("e", "Polygon", "Exclusion", SQUARE),
            _annotation("c", "Polygon", "_2", SQUARE),
            _annotation("d", "Dot", "Tumor", [("5", "5")]),
            _annotation("p", "PointSet", "Tumor", [("5", "5"), ("6", "6")]),
            _annotation("o", "Polygon", "Other", SQUARE),
        )
    )
    annotations = read_asap(path)
    assert [r.name for r in annotations.tumor] == ["t", "r", "s"]
    assert [r.name for r in annotations.carve_outs] == ["n", "e", "c"]
    assert annotations.tumor[0].vertices[0].tolist() == [0.5, 0.5]
    assert annotations.tumor[0].area == pytest.approx(10_000)
    assert "Other" in annotations.groups and "Dot" not in {r.kind for r in annotations.regions}


def test_vertices_follow_the_order_attribute(tmp_path: Path) -> None:
    path = tmp_path / "a.xml"
    coordinates = (
        '<Coordinate Order="2" X="10" Y="10" /><Coordinate Order="0" X="0" Y="0" />'
        '<Coordinate Order="1" X="10" Y="0" /><Coordinate Order="3" X="0" Y="10" />'
    )
    path.write_text(
        _asap(
            '<Annotation Name="a" Type="Polygon" PartOfGroup="Tumor">'
            f"<Coordinates>{coordinates}</Coordinates></Annotation>"
        )
    )
    vertices = read_asap(path).tumor[0].vertices
    assert vertices.tolist() == [[0, 0], [10, 0], [10, 10], [0, 10]]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("<ASAP_Annotations><Annotations>", "not well-formed XML"),
        ("<Other />", "not <ASAP_Annotations>"),
        ("<ASAP_Annotations />", "no <Annotations>"),
        (_asap(_annotation("a", "Polygon", "Tumor", [("1", "x"), ("2", "2"), ("3", "3")])),
         "not a number"),
        (_asap(_annotation("a", "Polygon", "Tumor", [("1", "1"), ("2", "2")])), "needs 3"),
        (_asap(_annotation("a", "Ellipse", "Tumor", SQUARE)), "unknown Type 'Ellipse'"),
        (_asap('<Annotation Name="a" Type="Polygon"><Coordinates /></Annotation>'),
         "PartOfGroup"),
        (_asap('<Annotation Name="a" Type="Polygon" PartOfGroup="Tumor"><Coordinates>'
               '<Coordinate Order="0" Y="1" /></Coordinates></Annotation>'), "X is missing"),
    ],
)
def test_malformed_files_raise_naming_the_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "patient_001_node_2.xml"
    path.write_text(content)
    with pytest.raises(AnnotationError, match=message) as caught:
        read_asap(path)
    assert caught.value.path == path
    assert str(path) in str(caught.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(AnnotationError, match="no such annotation file"):
        read_asap(tmp_path / "none.xml")


def test_polygon_area_is_orientation_independent() -> None:
    triangle = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 3.0]])
    assert polygon_area(triangle) == pytest.approx(6.0)
    assert polygon_area(triangle[::-1]) == pytest.approx(6.0)
