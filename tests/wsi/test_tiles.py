"""The tile reader gives the pixels of ``Slide.read_region`` (openslide and tiffslide)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile

from wsi.slide import SlideReadError, open_slide
from wsi.synth import write_pyramidal_tiff
from wsi.tiles import TileReader, TileReaderUnsupported, read_patches

Coords = list[tuple[int, int]]

# tiffslide warns about every region that crosses the slide's edge; those are on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:.*out-of-bounds:UserWarning")


def _texture(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Blocky noise with fine grain: JPEG has real work to do, edges are visible."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
    image = np.repeat(np.repeat(blocks, 8, axis=0), 8, axis=1)[:height, :width]
    grain = rng.integers(-24, 25, image.shape)
    return np.clip(image.astype(np.int16) + grain, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def synthetic_slide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1500 x 1100 JPEG-tiled BigTIFF, 256 px tiles, 3 levels (neither side a tile multiple)."""
    path = tmp_path_factory.mktemp("tiles") / "synthetic.tif"
    write_pyramidal_tiff(path, _texture(1100, 1500), mpp=0.25, tile_size=256, levels=3)
    return path


def _reference(path: Path, backend: str, level: int, coords: Coords, size: int) -> np.ndarray:
    with open_slide(path, backend) as slide:  # type: ignore[arg-type]
        return np.stack([slide.read_region(x, y, level, (size, size)) for x, y in coords])


def _assert_same_as_backends(
    path: Path, level: int, coords: Coords, size: int, backends: tuple[str, ...]
) -> np.ndarray:
    with TileReader(path, level) as reader:
        ours = reader.read_patches(coords, size)
    assert ours.shape == (len(coords), size, size, 3)
    assert ours.dtype == np.uint8
    for backend in backends:
        expected = _reference(path, backend, level, coords, size)
        for i, (x, y) in enumerate(coords):
            assert np.array_equal(ours[i], expected[i]), (
                f"{path.name} level {level} patch at {(x, y)} differs from {backend}"
            )
    return ours


BOTH = ("openslide", "tiffslide")

# Level-0 top-lefts: tile-aligned, unaligned, crossing the right/bottom edge, before the
# origin, and wholly outside. At level 1 all are even so both backends sample exactly.
SYNTHETIC_CASES: dict[int, Coords] = {
    0: [
        (0, 0),
        (256, 512),
        (512, 256),
        (100, 38),
        (1300, 1000),
        (1400, 900),
        (-50, -20),
        (1498, 1098),
        (3000, 10),
    ],
    1: [(0, 0), (512, 512), (200, 74), (1006, 430), (1200, 900), (-40, -2), (2998, 0)],
}


@pytest.mark.parametrize("level", [0, 1])
def test_synthetic_slide_matches_both_backends(synthetic_slide: Path, level: int) -> None:
    patches = _assert_same_as_backends(synthetic_slide, level, SYNTHETIC_CASES[level], 256, BOTH)
    assert (patches[-1] == 255).all()  # wholly outside the slide: white


def test_synthetic_slide_patch_sizes_other_than_the_tile(synthetic_slide: Path) -> None:
    coords = [(0, 0), (250, 250), (700, 300), (1400, 1000)]
    _assert_same_as_backends(synthetic_slide, 0, coords, 100, BOTH)
    _assert_same_as_backends(synthetic_slide, 0, coords[:2], 600, BOTH)
    _assert_same_as_backends(synthetic_slide, 2, [(0, 0), (400, 800)], 200, BOTH)


def test_odd_coordinates_at_level_1_match_tiffslide(synthetic_slide: Path) -> None:
    # x0 / downsample is fractional here: tiffslide (like this reader) rounds toward zero,
    # OpenSlide resamples the region at the sub-pixel position, so only tiffslide agrees.
    _assert_same_as_backends(synthetic_slide, 1, [(201, 75), (3, 3), (999, 1)], 256, ("tiffslide",))


