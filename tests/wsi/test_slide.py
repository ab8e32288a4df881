from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wsi.slide import SlideReadError, composite_on_white, open_slide

VALID = ["small.svs", "boxes.tiff"]
BROKEN = ["unopenable.tiff", "unreadable.svs"]


@pytest.mark.parametrize("name", VALID)
def test_both_backends_agree_on_geometry(openslide_fixtures: Path, name: str) -> None:
    path = openslide_fixtures / name
    with open_slide(path, "openslide") as a, open_slide(path, "tiffslide") as b:
        assert a.backend == "openslide" and b.backend == "tiffslide"
        assert a.level_count == b.level_count >= 1
        assert a.level_dimensions == b.level_dimensions
        assert a.level_downsamples == pytest.approx(b.level_downsamples)
        assert a.mpp == pytest.approx(b.mpp)
        assert a.tile_size == b.tile_size


@pytest.mark.parametrize("name", VALID)
def test_both_backends_read_identical_pixels(openslide_fixtures: Path, name: str) -> None:
    path = openslide_fixtures / name
    with open_slide(path, "openslide") as a, open_slide(path, "tiffslide") as b:
        for level in range(a.level_count):
            size = a.level_dimensions[level]
            pixels_a = a.read_region(0, 0, level, size)
            pixels_b = b.read_region(0, 0, level, size)
            assert pixels_a.dtype == np.uint8
            assert pixels_a.shape == (size[1], size[0], 3)
            np.testing.assert_array_equal(pixels_a, pixels_b)
        # an interior, unaligned region
        region_a, region_b = a.read_region(3, 5, 0, (7, 9)), b.read_region(3, 5, 0, (7, 9))
        np.testing.assert_array_equal(region_a, region_b)


def test_boxes_tiff_matches_its_reference_rendering(openslide_fixtures: Path) -> None:
    from PIL import Image

    reference = np.asarray(Image.open(openslide_fixtures / "boxes.png").convert("RGB"))
    with open_slide(openslide_fixtures / "boxes.tiff") as slide:
        level = next(i for i, d in enumerate(slide.level_dimensions) if d == reference.shape[1::-1])
        pixels = slide.read_region(0, 0, level, slide.level_dimensions[level])
    # JPEG tiles: the two decoders may differ by rounding only.
    assert np.abs(pixels.astype(int) - reference.astype(int)).max() <= 8


@pytest.mark.parametrize("backend", ["openslide", "tiffslide"])
def test_area_outside_the_slide_is_white(openslide_fixtures: Path, backend: str) -> None:
    with open_slide(openslide_fixtures / "boxes.tiff", backend) as slide:
        width, height = slide.dimensions
        inside = slide.read_region(0, 0, 0, (width, height))
        region = slide.read_region(width - 10, height - 10, 0, (20, 20))
    assert (region[10:, :] == 255).all() and (region[:, 10:] == 255).all()
    np.testing.assert_array_equal(region[:10, :10], inside[-10:, -10:])


def test_auto_backend_prefers_openslide(openslide_fixtures: Path) -> None:
    with open_slide(openslide_fixtures / "small.svs") as slide:
        assert slide.backend == "openslide"
        assert slide.mpp == pytest.approx(0.499)


@pytest.mark.parametrize("name", BROKEN)
@pytest.mark.parametrize("backend", ["auto", "openslide", "tiffslide"])
def test_broken_files_raise_one_clear_error(
    openslide_fixtures: Path, name: str, backend: str
) -> None:
    path = openslide_fixtures / name
    with pytest.raises(SlideReadError) as caught:
        open_slide(path, backend)
    error = caught.value
    assert error.path == path
    assert str(path) in str(error)
    expected = ["openslide", "tiffslide"] if backend == "auto" else [backend]
    assert list(error.reasons) == expected
    for backend_name in expected:
        assert backend_name in str(error)
        assert error.reasons[backend_name]


def test_missing_file_is_a_slide_read_error(tmp_path: Path) -> None:
    with pytest.raises(SlideReadError, match="no such file"):
        open_slide(tmp_path / "patient_000_node_0.tif")


def test_text_file_is_a_slide_read_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.tif"
    path.write_text("not a slide")
    with pytest.raises(SlideReadError) as caught:
        open_slide(path)
    assert set(caught.value.reasons) == {"openslide", "tiffslide"}


def test_unknown_backend_is_rejected(openslide_fixtures: Path) -> None:
    with pytest.raises(ValueError, match="unknown slide backend"):
        open_slide(openslide_fixtures / "small.svs", "bioformats")  # type: ignore[arg-type]


