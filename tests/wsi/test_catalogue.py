from __future__ import annotations

from pathlib import Path

import pytest

from wsi.catalogue import DatasetRootError, check_dataset_root, scan_camelyon, source_identities


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def _labels(root: Path, rows: list[str], header: str = "patient,stage") -> Path:
    path = root / "stage_labels.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def _patient_rows(patient: int, stage: str, nodes: list[str]) -> list[str]:
    rows = [f"patient_{patient:03d}.zip,{stage}"]
    rows += [f"patient_{patient:03d}_node_{n}.tif,{label}" for n, label in enumerate(nodes)]
    return rows


def test_nested_layout(tmp_path: Path) -> None:
    for patient in (0, 21):
        for node in range(2):
            center = patient // 20
            _touch(
                tmp_path
                / f"center_{center}"
                / f"patient_{patient:03d}"
                / f"patient_{patient:03d}_node_{node}.tif"
            )
    _touch(tmp_path / "lesion_annotations" / "patient_021_node_1.xml")
    _labels(
        tmp_path,
        _patient_rows(0, "pN0", ["negative", "negative"])
        + _patient_rows(21, "pN1", ["negative", "macro"]),
    )
    catalogue = scan_camelyon(tmp_path)
    assert catalogue.problems == []
    assert [s.slide_id for s in catalogue.slides] == [
        "patient_000_node_0",
        "patient_000_node_1",
        "patient_021_node_0",
        "patient_021_node_1",
    ]
    slide = catalogue.get("patient_021_node_1")
    assert (slide.patient, slide.node, slide.center) == (21, 1, 1)
    assert slide.node_label == "macro" and slide.patient_stage == "pN1"
    assert slide.annotation == tmp_path / "lesion_annotations" / "patient_021_node_1.xml"
    assert slide.path.is_file()
    assert catalogue.get("patient_000_node_0").annotation is None
    assert catalogue.centers == [0, 1]
    assert [s.slide_id for s in catalogue.for_centers([0])] == [
        "patient_000_node_0",
        "patient_000_node_1",
    ]


def test_flat_layout_and_centre_rule(tmp_path: Path) -> None:
    _touch(tmp_path / "center_2" / "patient_045_node_3.tif")
    _touch(tmp_path / "loose" / "patient_061_node_0.tif")  # no centre folder: patient // 20
    _labels(tmp_path, ["patient_045_node_3.TIF,itc", "patient_061_node_0.tif,negative"])
    catalogue = scan_camelyon(tmp_path)
    assert catalogue.problems == []
    assert catalogue.get("patient_045_node_3").center == 2
    assert catalogue.get("patient_061_node_0").center == 3


def test_center_column_wins(tmp_path: Path) -> None:
    _touch(tmp_path / "center_0" / "patient_001_node_0.tif")
    _touch(tmp_path / "elsewhere" / "patient_002_node_0.tif")
    _labels(
        tmp_path,
        ["patient_001_node_0.tif,negative,0", "patient_002_node_0.tif,negative,4"],
        header="patient,stage,center",
    )
    catalogue = scan_camelyon(tmp_path)
    assert catalogue.get("patient_002_node_0").center == 4
    assert catalogue.problems == []


def test_inconsistencies_are_reported_with_file_and_line(tmp_path: Path) -> None:
    _touch(tmp_path / "center_0" / "patient_000" / "patient_000_node_0.tif")
    _touch(tmp_path / "center_0" / "patient_000" / "patient_000_node_1.tif")  # no label row
    _touch(tmp_path / "center_0" / "patient_000" / "readme.tif")  # badly named
    _touch(tmp_path / "lesion_annotations" / "patient_099_node_0.xml")  # unknown slide
    labels = _labels(
        tmp_path,
        [
            "patient_000.zip,pN0",
            "patient_000_node_0.tif,negative",
            "patient_000_node_0.tif,macro",  # line 4: twice
            "patient_000_node_9.tif,negative",  # line 5: no such slide
            "patient_000_node_2.tif,huge",  # line 6: unknown label
            "garbage",  # line 7
        ],
    )
    catalogue = scan_camelyon(tmp_path)
    assert [s.slide_id for s in catalogue.slides] == ["patient_000_node_0", "patient_000_node_1"]
    assert catalogue.get("patient_000_node_1").node_label is None
    found = {(p.path.name, p.line): p.message for p in catalogue.problems}
    assert "labelled twice" in found[(labels.name, 4)]
    assert "label for missing slide patient_000_node_9" in found[(labels.name, 5)]
    assert "unparseable row" in found[(labels.name, 6)]
    assert "unparseable row" in found[(labels.name, 7)]
    assert "no row for patient_000_node_1" in found[("patient_000_node_1.tif", None)]
    assert "not named patient_XXX_node_Y" in found[("readme.tif", None)]
    assert "annotation for unknown slide" in found[("patient_099_node_0.xml", None)]
    assert len(catalogue.problems) == 7
    assert str(catalogue.problems[0]).startswith(str(labels))


def test_missing_labels_file_and_root(tmp_path: Path) -> None:
    _touch(tmp_path / "center_1" / "patient_020_node_0.tif")
    catalogue = scan_camelyon(tmp_path)
    assert len(catalogue.slides) == 1 and catalogue.slides[0].node_label is None
    assert [p.message for p in catalogue.problems] == ["labels file not found; slides unlabelled"]
    missing = scan_camelyon(tmp_path / "nowhere")
    assert missing.slides == [] and "not a directory" in missing.problems[0].message


