"""One slide's candidates: any failure is that slide's, recorded with its step and reason."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from wsi.catalogue import scan_camelyon
from wsi.patches import PatchParams
from wsi.preprocess import SlideStepError, slide_patches
from wsi.slide import open_slide
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