def test_thumbnail_at_requested_resolution(openslide_fixtures: Path) -> None:
    with open_slide(openslide_fixtures / "boxes.tiff") as slide:
        mpp = slide.mpp
        assert mpp is not None
        thumbnail = slide.thumbnail(mpp * 5)
        assert thumbnail.shape == (slide.dimensions[1] // 5, slide.dimensions[0] // 5, 3)
        full = slide.read_region(0, 0, 0, slide.dimensions)
    # block means of level 0 and the thumbnail agree up to interpolation
    block = full[:245, :300].reshape(49, 5, 60, 5, 3).mean(axis=(1, 3))
    assert np.abs(block - thumbnail[:49].astype(float)).mean() < 12
    with pytest.raises(ValueError, match="finer than level 0"):
        open_slide(Path(slide.path)).thumbnail_at_downsample(0.5)


def test_thumbnail_needs_a_resolution(openslide_fixtures: Path) -> None:
    with open_slide(openslide_fixtures / "boxes.tiff") as slide:
        slide.mpp = None
        with pytest.raises(SlideReadError, match="no resolution"):
            slide.thumbnail(8.0)


def test_read_region_rejects_bad_arguments(openslide_fixtures: Path) -> None:
    with open_slide(openslide_fixtures / "small.svs") as slide:
        with pytest.raises(ValueError, match="level 3"):
            slide.read_region(0, 0, 3, (4, 4))
        with pytest.raises(ValueError, match="positive"):
            slide.read_region(0, 0, 0, (0, 4))


def test_composite_on_white() -> None:
    rgba = np.array([[[0, 0, 0, 0], [0, 0, 0, 255], [100, 50, 0, 128]]], dtype=np.uint8)
    rgb = composite_on_white(rgba)
    assert rgb.shape == (1, 3, 3)
    assert rgb[0, 0].tolist() == [255, 255, 255]
    assert rgb[0, 1].tolist() == [0, 0, 0]
    assert rgb[0, 2].tolist() == [177, 152, 127]


def _block_means(pixels: np.ndarray, factor: int, shape: tuple[int, int]) -> np.ndarray:
    rows, cols = shape
    blocks = pixels[: rows * factor, : cols * factor].astype(np.float64)
    means = blocks.reshape(rows, factor, cols, factor, 3).mean(axis=(1, 3))
    return np.rint(means).astype(np.uint8)


@pytest.fixture(scope="module")
def flat_slide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-level (pyramid-less) tiled slide with structure at every scale."""
    from scipy import ndimage

    from wsi.synth import write_pyramidal_tiff

    rng = np.random.default_rng(2)
    field = ndimage.gaussian_filter(rng.random((1000, 1300)), 12)
    image = np.full((1000, 1300, 3), 238, np.uint8)
    image[field > np.quantile(field, 0.6)] = (196, 118, 172)
    image = np.clip(image + rng.integers(-6, 7, image.shape), 0, 255).astype(np.uint8)
    path = tmp_path_factory.mktemp("flat") / "patient_000_node_0.tif"
    write_pyramidal_tiff(path, image, mpp=0.25, tile_size=128, levels=1)
    return path


@pytest.mark.parametrize("backend", ["openslide", "tiffslide"])
def test_thumbnail_of_a_flat_slide_is_read_by_regions(flat_slide: Path, backend: str) -> None:
    with open_slide(flat_slide, backend) as slide:
        assert slide.level_count == 1
        with pytest.raises(MemoryError, match="by regions"):
            slide.read_level(0, max_pixels=100_000)
        level = slide.read_level(0)
        # Integer ratio: exact block means, however small the regions.
        expected = _block_means(level, 8, slide.thumbnail_shape(8))
        for region_pixels in (1, 40_000, 10**8):
            thumbnail = slide.thumbnail_at_downsample(8, region_pixels=region_pixels)
            np.testing.assert_array_equal(thumbnail, expected)
        # Fractional ratio: the same whatever the regions, and close to block means.
        reference = slide.thumbnail_at_downsample(6.3, region_pixels=10**8)
        assert reference.shape == (int(1000 / 6.3), int(1300 / 6.3), 3)
        for region_pixels in (1, 30_000):
            thumbnail = slide.thumbnail_at_downsample(6.3, region_pixels=region_pixels)
            np.testing.assert_array_equal(thumbnail, reference)


def test_thumbnail_blocks_tile_the_grid(flat_slide: Path) -> None:
    with open_slide(flat_slide) as slide:
        shape = slide.thumbnail_shape(5.5)
        seen = np.zeros(shape, np.int64)
        for row, col, block in slide.thumbnail_blocks(5.5, region_pixels=20_000):
            assert block.dtype == np.uint8 and block.shape[2] == 3
            seen[row : row + block.shape[0], col : col + block.shape[1]] += 1
        assert (seen == 1).all()
        # Width / columns gives the columns back despite floating point.
        assert slide.thumbnail_shape(slide.dimensions[0] / shape[1])[1] == shape[1]


def test_pyramid_thumbnail_is_area_mean_of_the_finer_level(openslide_fixtures: Path) -> None:
    with open_slide(openslide_fixtures / "boxes.tiff") as slide:
        level = slide.best_level_for_downsample(4)
        factor = round(4 / slide.level_downsamples[level])
        pixels = slide.read_level(level)
        thumbnail = slide.thumbnail_at_downsample(4, region_pixels=5_000)
        np.testing.assert_array_equal(thumbnail, _block_means(pixels, factor, thumbnail.shape[:2]))


def test_composite_on_white_keeps_opaque_pixels_and_does_not_widen() -> None:
    rgba = np.zeros((4, 5, 4), np.uint8)
    rgba[..., :3] = 90
    rgba[..., 3] = 255
    rgba[0, 0, 3] = 0
    rgb = composite_on_white(rgba)
    assert rgb.dtype == np.uint8 and rgb.flags.c_contiguous
    assert rgb[0, 0].tolist() == [255, 255, 255] and (rgb.reshape(-1, 3)[1:] == 90).all()


@pytest.mark.parametrize("keep", [0.3, 0.7, 0.95])
def test_a_truncated_slide_says_truncated_not_fewer_levels(
    synthetic_dataset,
    tmp_path: Path,
    keep: float,  # type: ignore[no-untyped-def]
) -> None:
    """A slide cut short (a copy or download interrupted) is an error naming the file and
    the truncation, with every backend; tiffslide alone would open the levels before the
    cut and the slide would look like one with fewer levels."""
    source = next(synthetic_dataset.root.glob("center_0/*/*.tif"))
    path = tmp_path / source.name
    data = source.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    for backend in ("auto", "tiffslide"):
        with pytest.raises(SlideReadError) as caught:
            open_slide(path, backend)  # type: ignore[arg-type]
        assert caught.value.path == path
        assert "truncated or corrupt TIFF" in caught.value.reasons["tiffslide"]
    with open_slide(source, "tiffslide") as whole:  # the intact file is not suspected
        assert whole.level_count > 1


def test_a_stripped_slide_reads_by_regions_and_a_greyscale_one_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    """tiffslide gives a stripped level a tile size of 0 (a ZeroDivisionError in the mask's
    read before), and hands a greyscale image over unconverted (a bare ValueError at the
    first read): the one is read as untiled, the other refused when opened."""
    import tifffile

    from wsi.params import PatchParams
    from wsi.patches import compute_candidates

    image = np.full((1024, 1536, 3), 245, np.uint8)
    image[200:800, 300:1200] = (200, 110, 170)
    stripped = tmp_path / "stripped.tif"
    resolution = {"resolution": (40000, 40000), "resolutionunit": "CENTIMETER", "metadata": None}
    tifffile.imwrite(stripped, image, photometric="rgb", compression="jpeg", rowsperstrip=16,
                     **resolution)  # fmt: skip
    with open_slide(stripped, "tiffslide") as slide:
        assert slide.level_tile_size(0) is None
        candidates = compute_candidates(slide, None, "negative", PatchParams(patch_size=128))
        assert (candidates.tissue_fraction > 0.9).any()
    grey = tmp_path / "grey.tif"
    tifffile.imwrite(grey, image[..., 0], photometric="minisblack", tile=(256, 256), **resolution)
    with pytest.raises(SlideReadError, match="1 channel") as caught:
        open_slide(grey, "tiffslide")
    assert str(grey) in str(caught.value)


@pytest.mark.parametrize("backend", ["openslide", "tiffslide"])
def test_a_slide_of_pixels_that_are_not_square_is_refused_naming_both(
    tmp_path: Path, backend: str
) -> None:
    """A patch of such pixels is tissue stretched: 0.25 µm across, 0.5 µm down."""
    import tifffile

    image = np.full((512, 512, 3), 230, np.uint8)
    square, stretched = tmp_path / "square.tif", tmp_path / "stretched.tif"
    for path, down in ((square, 40000), (stretched, 20000)):
        tifffile.imwrite(path, image, photometric="rgb", tile=(256, 256), metadata=None,
                         resolution=(40000, down), resolutionunit="CENTIMETER")  # fmt: skip
    with open_slide(square, backend) as slide:  # type: ignore[arg-type]
        assert slide.mpp == pytest.approx(0.25)
    with pytest.raises(SlideReadError) as caught:
        open_slide(stretched, backend)  # type: ignore[arg-type]
    assert caught.value.path == stretched
    assert "its pixels are not square (0.25 µm across, 0.5 µm down)" in str(caught.value)
    with open_slide(stretched, backend, mpp=0.25) as slide:  # type: ignore[arg-type]
        assert slide.mpp == 0.25  # a resolution given is the user's word


@pytest.fixture(scope="module")
def sparse_slide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-level slide whose level-0 tile (col 1, row 1) and level-1 tile (1, 0) are
    stored with no data (byte count 0), losslessly compressed so every reader agrees."""
    import tifffile

    rng = np.random.default_rng(5)
    tile = 128
    path = tmp_path_factory.mktemp("sparse") / "patient_000_node_0.tif"
    with tifffile.TiffWriter(path) as writer:
        for level, (height, width, empty) in enumerate([(512, 768, (1, 1)), (256, 384, (0, 1))]):
            image = rng.integers(60, 200, (height, width, 3), dtype=np.uint8)
            tiles = [
                None if (row, col) == empty else image[row * tile : (row + 1) * tile,
                                                       col * tile : (col + 1) * tile]
                for row in range(height // tile) for col in range(width // tile)
            ]  # fmt: skip
            pixels_per_cm = 1e4 / (0.25 * 2**level)
            writer.write(iter(tiles), shape=(height, width, 3), dtype=np.uint8, tile=(tile, tile),
                         photometric="rgb", compression="zlib", subfiletype=1 if level else 0,
                         resolution=(pixels_per_cm, pixels_per_cm), resolutionunit="CENTIMETER",
                         metadata=None)  # fmt: skip
    with tifffile.TiffFile(path) as tif:
        assert [list(page.databytecounts).count(0) for page in tif.pages] == [1, 1]
    return path


def test_a_tile_stored_empty_reads_white_through_every_reader(sparse_slide: Path) -> None:
    """A sparse TIFF leaves tiles out (byte count 0): openslide reads them transparent (white
    here), and tiffslide reads them black unless the slide whitens them, which would hand
    the tissue detector and the patches dark squares no other reader sees."""
    from wsi.tiles import read_patches

    reads = {}
    for backend in ("openslide", "tiffslide"):
        with open_slide(sparse_slide, backend) as slide:
            reads[backend] = (
                slide.read_region(64, 64, 0, (256, 256)),  # across the empty tile and others
                slide.read_region(0, 0, 1, (384, 256)),  # level 1, whole
                slide.thumbnail_at_downsample(16),
            )
    reads["tiles"] = (read_patches(sparse_slide, 0, [(64, 64)], 256, backend="tiles")[0],)
    level0, level1, thumbnail = reads["openslide"]
    assert (level0[64:192, 64:192] == 255).all()  # the empty tile: level-0 rows/cols 128..255
    assert (level0[:64] < 255).all() and (level0[192:, 192:] < 255).all()
    assert (level1[:128, 128:256] == 255).all()
    assert (level1[128:] < 255).all() and (level1[:, 256:] < 255).all()
    for backend, pixels in reads.items():
        for got, expected in zip(pixels, reads["openslide"], strict=False):
            np.testing.assert_array_equal(got, expected, err_msg=backend)
    # From level 1: its empty tile is level-0 rows 0..255, columns 256..511.
    assert (thumbnail[:16, 16:32] == 255).all()
    assert (thumbnail[16:] < 255).all() and (thumbnail[:, 32:] < 255).all()


def test_empty_tiles_are_found_from_the_byte_counts_and_mapped_to_pixels() -> None:
    from wsi.slide import empty_tile_grid, in_empty_tiles

    assert empty_tile_grid([5, 7, 9, 1], 2, 2) is None
    grid = empty_tile_grid([5, 0, 9, 0, 4, 0], 3, 2)
    assert grid is not None
    np.testing.assert_array_equal(grid, [[False, True, False], [True, False, True]])
    rows, cols = np.arange(-2, 12), np.arange(-3, 20)
    hit = in_empty_tiles(rows, cols, (6, 5), grid)  # tiles 6 wide, 5 tall
    brute = np.array([[0 <= r < 10 and 0 <= c < 18 and bool(grid[r // 5, c // 6])
                       for c in cols] for r in rows])  # fmt: skip
    np.testing.assert_array_equal(hit, brute)
    assert hit.any() and not hit.all()
