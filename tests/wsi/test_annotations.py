from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from wsi.annotations import (
    AnnotationError,
    Region,
    SlideAnnotations,
    check_regions_on_slide,
    clip_to_rectangle,
    contains_points,
    polygon_area,
    read_asap,
)
from wsi.synth import SynthConfig, plan_slide, write_asap_xml


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
        (
            _asap(_annotation("a", "Polygon", "Tumor", [("1", "x"), ("2", "2"), ("3", "3")])),
            "not a number",
        ),
        (_asap(_annotation("a", "Polygon", "Tumor", [("1", "1"), ("2", "2")])), "needs 3"),
        (_asap(_annotation("a", "Ellipse", "Tumor", SQUARE)), "unknown Type 'Ellipse'"),
        (_asap('<Annotation Name="a" Type="Polygon"><Coordinates /></Annotation>'), "PartOfGroup"),
        (
            _asap(
                '<Annotation Name="a" Type="Polygon" PartOfGroup="Tumor"><Coordinates>'
                '<Coordinate Order="0" Y="1" /></Coordinates></Annotation>'
            ),
            "X is missing",
        ),
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


# --------------------------------------------------------------------------------------
# Regions checked against the slide (check_regions_on_slide)
# --------------------------------------------------------------------------------------

SLIDE = (4000, 3000)  # level-0 (width, height) of the slides below


def _box(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64)


def _written(tmp_path: Path, groups: dict[str, list[np.ndarray]]) -> SlideAnnotations:
    """The annotations as read back from a real ASAP file (wsi.synth's writer)."""
    path = tmp_path / "patient_010_node_3.xml"
    write_asap_xml(path, groups)
    return read_asap(path)


def test_sound_regions_pass(tmp_path: Path) -> None:
    lesion = _box(100, 100, 900, 700)
    partly_outside = _box(-500, 2500, 600, 3400)  # clipped by the masks: fine
    carve_out = _box(300, 300, 400, 400)
    annotations = _written(tmp_path, {"Tumor": [lesion, partly_outside], "Exclusion": [carve_out]})
    check_regions_on_slide(annotations, SLIDE)


@pytest.mark.parametrize(
    ("polygon", "message"),
    [
        (
            _box(-10, -10, 4010, 3010),
            r"encloses the whole slide: all four corners of the "
            r"4000 x 3000 level-0 extent",
        ),
        (
            _box(50_000, 60_000, 50_400, 60_300),
            r"lies entirely outside the slide: its bounding box \(x 50000\.\.50400, "
            r"y 60000\.\.60300\) does not meet the slide's level-0 extent 0\.\.4000 x 0\.\.3000",
        ),
        (_box(-900, 100, -100, 500), "lies entirely outside the slide"),
        (_box(0, 0, 3000, 2500), r"implausibly large: it covers 62% of the 4000 x 3000 slide"),
        (np.array([[0, 0], [100, 100], [200, 200], [300, 300]]), "encloses no area"),
        (np.array([[10, 10], [50, 10], [10, 10], [50, 10]]), "2 distinct vertices"),
        # a figure of eight whose two loops cancel out in the signed area
        (np.array([[0, 0], [100, 100], [100, 0], [0, 100]]), "encloses no area"),
    ],
)
def test_bad_tumour_polygon_is_named(tmp_path: Path, polygon: np.ndarray, message: str) -> None:
    good = _box(100, 100, 200, 200)
    annotations = _written(tmp_path, {"Tumor": [good, polygon]})
    with pytest.raises(AnnotationError, match=message) as caught:
        check_regions_on_slide(annotations, SLIDE)
    assert caught.value.path == annotations.path
    text = str(caught.value)
    named = "annotation 1 'Annotation 1' (Polygon, group 'Tumor')"
    assert text.startswith(f"{annotations.path}: {named} ")
    assert "\n" not in text


def test_carve_outs_are_checked_and_indices_count_points(tmp_path: Path) -> None:
    path = tmp_path / "a.xml"
    far = [("90000", "90000"), ("90100", "90000"), ("90100", "90100"), ("90000", "90100")]
    path.write_text(
        _asap(
            _annotation("dot", "Dot", "Tumor", [("5", "5")]),
            _annotation("lesion", "Polygon", "_0", SQUARE),
            _annotation("hole", "Polygon", "_2", far),
        )
    )
    with pytest.raises(AnnotationError, match="entirely outside") as caught:
        check_regions_on_slide(read_asap(path), SLIDE)
    assert "annotation 2 'hole' (Polygon, group '_2')" in str(caught.value)


