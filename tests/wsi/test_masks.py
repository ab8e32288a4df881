from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage
from skimage.color import rgb2hsv
from skimage.morphology import (
    closing,
    disk,
    opening,
    remove_small_holes,
    remove_small_objects,
)

from wsi.masks import (
    clean_mask,
    remove_small_objects_banded,
    saturation_codes,
    saturation_threshold,
    tissue_mask,
    tissue_mask_from_blocks,
)
from wsi.slide import area_sums, box_taps


def random_mask(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Blobs with speckle: small objects and small holes of every size up to a few dozen."""
    mask = ndimage.gaussian_filter(rng.random(shape), rng.uniform(1, 3)) > 0.5
    return mask ^ (rng.random(shape) < 0.04)


@pytest.mark.parametrize("factor", [1, 2, 3, 8])
def test_area_sums_are_exact_block_sums_for_integer_ratios(factor: int) -> None:
    rng = np.random.default_rng(factor)
    pixels = rng.integers(0, 256, (6 * factor + 1, 5 * factor + 2, 3), dtype=np.uint8)
    rows, cols = 6, 5
    sums = area_sums(pixels, np.arange(rows + 1) * factor, np.arange(cols + 1) * factor)
    blocks = pixels[: rows * factor, : cols * factor].astype(np.int64)
    expected = blocks.reshape(rows, factor, cols, factor, 3).sum(axis=(1, 3))
    assert sums.dtype == np.float32
    np.testing.assert_array_equal(sums, expected)


@pytest.mark.parametrize("ratio", [1.0288, 1.5, 2.7, 32.9 / 32, 0.9997])
def test_area_sums_preserve_mass_for_fractional_ratios(ratio: float) -> None:
    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 256, (97, 83, 3), dtype=np.uint8)
    rows, cols = int(97 / ratio), int(83 / ratio)
    row_edges, col_edges = np.arange(rows + 1) * ratio, np.arange(cols + 1) * ratio
    sums = area_sums(pixels, row_edges, col_edges)
    # The cells cover [0, rows * ratio) x [0, cols * ratio): the mass there is kept.
    covered = area_sums(pixels, [0, rows * ratio], [0, cols * ratio])[0, 0]
    np.testing.assert_allclose(sums.sum(axis=(0, 1)), covered, rtol=1e-5)
    # ... and equals the brute-force overlap-weighted sum of one cell.
    i, j = rows // 2, cols // 3
    weights_r = np.clip(
        np.minimum(row_edges[i + 1], np.arange(97) + 1) - np.maximum(row_edges[i], np.arange(97)),
        0,
        None,
    )
    weights_c = np.clip(
        np.minimum(col_edges[j + 1], np.arange(83) + 1) - np.maximum(col_edges[j], np.arange(83)),
        0,
        None,
    )
    brute = np.einsum("r,c,rck->k", weights_r, weights_c, pixels.astype(np.float64))
    np.testing.assert_allclose(sums[i, j], brute, rtol=1e-5)
    # Means of a constant image are that constant.
    flat = np.full((97, 83, 3), 200, np.uint8)
    areas = np.diff(row_edges)[:, None] * np.diff(col_edges)[None, :]
    means = area_sums(flat, row_edges, col_edges) / areas[..., None]
    np.testing.assert_allclose(means, 200, rtol=1e-5)


def test_box_taps_weights_are_the_cell_lengths() -> None:
    edges = np.arange(41) * 2.37
    index, weight = box_taps(edges, 98)
    assert index.shape == weight.shape and index.max() <= 97
    np.testing.assert_allclose(weight.sum(axis=0), np.diff(edges), rtol=1e-6)
    assert ((weight == 0) | ((weight > 0) & (weight <= 1))).all()


def test_saturation_codes_follow_skimage_hsv() -> None:
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    rgb[0, 0] = 0  # black: S = 0
    codes, histogram = saturation_codes(rgb, max_brightness=1.01)
    hsv = rgb2hsv(rgb)
    # round(255 S) up to the ties that float rounding breaks either way
    assert np.abs(codes.astype(int) - np.rint(hsv[..., 1] * 255)).max() <= 1
    assert codes[0, 0] == 0 and histogram.sum() == rgb.shape[0] * rgb.shape[1]
    bright, _ = saturation_codes(rgb, max_brightness=0.98)
    assert (bright[hsv[..., 2] >= 0.98] == 0).all()
    np.testing.assert_array_equal(bright[hsv[..., 2] < 0.98], codes[hsv[..., 2] < 0.98])
    with pytest.raises(ValueError, match="uint8"):
        saturation_codes(rgb.astype(np.float32))


def test_saturation_threshold_is_otsu_with_a_floor() -> None:
    histogram = np.zeros(256, np.int64)
    histogram[5], histogram[120] = 1000, 400
    assert 5 <= saturation_threshold(histogram, 0.07) < 120
    assert saturation_threshold(histogram, 0.9) == pytest.approx(0.9 * 255)
    single = np.zeros(256, np.int64)
    single[3] = 10
    assert saturation_threshold(single, 0.07) == pytest.approx(0.07 * 255)


def test_clean_mask_equals_skimage_morphology() -> None:
    rng = np.random.default_rng(11)
    for _ in range(4):
        mask = random_mask(rng, (73, 58))
        expected = closing(mask, disk(2))
        expected = opening(expected, disk(1))
        expected = remove_small_objects(expected, max_size=20)
        expected = remove_small_holes(expected, max_size=20)
        cleaned = clean_mask(mask, min_object_pixels=20, max_hole_pixels=20)
        np.testing.assert_array_equal(cleaned, expected)


@pytest.mark.parametrize("max_size", [1, 8, 40])
def test_banded_small_object_removal_equals_whole_mask(max_size: int) -> None:
    rng = np.random.default_rng(max_size)
    mask = random_mask(rng, (400, 61))
    for band_rows in (1, 17, 150):
        band_pixels = 61 * (band_rows + 2 * (max_size + 1))
        banded = remove_small_objects_banded(mask, max_size, band_pixels=band_pixels)
        np.testing.assert_array_equal(banded, remove_small_objects(mask, max_size=max_size))


def test_mask_from_blocks_equals_mask_of_the_whole_image() -> None:
    rng = np.random.default_rng(5)
    image = np.full((90, 70, 3), 240, np.uint8)
    image += rng.integers(0, 4, image.shape, dtype=np.uint8)
    blobs = ndimage.gaussian_filter(rng.random((90, 70)), 4) > 0.52
    image[blobs] = (190, 110, 170)
    whole = tissue_mask(image)
    assert 0.05 < whole.mean() < 0.95
    blocks = [
        (r, c, image[r : r + 25, c : c + 30]) for r in range(0, 90, 25) for c in range(0, 70, 30)
    ]
    np.testing.assert_array_equal(tissue_mask_from_blocks(blocks, (90, 70)), whole)
    with pytest.raises(ValueError, match="blocks cover"):
        tissue_mask_from_blocks(blocks[:-1], (90, 70))
