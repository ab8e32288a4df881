"""One slide's candidates: any failure is that slide's, recorded with its step and reason."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from wsi.catalogue import SlideRecord, scan_camelyon
from wsi.params import SamplingParams
from wsi.patches import PatchParams
from wsi.preprocess import SlideStepError, group_outcomes, shortfalls, slide_patches
from wsi.sampling import SlidePatches
from wsi.slide import open_slide
from wsi.summary import SlideFailure
from wsi.synth import SynthManifest, write_asap_xml


@pytest.mark.parametrize(
    ("lesion", "reason"),
    [
        (lambda w, h: [[-10, -10], [w + 10, -10], [w + 10, h + 10], [-10, h + 10]],
         "encloses the whole slide"),
        (lambda w, h: [[5 * w, 5 * h], [6 * w, 5 * h], [6 * w, 6 * h]],
         "lies entirely outside the slide"),
    ],
)  # fmt: skip
def test_an_implausible_lesion_fails_its_slide_naming_the_polygon(
    synthetic_dataset: SynthManifest,
    tmp_path: Path,
    lesion: Callable[[int, int], list[list[int]]],
    reason: str,
) -> None:
    root = tmp_path / "data"
    shutil.copytree(synthetic_dataset.root, root)
    record = next(r for r in scan_camelyon(root).slides if r.annotation is not None)
    with open_slide(record.path) as slide:
        width, height = slide.dimensions
    write_asap_xml(record.annotation, {"Tumor": [np.array(lesion(width, height), float)]})

    with pytest.raises(SlideStepError) as caught:
        slide_patches(record, PatchParams(patch_size=128))

    failure = caught.value.failure
    assert (failure.slide, failure.stage) == (record.slide_id, "annotation")
    assert str(record.annotation) in failure.error and "annotation 0" in failure.error
    assert reason in failure.error


def _slide(slide_id: str, labels: list[int]) -> SlidePatches:
    coords = np.array([[512 * i, 0] for i in range(len(labels))], dtype=np.int64)
    return SlidePatches(slide_id, slide_id[:11], Path(f"{slide_id}.tif"), coords,
                        np.array(labels, dtype=np.int64))  # fmt: skip


def _record(slide_id: str, center: int) -> SlideRecord:
    return SlideRecord(slide_id, Path(f"{slide_id}.tif"), int(slide_id[8:11]), 0, center,
                       None, None, None)  # fmt: skip


def test_outcomes_are_grouped_by_centre_with_each_centres_failures() -> None:
    """A failed slide and a catalogue problem land in their centre's report; a problem
    naming no centre is nobody's; every slide with candidates stays with its centre."""
    records = [_record("patient_000_node_0", 0), _record("patient_020_node_0", 1),
               _record("patient_021_node_0", 1)]  # fmt: skip
    failed = SlideFailure("patient_020_node_0", "open", "truncated", 1)
    outcomes = [_slide("patient_000_node_0", [0, 1]), failed, _slide("patient_021_node_0", [1])]
    problems = [SlideFailure("stage_labels.csv", "catalogue", "no row", None),
                SlideFailure("patient_001_node_0.xml", "catalogue", "no slide", 0)]  # fmt: skip
    grouped = group_outcomes(records, outcomes, problems)
    assert [p.slide_id for p in grouped.patches[0]] == ["patient_000_node_0"]
    assert [p.slide_id for p in grouped.patches[1]] == ["patient_021_node_0"]
    assert grouped.failures[0] == [problems[1]] and grouped.failures[1] == [failed]
    assert grouped.unplaced == [problems[0]]
    assert grouped.patches[2] == [] and grouped.failures[2] == []  # a centre with no slide


def test_short_centres_are_found_before_any_store_and_the_others_pass() -> None:
    patches = {0: [_slide("patient_000_node_0", [0, 0, 1, 1])],
               1: [_slide("patient_020_node_0", [0, 0, 0, 1])]}  # fmt: skip
    sampling = SamplingParams(patches_per_class=2, shortfall="fail")
    short = shortfalls([0, 1, 2], patches, lambda center: sampling)
    assert set(short) == {1, 2}  # centre 1 has one tumour patch, centre 2 no slide at all
    assert short[1].startswith("centre 1: can supply only 3 healthy, 1 tumor patches")
    lenient = SamplingParams(patches_per_class=2, shortfall="take_available")
    assert shortfalls([0, 1], patches, lambda center: lenient) == {}
