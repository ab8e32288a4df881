from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.path import Path as PolygonPath

from wsi.annotations import AnnotationError, read_asap
from wsi.masks import box_fractions, rasterize_polygons, tissue_mask, tumor_mask
from wsi.patches import (
    HEALTHY,
    TUMOR,
    UNUSABLE,
    NoLesionPatchError,
    NoTissueError,
    PatchError,
    PatchParams,
    assign_labels,
    candidate_grid,
    compute_candidates,
)
from wsi.slide import open_slide
from wsi.synth import write_asap_xml, write_pyramidal_tiff


def exact_tumor_fraction(
    tumor: list[np.ndarray], carve_outs: list[np.ndarray], x: int, y: int, extent: int
) -> float:
    """Independent reference: point sampling of the polygons on a 32 x 32 grid."""
    steps = (np.arange(32) + 0.5) * extent / 32
    points = np.stack(np.meshgrid(x + steps, y + steps), axis=-1).reshape(-1, 2)
    inside = np.zeros(len(points), dtype=bool)
    for vertices in tumor:
        inside |= PolygonPath(vertices).contains_points(points)
    for vertices in carve_outs:
        inside &= ~PolygonPath(vertices).contains_points(points)
    return float(inside.mean())


def test_tissue_mask_of_blank_and_tissue_images() -> None:
    blank = np.full((64, 64, 3), 242, dtype=np.uint8)
    blank += np.random.default_rng(0).integers(0, 3, blank.shape, dtype=np.uint8)
    assert not tissue_mask(blank).any()
    image = blank.copy()
    image[16:48, 8:40] = (200, 120, 180)  # pink-purple tissue
    mask = tissue_mask(image)
    assert mask[20:44, 12:36].all()
    assert not mask[:10].any() and not mask[:, 50:].any()
    with pytest.raises(ValueError, match="RGB"):
        tissue_mask(image[..., 0])


def test_rasterised_polygons_and_carve_outs() -> None:
    square = np.array([[0, 0], [400, 0], [400, 400], [0, 400]], dtype=float)
    hole = np.array([[110, 110], [290, 110], [290, 290], [110, 290]], dtype=float)
    mask = rasterize_polygons([square], (20, 20), downsample=40)
    assert mask[:10, :10].all() and mask.sum() == 100
    tumor = tumor_mask([square], [hole], (20, 20), downsample=40)
    assert tumor.sum() == 100 - 16 and not tumor[3:7, 3:7].any()