def test_a_dataset_root_needs_the_labels_file_and_a_slide(tmp_path: Path) -> None:
    root = tmp_path / "camelyon17"
    (tmp_path / "a_file").write_text("")
    for path, reason in ((root, "no such directory"),
                         (tmp_path / "a_file", "not a directory")):  # fmt: skip
        with pytest.raises(DatasetRootError, match=reason) as raised:
            check_dataset_root(path)
        assert raised.value.path == path
    root.mkdir()
    _touch(root / "center_0" / "patient_000_node_0.tif")
    with pytest.raises(DatasetRootError, match=r"no stage_labels\.csv"):
        check_dataset_root(root)
    (root / "center_0" / "patient_000_node_0.tif").unlink()
    _labels(root, _patient_rows(0, "pN0", ["negative"]))
    with pytest.raises(DatasetRootError, match="no slide files"):
        check_dataset_root(root)
    _touch(root / "center_0" / "patient_000_node_0.tif")
    check_dataset_root(root)  # a labels file and one slide: a dataset


def test_bad_header(tmp_path: Path) -> None:
    _labels(tmp_path, ["patient_000.zip,pN0"], header="id,label")
    catalogue = scan_camelyon(tmp_path)
    assert catalogue.problems[0].line == 1
    assert "header" in catalogue.problems[0].message


def test_get_unknown_slide(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="patient_000_node_0"):
        scan_camelyon(tmp_path).get("patient_000_node_0")


def test_a_labels_file_not_in_utf8_is_one_problem_naming_it(tmp_path: Path) -> None:
    """A spreadsheet's "Unicode text" export is UTF-16: the scan says so of the file and
    goes on, the slides unlabelled, as its docstring promises (no traceback)."""
    _touch(tmp_path / "center_0" / "patient_000_node_0.tif")
    (tmp_path / "stage_labels.csv").write_text(
        "patient,stage\npatient_000.zip,pN0\npatient_000_node_0.tif,negative\n", encoding="utf-16"
    )
    catalogue = scan_camelyon(tmp_path)
    assert catalogue.slides[0].node_label is None
    problem = next(p for p in catalogue.problems if p.path.name == "stage_labels.csv")
    assert "not UTF-8" in problem.message and "CSV UTF-8" in problem.message


def test_slides_and_annotations_behind_links_or_a_folder_down_are_found(tmp_path: Path) -> None:
    """Real slides often lie on another disk (``center_0`` a link to it); the annotations'
    archive unzips into a folder of its own name, and some files end in ``.XML``. A link
    back up is no loop."""
    elsewhere = tmp_path / "bigdisk" / "c0"
    _touch(elsewhere / "patient_000" / "patient_000_node_0.tif")
    _touch(elsewhere / "patient_000" / "patient_000_node_1.tif")
    (elsewhere / "patient_000" / "up").symlink_to(elsewhere)  # a loop
    _touch(tmp_path / "bigdisk2" / "p1" / "patient_001_node_0.tif")
    (elsewhere / "patient_001").symlink_to(tmp_path / "bigdisk2" / "p1")  # a patient's too
    root = tmp_path / "camelyon17"
    root.mkdir()
    (root / "center_0").symlink_to(elsewhere)
    _touch(elsewhere / "patient_000" / "patient_000_node_2.tif")
    unzipped = root / "lesion_annotations" / "lesion_annotations"
    _touch(unzipped / "patient_000_node_1.XML")
    _touch(root / "lesion_annotations" / "patient_000_node_2.xml")
    _touch(unzipped / "patient_000_node_2.xml")  # the same stem again: the first kept
    _labels(root, _patient_rows(0, "pN1", ["negative", "macro", "micro"])
            + _patient_rows(1, "pN0", ["negative"]))  # fmt: skip
    check_dataset_root(root)
    catalogue = scan_camelyon(root)
    assert [s.slide_id for s in catalogue.slides] == [
        *(f"patient_000_node_{n}" for n in range(3)), "patient_001_node_0"]  # fmt: skip
    # and a store made of them is stale once any of them changes
    assert "center_0/patient_001/patient_001_node_0.tif" in source_identities(root, 0)
    assert {s.center for s in catalogue.slides} == {0}
    assert catalogue.get("patient_000_node_1").annotation == unzipped / "patient_000_node_1.XML"
    assert catalogue.get("patient_000_node_2").annotation == (
        root / "lesion_annotations" / "patient_000_node_2.xml"
    )
    (duplicate,) = catalogue.problems
    assert duplicate.path == unzipped / "patient_000_node_2.xml"
    assert "duplicate of" in duplicate.message


def test_rows_that_contradict_earlier_ones_are_problems_not_silently_the_last_word(
    tmp_path: Path,
) -> None:
    _touch(tmp_path / "center_0" / "patient_000_node_0.tif")
    labels = _labels(
        tmp_path,
        ["patient_000.zip,pN1,0",
         "patient_000_node_0.tif,macro,3",  # line 3: another centre
         "patient_000.zip,pN0,0",  # line 4: a second stage
         "patient_002.zip,pN2,0",  # line 5: a stage its nodes do not give
         "patient_002_node_0.tif,micro,0"],
        header="patient,stage,center",
    )  # fmt: skip
    _touch(tmp_path / "center_0" / "patient_002_node_0.tif")
    catalogue = scan_camelyon(tmp_path)
    slide = catalogue.get("patient_000_node_0")
    assert (slide.patient_stage, slide.center) == ("pN1", 0)  # the first rows'
    found = {(p.path.name, p.line): p.message for p in catalogue.problems}
    assert "center 3 for patient_000, whose earlier rows say 0" in found[(labels.name, 3)]
    assert "staged twice (line 2: pN1)" in found[(labels.name, 4)]
    assert "patient_002 is staged pN2, but its node rows give pN1mi" in found[(labels.name, 5)]
    assert len(found) == 3
