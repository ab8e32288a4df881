"""Tumour maps of synthetic slides: the cells are preprocessing's, every tissue cell is
predicted from the very patch a store would hold, whatever the batch, and a map is
written and read back verified."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from plumbing.verified import DamagedFileError
from wsi.heatmap import TumourMap, predict_cells, read_map, slide_cells, write_map
from wsi.params import PatchParams
from wsi.patches import candidate_grid
from wsi.tiles import read_patches

PARAMS = PatchParams(patch_size=32, level=2, mask_mpp=8.0)


def _mean_red(patches: np.ndarray) -> np.ndarray:
    """A predictor that depends on every pixel of its patch."""
    return patches[..., 0].mean(axis=(1, 2)) / 255.0


@pytest.fixture(scope="module")
def slide(synthetic_dataset):  # type: ignore[no-untyped-def]
    return next(s for s in synthetic_dataset.slides if s.label == "macro")


def test_the_cells_are_preprocessings_grid_and_each_tissue_cell_its_own_patch(slide) -> None:  # type: ignore[no-untyped-def]
    cells = slide_cells(slide.slide_path, PARAMS)
    extent = 32 * 4  # level 2: downsample 4
    assert cells.extent == extent and cells.cell_um == pytest.approx(extent * 0.25)
    width, height = 3072, 2048
    assert cells.shape == (height // extent, width // extent)
    assert cells.short_side_um == pytest.approx(height * 0.25)  # the section's scale
    np.testing.assert_array_equal(cells.coords, candidate_grid((width, height), extent))
    maps = predict_cells(slide.slide_path, cells, PARAMS, {"red": _mean_red}, batch_size=7)
    red = maps["red"]
    tissue = cells.tissue_fraction >= PARAMS.tissue_fraction_min
    assert 0 < tissue.sum() < tissue.size  # the slide has glass and tissue
    assert np.array_equal(~np.isnan(red), tissue)  # predicted exactly where tissue is
    rows, cols = np.nonzero(tissue)
    for row, col in list(zip(rows, cols, strict=True))[:: max(1, len(rows) // 9)]:
        coords = cells.coords[row * cells.shape[1] + col][None]
        patch = read_patches(slide.slide_path, 2, coords, 32)
        assert red[row, col] == np.float32(_mean_red(patch)[0])


def test_a_map_does_not_depend_on_the_batch_and_every_predictor_gets_its_own(slide) -> None:  # type: ignore[no-untyped-def]
    cells = slide_cells(slide.slide_path, PARAMS)
    one = predict_cells(slide.slide_path, cells, PARAMS, {"red": _mean_red}, batch_size=1)
    both = predict_cells(slide.slide_path, cells, PARAMS,
                         {"red": _mean_red, "dark": lambda p: 1 - _mean_red(p)},
                         batch_size=1000)  # fmt: skip
    np.testing.assert_array_equal(one["red"], both["red"])
    np.testing.assert_allclose(both["dark"], 1 - both["red"], atol=1e-6)
    with pytest.raises(ValueError, match="predictor 'short' gave shape"):
        predict_cells(slide.slide_path, cells, PARAMS, {"short": lambda p: _mean_red(p)[1:]},
                      batch_size=8)  # fmt: skip


def test_a_map_is_written_reproducibly_and_read_back_verified(tmp_path, slide) -> None:  # type: ignore[no-untyped-def]
    cells = slide_cells(slide.slide_path, PARAMS)
    probability = predict_cells(slide.slide_path, cells, PARAMS, {"red": _mean_red},
                                batch_size=64)["red"]  # fmt: skip
    tumour_map = TumourMap(slide.slide_id, probability, cells.tissue_fraction, cells.cell_um,
                           cells.extent, "sha256:" + "ab" * 32)  # fmt: skip
    first, second = tmp_path / "a" / "map.h5", tmp_path / "b" / "map.h5"
    write_map(first, tumour_map)
    write_map(second, tumour_map)
    assert first.read_bytes() == second.read_bytes()  # no timestamps
    back = read_map(first, "rerun the staging")
    np.testing.assert_array_equal(back.probability, probability)
    assert (back.slide_id, back.model, back.extent) == (slide.slide_id, tumour_map.model, 128)
    assert back.predicted == int(np.count_nonzero(~np.isnan(probability)))
    data = bytearray(first.read_bytes())
    data[-64:] = bytes(byte ^ 0xFF for byte in data[-64:])  # zeros could already be zeros
    first.write_bytes(bytes(data))
    with pytest.raises(DamagedFileError, match=r"map\.h5: its bytes are not those written"):
        read_map(first, "rerun the staging")


_PEAK_CHILD = """
import sys
import numpy as np
from wsi.heatmap import predict_cells, slide_cells
from wsi.params import PatchParams

def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

path, batch = sys.argv[1], int(sys.argv[2])
params = PatchParams(patch_size=512, level=0)
seen = []

def none(patches):
    seen.append(len(patches))
    return np.zeros(len(patches))

before = peak()
cells = slide_cells(path, params)
maps = predict_cells(path, cells, params, {"none": none}, batch_size=batch)
print(before, peak(), cells.tissue_fraction.size, int((~np.isnan(maps["none"])).sum()), max(seen))
"""


def test_mapping_a_large_slide_grows_a_worker_by_one_batch_not_by_the_slide(
    tmp_path: Path,
) -> None:
    """On a 134-megapixel slide (the bench's streaming writer) at the paper's geometry (512
    px patches at level 0), the worker that maps it grows by its batch of patches and the
    mask, not by the slide: well under preprocessing's 1 GB per worker."""
    from bench.slidegen import SlideSpec, write_slide

    spec = SlideSpec(width=8192, height=16_384, pieces=3)
    written = write_slide(spec, tmp_path / "slide.tif", tmp_path / "slide.xml")
    batch = 32
    result = subprocess.run(
        [sys.executable, "-c", _PEAK_CHILD, str(written.path), str(batch)],
        capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    before, after, cells, predicted, largest = (int(v) for v in result.stdout.split())
    assert cells == (8192 // 512) * (16_384 // 512) and predicted > batch  # several batches
    assert largest == batch
    batch_bytes = batch * 512 * 512 * 3
    mask_pixels = spec.width * spec.height * (spec.mpp / 8.0) ** 2
    # a batch of decoded patches (and the reader's copy), the mask, and a constant (a band
    # of the thumbnail in float32, the tile cache): a 100,000 x 200,000 px slide adds only
    # mask pixels (19 M bytes at 8 µm/px) to this
    assert after - before < 3 * batch_bytes + 8 * mask_pixels + 160e6 < 0.3e9