def test_box_fractions_match_brute_force() -> None:
    rng = np.random.default_rng(1)
    mask = rng.random((40, 60)) > 0.6
    coords = np.array([[0, 0], [160, 80], [320, 464], [800, 480]])
    fractions = box_fractions(mask, coords, extent=160, downsample=16)
    for (x, y), fraction in zip(coords, fractions, strict=True):
        window = mask[y // 16 : (y + 160) // 16, x // 16 : (x + 160) // 16]
        assert fraction == pytest.approx(window.mean())
    assert box_fractions(mask, np.zeros((0, 2)), 160, 16).shape == (0,)


def test_candidate_grid_is_aligned_and_inside() -> None:
    coords = candidate_grid((3000, 1100), 512)
    assert coords.shape == (5 * 2, 2)
    assert (coords % 512 == 0).all()
    assert (coords[:, 0] + 512 <= 3000).all() and (coords[:, 1] + 512 <= 1100).all()
    assert coords[:3].tolist() == [[0, 0], [512, 0], [1024, 0]]


def test_label_rule() -> None:
    tissue = np.array([0.9, 0.9, 0.9, 0.2, 0.6])
    tumor = np.array([0.0, 0.7, 0.3, 0.9, 0.5])
    params = PatchParams()
    negative = assign_labels(
        tissue, tumor * 0, node_label="negative", annotated=False, params=params
    )
    assert negative.tolist() == [HEALTHY, HEALTHY, HEALTHY, UNUSABLE, HEALTHY]
    annotated = assign_labels(tissue, tumor, node_label="macro", annotated=True, params=params)
    assert annotated.tolist() == [UNUSABLE, TUMOR, UNUSABLE, UNUSABLE, TUMOR]
    outside = PatchParams(healthy_source="outside_annotations")
    assert assign_labels(
        tissue, tumor, node_label="macro", annotated=True, params=outside
    ).tolist() == [HEALTHY, TUMOR, UNUSABLE, UNUSABLE, TUMOR]
    # never healthy patches from an ITC slide, and nothing from unannotated positives
    assert assign_labels(
        tissue, tumor, node_label="itc", annotated=True, params=outside
    ).tolist() == [UNUSABLE, TUMOR, UNUSABLE, UNUSABLE, TUMOR]
    assert (
        assign_labels(tissue, tumor, node_label="micro", annotated=False, params=params) == UNUSABLE
    ).all()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"patch_size": 4},
        {"tissue_fraction_min": 0},
        {"tumor_fraction_min": 1.5},
        {"healthy_source": "everywhere"},
        {"mask_mpp": 0},
        {"level": -1},
    ],
)
def test_invalid_patch_params(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        PatchParams(**kwargs)  # type: ignore[arg-type]


def test_candidates_of_synthetic_slides_follow_the_rule(synthetic_dataset) -> None:  # type: ignore[no-untyped-def]
    params = PatchParams(patch_size=256)
    tumour_slides = [s for s in synthetic_dataset.slides if s.label == "macro"]
    checked = 0
    for synth in tumour_slides[:4]:
        annotations = read_asap(synth.annotation_path)
        with open_slide(synth.slide_path) as slide:
            candidates = compute_candidates(slide, annotations, synth.label, params)
        assert (candidates.coords % candidates.extent == 0).all()
        tumor = [r.vertices for r in annotations.tumor]
        carve = [r.vertices for r in annotations.carve_outs]
        for (x, y), label, fraction in zip(
            candidates.coords, candidates.labels, candidates.tumor_fraction, strict=True
        ):
            reference = exact_tumor_fraction(tumor, carve, x, y, candidates.extent)
            # the mask-grid fraction tracks the exact one to within its pixel size
            assert abs(fraction - reference) < 0.25
            if label == TUMOR:
                assert reference >= 0.35
                checked += 1
            elif (
                reference > 0.8
                and candidates.tissue_fraction[
                    np.flatnonzero((candidates.coords == (x, y)).all(axis=1))[0]
                ]
                >= 0.6
            ):
                pytest.fail(f"{synth.slide_id} ({x}, {y}) is inside a lesion but not tumour")
    assert checked > 0
    negative = next(s for s in synthetic_dataset.slides if s.label == "negative")
    with open_slide(negative.slide_path) as slide:
        candidates = compute_candidates(slide, None, "negative", params)
    on_tissue = candidates.tissue_fraction >= params.tissue_fraction_min
    assert on_tissue.any()
    assert (candidates.labels[on_tissue] == HEALTHY).all()
    assert (candidates.labels[~on_tissue] == UNUSABLE).all()


@pytest.fixture()
def blank_slide(tmp_path: Path) -> Path:
    path = tmp_path / "patient_000_node_0.tif"
    write_pyramidal_tiff(path, np.full((1024, 1536, 3), 240, np.uint8), mpp=0.25, tile_size=256)
    return path


def test_slide_without_tissue(blank_slide: Path) -> None:
    with open_slide(blank_slide) as slide, pytest.raises(NoTissueError) as caught:
        compute_candidates(slide, None, "negative", PatchParams(patch_size=256))
    assert "patient_000_node_0" in str(caught.value) and "no tissue" in str(caught.value)


@pytest.fixture()
def tissue_slide(tmp_path: Path) -> Path:
    """A slide of one rectangle of tissue, (100..1400) x (100..900) px at 0.25 µm/px."""
    image = np.full((1024, 1536, 3), 240, np.uint8)
    image[100:900, 100:1400] = (190, 110, 170)
    path = tmp_path / "patient_000_node_1.tif"
    write_pyramidal_tiff(path, image, mpp=0.25, tile_size=256)
    return path


def test_lesion_too_small_for_a_patch(tissue_slide: Path, tmp_path: Path) -> None:
    path = tissue_slide
    xml = tmp_path / "patient_000_node_1.xml"
    write_asap_xml(xml, {"metastases": [np.array([[500, 500], [530, 500], [530, 530.0]])]})
    with open_slide(path) as slide:
        with pytest.raises(NoLesionPatchError, match="no candidate has tumour fraction"):
            compute_candidates(slide, read_asap(xml), "micro", PatchParams(patch_size=256))
        # an ITC slide is allowed to give nothing
        candidates = compute_candidates(slide, read_asap(xml), "itc", PatchParams(patch_size=256))
        assert not (candidates.labels == TUMOR).any()
        with pytest.raises(PatchError, match="level 9 requested"):
            compute_candidates(slide, None, "negative", PatchParams(level=9))


def test_an_annotation_without_a_tumour_group_fails_the_slide_naming_the_file(
    tissue_slide: Path, tmp_path: Path
) -> None:
    """A macro slide whose file's areas are all in groups that play no part would give no
    tumour patch, silently, though the catalogue planned it as their source."""
    path = tissue_slide
    xml = tmp_path / "patient_000_node_1.xml"
    write_asap_xml(xml, {"Lesion": [np.array([[200, 200], [900, 200], [900, 800.0]])]})
    with open_slide(path) as slide:
        for label in ("macro", "itc", None):
            with pytest.raises(AnnotationError, match="no area in a tumour group") as caught:
                compute_candidates(slide, read_asap(xml), label, PatchParams(patch_size=256))
            assert str(xml) in str(caught.value) and "'Lesion'" in str(caught.value)
        negative = compute_candidates(
            slide, read_asap(xml), "negative", PatchParams(patch_size=256)
        )
        assert (negative.labels == HEALTHY).any() and not (negative.labels == TUMOR).any()


def test_streamed_mask_equals_the_mask_of_the_thumbnail(synthetic_dataset) -> None:  # type: ignore[no-untyped-def]
    """compute_candidates reads by regions; its tissue fractions are those of the in-memory
    mask of the whole thumbnail, whatever the region size."""
    params = PatchParams(patch_size=256, mask_mpp=4.1)  # a fractional level-to-mask ratio
    for synth in synthetic_dataset.slides[:2]:
        with open_slide(synth.slide_path) as slide:
            candidates = compute_candidates(slide, None, "negative", params)
            small = compute_candidates(slide, None, "negative", params, region_pixels=50_000)
            thumbnail = slide.thumbnail_at_downsample(candidates.mask_downsample)
        mask = tissue_mask(thumbnail, min_saturation=params.min_saturation)
        assert 0.02 < mask.mean() < 0.98
        expected = box_fractions(
            mask, candidates.coords, candidates.extent, candidates.mask_downsample
        )
        np.testing.assert_array_equal(candidates.tissue_fraction, expected)
        np.testing.assert_array_equal(small.tissue_fraction, expected)


def test_pyramid_less_slide_is_read_by_regions(tmp_path: Path) -> None:
    image = np.full((1536, 2048, 3), 240, np.uint8)
    image[200:1300, 300:1700] = (190, 110, 170)
    path = tmp_path / "patient_000_node_0.tif"
    write_pyramidal_tiff(path, image, mpp=0.25, tile_size=256, levels=1)
    params = PatchParams(patch_size=256, mask_mpp=2.3)
    with open_slide(path) as slide:
        assert slide.level_count == 1
        with pytest.raises(MemoryError):
            slide.read_level(0, max_pixels=2**20)
        whole = compute_candidates(slide, None, "negative", params)
        banded = compute_candidates(slide, None, "negative", params, region_pixels=2**16)
    np.testing.assert_array_equal(whole.tissue_fraction, banded.tissue_fraction)
    inside = (whole.coords[:, 0] >= 300) & (whole.coords[:, 0] + 256 <= 1700)
    inside &= (whole.coords[:, 1] >= 200) & (whole.coords[:, 1] + 256 <= 1300)
    assert (whole.tissue_fraction[inside] > 0.9).all()
    assert (whole.labels[inside] == HEALTHY).all()


_PEAK_CHILD = """
import sys
from wsi.annotations import read_asap
from wsi.patches import PatchParams, compute_candidates
from wsi.slide import open_slide

def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

path, xml, mask_mpp = sys.argv[1], sys.argv[2], float(sys.argv[3])
with open_slide(path) as slide:
    level = slide.best_level_for_downsample(mask_mpp / slide.mpp)
    width, height = slide.level_dimensions[level]
    before = peak()
    candidates = compute_candidates(slide, read_asap(xml), "macro", PatchParams(mask_mpp=mask_mpp))
print(before, peak(), level, width * height, int((candidates.labels == 1).sum()))
"""


def test_mask_memory_is_bounded_on_a_large_slide(tmp_path: Path) -> None:
    """On a 134-megapixel slide written by the bench's streaming writer, with the mask made
    from level 1 (33 megapixels: 100 MB as RGB, several times that as the old whole-level
    read and float resize took it), the worker grows by a few bytes per mask pixel only."""
    from bench.slidegen import SlideSpec, write_slide

    spec = SlideSpec(width=8192, height=16_384, pieces=3)
    written = write_slide(spec, tmp_path / "slide.tif", tmp_path / "slide.xml")
    assert written.levels >= 6 and 0.15 < written.tissue_fraction < 0.25
    mask_mpp = 3.8 * spec.mpp  # just coarser than level 1: a ratio of 1.9 from level 1
    arguments = [str(written.path), str(written.annotation), str(mask_mpp)]
    result = subprocess.run(
        [sys.executable, "-c", _PEAK_CHILD, *arguments],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    before, after, level, level_pixels, tumour = (int(v) for v in result.stdout.split())
    assert level == 1 and level_pixels == spec.width * spec.height // 4
    assert tumour > 0
    grid_pixels = spec.width * spec.height / 3.8**2
    # Codes, mask, morphology and tumour mask: a few bytes per mask pixel; plus a constant
    # (a band of pixels in float32, OpenSlide's tile cache), where the old whole-level read,
    # uint16 composite and float64 resize took over 1 GB here.
    assert after - before < 8 * grid_pixels + 160e6 < 0.3e9