def test_area_limit_is_a_parameter_and_other_groups_are_not_checked(tmp_path: Path) -> None:
    large = _box(0, 0, 3000, 2500)  # 62 % of the slide
    annotations = _written(tmp_path, {"Tumor": [large], "Other": [_box(-9, -9, 1e6, 1e6)]})
    check_regions_on_slide(annotations, SLIDE, max_area_fraction=0.7)
    with pytest.raises(AnnotationError, match=r"more than max_area_fraction 0\.6"):
        check_regions_on_slide(annotations, SLIDE, max_area_fraction=0.6)
    with pytest.raises(ValueError, match="max_area_fraction"):
        check_regions_on_slide(annotations, SLIDE, max_area_fraction=0.0)
    with pytest.raises(ValueError, match="dimensions"):
        check_regions_on_slide(annotations, (0, 3000))


def test_only_the_part_inside_the_slide_counts(tmp_path: Path) -> None:
    # 2.5x the slide's area in all, but only a 1000-wide strip of it lies on the slide
    strip = _box(3000, -3000, 6000, 6000)
    check_regions_on_slide(_written(tmp_path, {"Tumor": [strip]}), SLIDE)


def test_non_finite_vertices_and_pickling() -> None:
    region = Region("r", "Tumor", "Polygon", np.array([[0, 0], [np.inf, 0], [5, 5]]), index=4)
    annotations = SlideAnnotations(path=Path("slide.xml"), regions=(region,))
    with pytest.raises(AnnotationError, match=r"annotation 4 'r' .* non-finite") as caught:
        check_regions_on_slide(annotations, SLIDE)
    clone = pickle.loads(pickle.dumps(caught.value))
    assert (clone.path, clone.reason, str(clone)) == (
        caught.value.path,
        caught.value.reason,
        str(caught.value),
    )


def test_real_camelyon17_annotation_fits_its_slide(camelyon_annotation: Path) -> None:
    """The real annotation passes for any slide that holds it: from the tightest size
    (its polygons reach x 13,483, y 89,161; the slide's real size is not recorded with the
    file) to a typical Camelyon-17 level-0 size of about 100,000 x 220,000 pixels."""
    annotations = read_asap(camelyon_annotation)
    x_max = max(region.bounds[2] for region in annotations.regions)
    y_max = max(region.bounds[3] for region in annotations.regions)
    tightest = (int(np.ceil(x_max)) + 1, int(np.ceil(y_max)) + 1)
    assert tightest == (13_484, 89_162)
    for dimensions in (tightest, (97_792, 221_184)):
        check_regions_on_slide(annotations, dimensions)
    with pytest.raises(AnnotationError, match=r"annotation 0 'Annotation 0'.*entirely outside"):
        check_regions_on_slide(annotations, (10_000, 20_000))  # the wrong slide's size


def test_synthetic_slides_pass(tmp_path: Path) -> None:
    """The demo's lesions and carve-outs, written and read back as the flow does."""
    config = SynthConfig()
    for patient, node in ((1, 1), (21, 1)):
        plan = plan_slide(config, patient, node, "macro")
        assert plan.carve_outs  # both groups are exercised
        annotations = _written(
            tmp_path, {"metastases": list(plan.metastases), "normal": list(plan.carve_outs)}
        )
        check_regions_on_slide(annotations, (config.width, config.height))


def test_clip_and_contains() -> None:
    # a U: 100 x 100 minus an 40 x 80 notch from the bottom edge
    u_shape = np.array(
        [[0, 0], [30, 0], [30, 80], [70, 80], [70, 0], [100, 0], [100, 100], [0, 100]], float
    )
    assert polygon_area(u_shape) == pytest.approx(6800)
    assert polygon_area(clip_to_rectangle(u_shape, 100, 50)) == pytest.approx(3000)
    assert len(clip_to_rectangle(u_shape, 100, 50)) >= 3
    assert clip_to_rectangle(u_shape + 500, 100, 100).shape == (0, 2)
    inside = contains_points(u_shape, np.array([[50.0, 50.0], [50.0, 90.0], [10.0, 10.0]]))
    assert inside.tolist() == [False, True, True]


def test_group_names_in_any_case_and_malformed_regions_of_other_groups(tmp_path: Path) -> None:
    """``tumor`` is ``Tumor``; a two-point ruler or an unknown type in a group that plays no
    part labels nothing and is skipped, where in a tumour or carve-out group it is an
    error naming the file."""
    path = tmp_path / "a.xml"
    path.write_text(
        _asap(
            _annotation("t", "Polygon", "tumor", SQUARE),
            _annotation("x", "Polygon", "EXCLUSION", SQUARE),
            _annotation("ruler", "Polygon", "None", [("1", "1"), ("50", "50")]),
            _annotation("m", "Measurement", "None", SQUARE),
        )
    )
    annotations = read_asap(path)
    assert [r.name for r in annotations.tumor] == ["t"]
    assert [r.name for r in annotations.carve_outs] == ["x"]
    assert annotations.ignored_groups == []
    for group in ("Tumor", "_2"):
        path.write_text(_asap(_annotation("ruler", "Polygon", group, [("1", "1"), ("5", "5")])))
        with pytest.raises(AnnotationError, match="needs 3") as caught:
            read_asap(path)
        assert str(path) in str(caught.value)