def test_level_geometry_matches_slide(synthetic_slide: Path, openslide_fixtures: Path) -> None:
    for path in (
        synthetic_slide,
        openslide_fixtures / "boxes.tiff",
        openslide_fixtures / "small.svs",
    ):
        for backend in BOTH:
            with open_slide(path, backend) as slide, TileReader(path) as reader:  # type: ignore[arg-type]
                assert reader.level_dimensions == slide.level_dimensions
                assert reader.level_downsamples == pytest.approx(slide.level_downsamples)


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_boxes_tiff_matches_both_backends(openslide_fixtures: Path, level: int) -> None:
    # boxes.tiff: deflate-compressed 64 px tiles, downsamples 1, 2, 4.016, 8.086.
    path = openslide_fixtures / "boxes.tiff"
    coords: Coords = [(0, 0), (280, 230), (400, 400)]
    if level <= 1:
        coords += [(64, 64), (10, 18), (250, 200), (-64, 0)]
    _assert_same_as_backends(path, level, coords, 50, BOTH)
    # Unaligned at fractional downsamples: tiffslide only (see above).
    _assert_same_as_backends(path, level, [(64, 64), (13, 21), (150, 100)], 40, ("tiffslide",))


def test_small_svs_matches_both_backends(openslide_fixtures: Path) -> None:
    # Aperio: JPEG tiles with shared JPEGTables and RGB (not YCbCr) components.
    path = openslide_fixtures / "small.svs"
    _assert_same_as_backends(path, 0, [(0, 0), (3, 5), (-4, -4), (10, 10), (20, 0)], 16, BOTH)


def test_lzw_tiles_are_decoded(tmp_path: Path) -> None:
    path = tmp_path / "lzw.tif"
    image = _texture(300, 400, seed=3)
    tifffile.imwrite(
        path, image, photometric="rgb", tile=(128, 128), compression="lzw", predictor=True
    )
    with TileReader(path) as reader:
        assert np.array_equal(reader.read_region(0, 0, (400, 300)), image)
        assert np.array_equal(reader.read_patch(130, 70, 64), image[70:134, 130:194])


def test_aligned_patches_decode_each_tile_once(synthetic_slide: Path) -> None:
    with TileReader(synthetic_slide) as reader:
        reader.read_patches([(0, 0), (256, 0), (512, 256)], 256)
        assert reader.tiles_decoded == 3
        # Overlapping, consecutive unaligned patches reuse cached tiles.
        reader.read_patches([(128, 128), (300, 128), (400, 200)], 256)
        assert reader.tiles_decoded == 3 + 6


def test_read_patches_output(synthetic_slide: Path) -> None:
    coords = np.array([[0, 0], [256, 256], [1400, 1000]], dtype=np.int64)
    ours = read_patches(synthetic_slide, 0, coords, 256)
    for backend in ("tiles", "openslide", "tiffslide"):
        assert np.array_equal(read_patches(synthetic_slide, 0, coords, 256, backend), ours)
    assert read_patches(synthetic_slide, 0, [], 256).shape == (0, 256, 256, 3)


def test_unsupported_files_fall_back_to_read_region(tmp_path: Path) -> None:
    image = _texture(300, 400, seed=4)
    stripped, zstd = tmp_path / "stripped.tif", tmp_path / "zstd.tif"
    tifffile.imwrite(stripped, image, photometric="rgb")
    tifffile.imwrite(zstd, image, photometric="rgb", tile=(128, 128), compression="zstd")
    coords = [(0, 0), (350, 250)]
    for path in (stripped, zstd):
        with pytest.raises(TileReaderUnsupported):
            TileReader(path)
        with pytest.raises(TileReaderUnsupported):
            read_patches(path, 0, coords, 64, backend="tiles")
        patches = read_patches(path, 0, coords, 64)
        with open_slide(path) as slide:
            for patch, (x, y) in zip(patches, coords, strict=True):
                assert np.array_equal(patch, slide.read_region(x, y, 0, (64, 64)))
        assert np.array_equal(patches[0], image[:64, :64])


def test_broken_files_raise_slide_read_error(openslide_fixtures: Path, tmp_path: Path) -> None:
    unreadable = openslide_fixtures / "unreadable.svs"  # tiles with corrupt JPEG data
    with pytest.raises(SlideReadError, match=r"unreadable\.svs"):
        read_patches(unreadable, 0, [(0, 0)], 16)
    with TileReader(unreadable) as reader, pytest.raises(SlideReadError, match="tiles"):
        reader.read_patch(0, 0, 16)
    with pytest.raises(SlideReadError):  # unknown compression: falls back, then fails
        read_patches(openslide_fixtures / "unopenable.tiff", 0, [(0, 0)], 16)
    with pytest.raises(SlideReadError, match="no such file"):
        read_patches(tmp_path / "missing.tif", 0, [(0, 0)], 16)
    not_a_tiff = tmp_path / "text.tif"
    not_a_tiff.write_text("not a slide")
    with pytest.raises(TileReaderUnsupported):
        TileReader(not_a_tiff)
    with pytest.raises(SlideReadError):
        read_patches(not_a_tiff, 0, [(0, 0)], 16)


def test_bad_arguments(synthetic_slide: Path) -> None:
    with pytest.raises(ValueError, match="level"):
        TileReader(synthetic_slide, level=3)
    with pytest.raises(ValueError, match="backend"):
        read_patches(synthetic_slide, 0, [(0, 0)], 16, backend="pillow")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="coords"):
        read_patches(synthetic_slide, 0, [(0, 0, 0)], 16)
    with TileReader(synthetic_slide) as reader, pytest.raises(ValueError, match="size"):
        reader.read_region(0, 0, (0, 16))


def test_raw_tiles_decode_to_the_patch(synthetic_slide: Path) -> None:
    import imagecodecs

    with TileReader(synthetic_slide) as reader:
        assert reader.tile_size == (256, 256)
        assert len(reader.tile_byte_counts) == 6 * 5
        tile = imagecodecs.jpeg8_decode(reader.raw_tile(2, 1), **reader.jpeg_arguments)
        assert np.array_equal(tile, reader.read_patch(512, 256, 256))
        with pytest.raises(IndexError):
            reader.raw_tile(6, 0)


_PAGE = {"photometric": "rgb", "compression": "jpeg", "resolution": (40000, 40000),
         "resolutionunit": "CENTIMETER", "metadata": None}  # fmt: skip


def test_pages_the_slide_backends_do_not_count_as_levels_never_shift_the_tiles_levels(
    tmp_path: Path,
) -> None:
    """The tile reader reads the levels the candidates were computed on, or none: a tiled
    overview page not flagged as reduced (openslide skips it) and a stripped level 0 beside
    tiled reduced ones (the tile reader skips it) made its level N another image, its
    patches wrong (white glass, another picture) without an error. It now leaves such
    files to the backends' ``read_region``."""
    tissue = np.zeros((1024, 1536, 3), np.uint8)
    tissue[...] = (230, 150, 200)
    tissue[:, :768] = (245, 245, 245)  # the left half glass
    overview = tmp_path / "overview.tif"
    with tifffile.TiffWriter(overview) as tiff:
        for step, kind in ((1, 0), (2, 1), (4, 1)):
            tiff.write(tissue[::step, ::step], subfiletype=kind, tile=(256, 256), **_PAGE)
        tiff.write(np.full((400, 600, 3), (20, 20, 200), np.uint8), subfiletype=0,
                   tile=(256, 256), **_PAGE)  # fmt: skip
    stripped = tmp_path / "stripped_level0.tif"
    with tifffile.TiffWriter(stripped) as tiff:
        tiff.write(tissue, subfiletype=0, rowsperstrip=64, **_PAGE)
        for step in (2, 4):
            tiff.write(tissue[::step, ::step], subfiletype=1, tile=(256, 256), **_PAGE)
    for path in (overview, stripped):
        with open_slide(path) as slide:
            levels = slide.level_dimensions
            expected = [slide.read_region(1024, 512, level, (64, 64)) for level in range(3)]
        with pytest.raises(TileReaderUnsupported, match="not the slide's levels"):
            TileReader(path, 0, expected_levels=levels)
        for level in range(3):
            patch = read_patches(path, level, [[1024, 512]], 64)[0]
            assert np.abs(patch.astype(int) - expected[level]).mean() < 3, (path.name, level)
            assert patch[..., 2].mean() > 150, "the tissue's pink, not the overview's blue"


def test_a_file_the_slide_libraries_refuse_is_refused_by_the_patch_read_too(
    tmp_path: Path,
) -> None:
    """A slide whose pixels are not square opens with neither library (its candidates
    could not be computed): ``auto`` refuses its patches with their reasons, where the
    tile reader alone would read them; ``tiles`` asks for the tile reader alone."""
    stretched = tmp_path / "stretched.tif"
    tifffile.imwrite(stretched, np.full((512, 512, 3), 200, np.uint8), photometric="rgb",
                     tile=(256, 256), metadata=None, resolution=(40000, 20000),
                     resolutionunit="CENTIMETER")  # fmt: skip
    with pytest.raises(SlideReadError, match="its pixels are not square") as caught:
        read_patches(stretched, 0, [[0, 0]], 64)
    assert caught.value.path == stretched
    assert read_patches(stretched, 0, [[0, 0]], 64, backend="tiles")[0].mean() == 200
