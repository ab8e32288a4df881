"""The synthetic Camelyon-17 generator, checked on real files it writes.

Most tests use the session fixture ``synthetic_dataset`` (tests/conftest.py: 2 centres x
2 patients x 5 nodes); the others write their own tiny datasets.
"""

from __future__ import annotations

import csv
import re
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

import numpy as np
import openslide
import pytest
import tifffile
import tiffslide
from skimage.color import rgb2hed
from skimage.draw import polygon as fill_polygon
from skimage.measure import points_in_poly

from wsi import synth
from wsi.annotations import read_asap
from wsi.catalogue import scan_camelyon
from wsi.slide import open_slide
from wsi.synth import SynthConfig, SynthManifest, SynthSlide, generate_dataset
from wsi.synth import cli as synth_cli
from wsi.synth import dataset as synth_dataset
from wsi.synth import plan as synth_plan

TINY = SynthConfig(
    centers=(1,), patients_per_center=1, seed=3, width=1024, height=768, tile_size=256
)


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def _one_per_label(manifest: SynthManifest) -> list[SynthSlide]:
    chosen: dict[str, SynthSlide] = {}
    for slide in manifest.slides:
        chosen.setdefault(slide.label, slide)
    return list(chosen.values())


def _mask(polygons: tuple[np.ndarray, ...], x: int, y: int, shape: tuple[int, int]) -> np.ndarray:
    """Level-0 mask of the union of polygons over the block at (x, y), pixel centres."""
    mask = np.zeros(shape, dtype=bool)
    for polygon in polygons:
        rr, cc = fill_polygon(polygon[:, 1] - y - 0.5, polygon[:, 0] - x - 0.5, shape)
        mask[rr, cc] = True
    return mask


def _hematoxylin(rgb: np.ndarray) -> np.ndarray:
    return rgb2hed(rgb)[..., 0]


# --- slides ----------------------------------------------------------------------------


def test_slides_read_the_same_in_openslide_and_tiffslide(
    synthetic_dataset: SynthManifest,
) -> None:
    config = synthetic_dataset.config
    for slide in _one_per_label(synthetic_dataset):
        with (
            openslide.OpenSlide(str(slide.slide_path)) as os_slide,
            tiffslide.TiffSlide(slide.slide_path) as ts_slide,
        ):
            assert os_slide.properties["openslide.vendor"] == "generic-tiff"
            dims = synth.level_dimensions(config.width, config.height, config.level_count)
            assert os_slide.level_count == ts_slide.level_count == config.level_count >= 3
            assert os_slide.level_dimensions == ts_slide.level_dimensions == tuple(dims)
            assert max(dims[-1]) <= 512
            assert float(os_slide.properties["openslide.mpp-x"]) == pytest.approx(0.25)
            assert float(os_slide.properties["openslide.mpp-y"]) == pytest.approx(0.25)
            assert float(ts_slide.properties["tiffslide.mpp-x"]) == pytest.approx(0.25)
            tile = os_slide.properties["openslide.level[0].tile-width"]
            assert tile == str(config.tile_size)
            last = config.level_count - 1
            regions = [(0, 256, 512, (512, 512)), (1, 300, 200, (300, 400)), (last, 0, 0, dims[-1])]
            for level, x, y, size in regions:
                a = np.asarray(os_slide.read_region((x, y), level, size))
                b = np.asarray(ts_slide.read_region((x, y), level, size))
                assert a.shape[:2] == b.shape[:2] == size[::-1]
                assert (a[..., 3] == 255).all()
                difference = np.abs(a[..., :3].astype(int) - b[..., :3].astype(int))
                assert difference.max() <= 2, (slide.slide_id, level)


def test_slides_through_wsi_slide_backends(synthetic_dataset: SynthManifest) -> None:
    slide = synthetic_dataset.slides[0]
    with (
        open_slide(slide.slide_path, backend="openslide") as a,
        open_slide(slide.slide_path, backend="tiffslide") as b,
    ):
        assert a.level_count == b.level_count
        assert a.level_dimensions == b.level_dimensions
        assert a.level_downsamples == pytest.approx(b.level_downsamples)
        assert a.mpp == pytest.approx(0.25) and b.mpp == pytest.approx(0.25)
        region_a = a.read_region(512, 256, 0, (512, 512))
        region_b = b.read_region(512, 256, 0, (512, 512))
        assert np.abs(region_a.astype(int) - region_b.astype(int)).max() <= 2


def test_tiff_structure(synthetic_dataset: SynthManifest) -> None:
    tile = synthetic_dataset.config.tile_size
    with tifffile.TiffFile(synthetic_dataset.slides[0].slide_path) as tif:
        assert tif.is_bigtiff
        assert len(tif.pages) == synthetic_dataset.config.level_count
        for level, page in enumerate(tif.pages):
            assert page.is_tiled and (page.tilewidth, page.tilelength) == (tile, tile)
            assert page.compression == tifffile.COMPRESSION.JPEG
            assert page.subfiletype == (1 if level else 0)
            assert page.tags["ResolutionUnit"].value == tifffile.RESUNIT.CENTIMETER
            x_resolution = page.tags["XResolution"].value
            assert x_resolution[0] / x_resolution[1] == pytest.approx(1e4 / (0.25 * 2**level))
            assert "DateTime" not in page.tags and "SubIFDs" not in page.tags
        assert not tif.pages[0].description.startswith("Aperio")


def test_write_pyramidal_tiff_from_array_and_bands(tmp_path: Path) -> None:
    height, width = 700, 1000  # not multiples of the tile size, nor of 2 at every level
    y, x = np.mgrid[0:height, 0:width]
    image = np.stack([x * 255 // width, y * 255 // height, (x + y) % 256], -1).astype(np.uint8)
    from_array = tmp_path / "array.tif"
    assert synth.auto_level_count(width, height) == 2  # down to a longer side <= 512
    dims = synth.write_pyramidal_tiff(from_array, image, mpp=0.5, tile_size=128, levels=3)
    assert dims == [(1000, 700), (500, 350), (250, 175)]
    bands = (image[r : r + 128] for r in range(0, height, 128))
    from_bands = tmp_path / "bands.tif"
    synth.write_pyramidal_tiff(
        from_bands, bands, shape=(height, width), mpp=0.5, tile_size=128, levels=3
    )
    assert from_array.read_bytes() == from_bands.read_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith((".partial", ".tmp"))] == []
    with tiffslide.TiffSlide(from_array) as slide:
        assert slide.level_dimensions == tuple(dims)
        assert float(slide.properties["tiffslide.mpp-x"]) == pytest.approx(0.5)
        level0 = np.asarray(slide.read_region((0, 0), 0, (width, height)))
        level1 = np.asarray(slide.read_region((0, 0), 1, (500, 350)))
    assert np.abs(level0.astype(int) - image).mean() < 3
    halved = image[:700, :1000].reshape(350, 2, 500, 2, 3).mean((1, 3))
    assert np.abs(level1.astype(float) - halved).mean() < 3
    with openslide.OpenSlide(str(from_array)) as slide:
        assert float(slide.properties["openslide.mpp-x"]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="shape"):
        synth.write_pyramidal_tiff(tmp_path / "x.tif", iter([image]), mpp=0.5)
    with pytest.raises(ValueError, match="multiple of 16"):
        synth.write_pyramidal_tiff(tmp_path / "x.tif", image, mpp=0.5, tile_size=100)


# --- layout and labels -----------------------------------------------------------------


def test_layout_and_stage_labels_match_the_files(synthetic_dataset: SynthManifest) -> None:
    root = synthetic_dataset.root
    with (root / "stage_labels.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["patient", "stage"]
    patients: dict[str, str] = {}
    nodes: dict[str, str] = {}
    order = []
    for name, value in rows[1:]:
        order.append(name)
        if name.endswith(".zip"):
            patients[name.removesuffix(".zip")] = value
        else:
            nodes[name.removesuffix(".tif")] = value
    assert sorted(patients) == ["patient_000", "patient_001", "patient_020", "patient_021"]
    for index, patient in enumerate(sorted(patients)):  # a patient row, then its five nodes
        block = order[index * 6 : index * 6 + 6]
        assert block == [f"{patient}.zip"] + [f"{patient}_node_{n}.tif" for n in range(5)]

    on_disk = {p.stem: p for p in root.rglob("*.tif")}
    assert set(on_disk) == set(nodes)
    for stem, path in on_disk.items():
        patient = int(stem[8:11])
        center = patient // 20
        assert path == root / f"center_{center}" / f"patient_{patient:03d}" / f"{stem}.tif"
    assert not list(root.rglob("*.partial")) and not list(root.rglob("*.tmp"))

    for patient, stage in patients.items():
        labels = [nodes[f"{patient}_node_{n}"] for n in range(5)]
        positive = sum(label in ("micro", "macro") for label in labels)
        if "macro" in labels:
            expected = "pN1" if positive <= 3 else "pN2"
        elif "micro" in labels:
            expected = "pN1mi"
        elif "itc" in labels:
            expected = "pN0(i+)"
        else:
            expected = "pN0"
        assert stage == expected, patient
        # two patients a centre: both its tumour slots (a macro and a negative node each)
        assert "negative" in labels and "macro" in labels

    manifest_labels = {s.slide_id: s.label for s in synthetic_dataset.slides}
    assert manifest_labels == nodes


def test_catalogue_scans_the_dataset_cleanly(synthetic_dataset: SynthManifest) -> None:
    catalogue = scan_camelyon(synthetic_dataset.root)
    assert catalogue.problems == []
    assert len(catalogue.slides) == 20
    expected = synthetic_dataset.by_id()
    for record in catalogue.slides:
        slide = expected[record.slide_id]
        assert record.center == slide.center
        assert record.node_label == slide.label
        assert record.annotation == slide.annotation_path
        assert record.patient_stage == synthetic_dataset.stages[slide.patient]


def test_every_center_has_negative_and_annotated_tumour_slides(
    synthetic_dataset: SynthManifest,
) -> None:
    for center in synthetic_dataset.config.centers:
        labels = Counter(s.label for s in synthetic_dataset.for_center(center))
        # its tumour slots (wsi.synth.rules): a macro-metastasis and a negative node each
        assert labels["negative"] >= 2 and labels["macro"] >= 2


def test_node_label_thresholds_scale_with_the_slide() -> None:
    default = SynthConfig()
    assert default.label_scale == pytest.approx(4096 * 0.25 / 8000)
    assert default.itc_max_um == pytest.approx(25.6)
    assert default.macro_min_um == pytest.approx(256.0)
    real_size = SynthConfig(width=100_000, height=80_000)
    assert (real_size.itc_max_um, real_size.macro_min_um) == (200.0, 2000.0)


def test_labels_follow_the_largest_annotated_lesion(synthetic_dataset: SynthManifest) -> None:
    config = synthetic_dataset.config
    for slide in synthetic_dataset.slides:
        if slide.annotation_path is None:
            assert slide.label == "negative"
            continue
        tumour = read_asap(slide.annotation_path).tumor
        extent_um = max(synth.max_feret_diameter(r.vertices) for r in tumour) * config.mpp
        assert synth.node_label(extent_um, config.thresholds) == slide.label
        assert extent_um == pytest.approx(slide.largest_extent_um, abs=1e-3)


def test_config_rejects_impossible_values() -> None:
    with pytest.raises(ValueError, match="patients_per_center"):
        SynthConfig(patients_per_center=21)
    with pytest.raises(ValueError, match="tile_size"):
        SynthConfig(tile_size=200)
    with pytest.raises(ValueError, match="pN2 needs 4 or more"):
        SynthConfig(nodes_per_patient=3)
    with pytest.raises(ValueError, match="stage_weights"):
        SynthConfig(stage_weights=(0, 0, 0, 0, 0))
    with pytest.raises(ValueError, match="tumour_patients_per_center needs"):
        SynthConfig(stage_weights=(1, 1, 1, 0, 0))
    SynthConfig(stage_weights=(1, 1, 1, 0, 0), tumour_patients_per_center=0)


# --- annotations -----------------------------------------------------------------------


def test_annotations_exist_exactly_for_lesion_slides(synthetic_dataset: SynthManifest) -> None:
    root = synthetic_dataset.root
    width, height = synthetic_dataset.config.width, synthetic_dataset.config.height
    xml_files = {p.stem for p in (root / "lesion_annotations").glob("*.xml")}
    lesion_slides = {s.slide_id for s in synthetic_dataset.slides if s.label != "negative"}
    assert xml_files == lesion_slides
    for slide in synthetic_dataset.slides:
        if slide.annotation_path is None:
            continue
        tree = ElementTree.parse(slide.annotation_path)
        annotations = tree.getroot().findall("./Annotations/Annotation")
        groups = [a.get("PartOfGroup") for a in annotations]
        assert set(groups) <= {"metastases", "normal"} and "metastases" in groups
        assert all(a.get("Type") == "Polygon" for a in annotations)
        read = read_asap(slide.annotation_path)
        assert len(read.tumor) == len(slide.metastases)
        assert len(read.carve_outs) == len(slide.carve_outs)
        for region, polygon in zip(read.tumor, slide.metastases, strict=True):
            assert 12 <= len(region.vertices) <= 40
            np.testing.assert_allclose(region.vertices, polygon, atol=1e-3)
            x_min, y_min, x_max, y_max = region.bounds
            assert 0 <= x_min < x_max < width
            assert 0 <= y_min < y_max < height
        for region, polygon in zip(read.carve_outs, slide.carve_outs, strict=True):
            np.testing.assert_allclose(region.vertices, polygon, atol=1e-3)


def test_asap_xml_is_written_like_the_camelyon_files(
    tmp_path: Path, camelyon_annotation: Path
) -> None:
    square = np.array([[12711.3, 88778.1], [12612.8, 88895.5], [13357.0, 87081.1]])
    path = tmp_path / "a.xml"
    synth.write_asap_xml(path, {"metastases": [square, square + 10], "normal": [square + 1]})
    text = path.read_text()
    real = camelyon_annotation.read_text()
    assert text.splitlines()[:3] == real.splitlines()[:3]
    assert '\t\t\t\t<Coordinate Order="0" X="12711.2998" Y="88778.1016" />' in text
    assert '<Coordinate Order="2" X="13357" Y="87081.1016" />' in text
    assert text.endswith("</ASAP_Annotations>\n")

    def structure(root: ElementTree.Element) -> set[tuple[str, tuple[str, ...]]]:
        return {(e.tag, tuple(sorted(e.attrib))) for e in root.iter()}

    ours, theirs = ElementTree.fromstring(text), ElementTree.fromstring(real)
    assert structure(ours) == structure(theirs)
    groups = [g.get("Name") for g in ours.findall("./AnnotationGroups/Group")]
    assert groups == ["metastases", "normal"]
    read = read_asap(path)
    assert [r.group for r in read.regions] == ["metastases", "metastases", "normal"]
    np.testing.assert_allclose(read.regions[0].vertices, square, atol=1e-3)


# --- pixels ----------------------------------------------------------------------------


def test_background_is_white_and_tissue_covers_part_of_the_slide(
    synthetic_dataset: SynthManifest,
) -> None:
    for slide in synthetic_dataset.slides[:5]:
        with tiffslide.TiffSlide(slide.slide_path) as handle:
            level = handle.level_count - 1
            rgb = np.asarray(handle.read_region((0, 0), level, handle.level_dimensions[level]))
        rgb = rgb.astype(int)
        saturation = rgb.max(-1) - rgb.min(-1)
        glass = saturation < 20
        assert 0.3 <= glass.mean() <= 0.75, slide.slide_id
        assert 230 <= rgb[glass].mean() <= 248
        assert np.abs(np.median(rgb[glass], axis=0) - 240).max() <= 6
        assert 0.25 <= slide.tissue_fraction <= 0.7


def test_lesions_look_different_from_healthy_tissue(synthetic_dataset: SynthManifest) -> None:
    width, height = synthetic_dataset.config.width, synthetic_dataset.config.height
    macro = [s for s in synthetic_dataset.slides if s.label == "macro"]
    assert macro
    for slide in macro[:3]:
        lesion = slide.metastases[0]
        x0, y0 = np.floor(lesion.min(axis=0)).astype(int)
        x1, y1 = np.ceil(lesion.max(axis=0)).astype(int)
        margin = 128
        x0, y0 = max(x0 - margin, 0), max(y0 - margin, 0)
        x1, y1 = min(x1 + margin, width), min(y1 + margin, height)
        with open_slide(slide.slide_path, backend="tiffslide") as handle:
            rgb = handle.read_region(x0, y0, 0, (x1 - x0, y1 - y0))
        tumour = _mask(slide.metastases, x0, y0, rgb.shape[:2])
        tumour &= ~_mask(slide.carve_outs, x0, y0, rgb.shape[:2])
        saturation = rgb.max(-1).astype(int) - rgb.min(-1)
        healthy = ~_mask(slide.metastases, x0, y0, rgb.shape[:2]) & (saturation > 30)
        assert tumour.sum() > 1000 and healthy.sum() > 1000
        hematoxylin = _hematoxylin(rgb)
        assert hematoxylin[tumour].mean() > 1.5 * hematoxylin[healthy].mean()  # purple
        assert rgb[tumour].mean() < rgb[healthy].mean() - 10  # darker


def test_tumour_nuclei_are_larger_and_paler_at_every_center() -> None:
    # Lymph-node-like: small dark lymphocytes in healthy tissue, large pale tumour nuclei;
    # the centre's nucleus scale moves both alike, so their ratio holds at every centre.
    config = SynthConfig(centers=(0, 1, 2, 3), width=2048, height=1536, tile_size=256)
    for center in config.centers:
        plan = synth.plan_slide(config, 20 * center, 0, "macro")
        nuclei = plan.nuclei
        inside = synth_plan._in_tumour(np.stack([nuclei.x, nuclei.y], axis=1), plan.lesions)
        assert inside.sum() > 50 and (~inside).sum() > 50
        assert np.median(nuclei.radius_a[inside]) > 1.8 * np.median(nuclei.radius_a[~inside])
        assert np.median(nuclei.load[inside]) < np.median(nuclei.load[~inside])


def test_carve_outs_lie_inside_lesions_and_look_healthy(tmp_path: Path) -> None:
    # Find a macro slide with a carve-out by planning (cheap), then write only that one.
    config = SynthConfig(centers=(0,), seed=11, width=2048, height=1536, tile_size=256)
    plan = next(
        plan
        for node in range(40)
        if (plan := synth.plan_slide(config, 0, node, "macro")).carve_outs
    )
    slide = synth.generate_slide(synth_dataset._SlideTask(tmp_path, config, 0, plan.node, "macro"))
    assert slide.annotation_path is not None and slide.carve_outs
    lesion = next(lesion for lesion in plan.lesions if lesion.carve_outs)
    carve = lesion.carve_outs[0]
    assert points_in_poly(carve, lesion.polygon).all()
    x0, y0 = np.floor(lesion.polygon.min(axis=0)).astype(int)
    x1, y1 = np.ceil(lesion.polygon.max(axis=0)).astype(int)
    with open_slide(slide.slide_path, backend="openslide") as handle:
        rgb = handle.read_region(x0, y0, 0, (x1 - x0, y1 - y0))
    inner = _mask((carve,), x0, y0, rgb.shape[:2])
    tumour = _mask((lesion.polygon,), x0, y0, rgb.shape[:2]) & ~inner
    hematoxylin = _hematoxylin(rgb)
    assert inner.sum() > 200
    assert hematoxylin[inner].mean() < hematoxylin[tumour].mean() / 1.5
    assert rgb[inner].mean() > rgb[tumour].mean() + 10
    groups = read_asap(slide.annotation_path).groups
    assert len(groups["normal"]) == len(slide.carve_outs)


def test_centers_differ_in_stain(synthetic_dataset: SynthManifest) -> None:
    means = {}
    for center in (0, 1):
        pixels = []
        for slide in synthetic_dataset.for_center(center):
            if slide.label != "negative":
                continue
            with tiffslide.TiffSlide(slide.slide_path) as handle:
                rgb = np.asarray(handle.read_region((0, 0), 2, handle.level_dimensions[2]))
            saturation = rgb.max(-1).astype(int) - rgb.min(-1)
            pixels.append(rgb[saturation > 30].astype(float))
        means[center] = np.concatenate(pixels).mean(axis=0)
    assert np.abs(means[0] - means[1]).max() > 10, means
    assert synth.center_stain(0) != synth.center_stain(1)
    assert synth.center_stain(7) == synth.center_stain(7)  # derived, deterministic
    looks = [synth.center_look(c) for c in range(5)]
    for field in ("focus_blur_um", "noise", "nucleus_scale", "tumour_contrast"):
        assert len({getattr(look, field) for look in looks}) >= 4, field
    assert synth.center_look(7) == synth.center_look(7) != synth.center_look(8)


# --- determinism, layouts, CLI ---------------------------------------------------------


def test_same_seed_gives_identical_bytes_whatever_the_workers(tmp_path: Path) -> None:
    first = generate_dataset(tmp_path / "a", TINY)
    generate_dataset(tmp_path / "b", TINY, workers=2)
    a, b = _files(first.root), _files(tmp_path / "b")
    assert len([name for name in a if name.endswith(".tif")]) == 5
    assert a.keys() == b.keys()
    assert all(a[name] == b[name] for name in a)

    other = generate_dataset(tmp_path / "c", TINY.model_copy(update={"seed": 4}))
    c = _files(other.root)
    tifs = [name for name in a if name.endswith(".tif")]
    assert all(a[name] != c[name] for name in tifs)


def test_flat_layout(tmp_path: Path) -> None:
    config = TINY.model_copy(update={"layout": "flat"})
    manifest = generate_dataset(tmp_path, config)
    for slide in manifest.slides:
        assert slide.slide_path == tmp_path / "center_1" / f"{slide.slide_id}.tif"
        assert slide.slide_path.is_file()
    catalogue = scan_camelyon(tmp_path)
    assert catalogue.problems == []
    assert {r.slide_id for r in catalogue.slides} == {s.slide_id for s in manifest.slides}
    assert {r.center for r in catalogue.slides} == {1}


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    arguments = ["--out", str(out), "--centers", "2", "--patients-per-center", "1"]
    arguments += ["--width", "1024", "--height", "768", "--tile-size", "256", "--seed", "3"]
    assert synth.main([*arguments, "--no-progress", "--workers", "1"]) == 0
    names = sorted(p.name for p in (out / "center_2" / "patient_040").iterdir())
    assert names == [f"patient_040_node_{n}.tif" for n in range(5)]
    assert (out / "stage_labels.csv").read_text().startswith("patient,stage\npatient_040.zip,")
    assert synth.main(["--out", str(out), "--patients-per-center", "25"]) == 2
    assert "patients_per_center" in capsys.readouterr().err
    assert synth.main(["--out", str(out), "--layout", "zigzag"]) == 2
    assert "layout" in capsys.readouterr().err
    assert re.search(r"itc|micro|macro", synth_cli._parser()[0].format_help())


def _skimage_mask(rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    mask = np.zeros(shape, dtype=bool)
    rr, cc = fill_polygon(rows, cols, shape)
    mask[rr, cc] = True
    return mask


def test_lesion_fill_is_skimage_polygon_pixel_for_pixel() -> None:
    """wsi.synth.render's row-crossing fill draws exactly skimage.draw.polygon's pixels,
    which drew the slides before it: random polygons, half of them spilling over the
    block, some with vertices on pixel centres and edges along rows."""
    from wsi.synth.render import _fill_polygon

    rng = np.random.default_rng(11)
    shape = (40, 56)
    for case in range(600):
        n = int(rng.integers(3, 12))
        rows = rng.uniform(-15, shape[0] + 15, n)
        cols = rng.uniform(-15, shape[1] + 15, n)
        if case % 3 == 0:  # vertices on pixel centres: the tolerance and horizontal edges
            rows, cols = np.round(rows), np.round(cols)
            rows[1] = rows[0]
        drawn = np.zeros(shape, dtype=bool)
        filled = _fill_polygon(rows, cols, shape)
        if filled is not None:
            drawn[filled[0]] = filled[1]
        np.testing.assert_array_equal(drawn, _skimage_mask(rows, cols, shape), err_msg=str(case))
    assert _fill_polygon(np.array([-5.0, -3, -4]), np.array([1.0, 2, 3]), shape) is None


def test_halve_is_the_rounded_mean_of_each_2x2_block() -> None:
    from wsi.synth.tiff import halve

    image = np.random.default_rng(2).integers(0, 256, (37, 51, 3), dtype=np.uint8)
    blocks = image[:36, :50].astype(np.int64).reshape(18, 2, 25, 2, 3).sum(axis=(1, 3))
    np.testing.assert_array_equal(halve(image), ((blocks + 2) // 4).astype(np.uint8))
    image[:2, :2] = 255  # the largest sum, 1020 + 2, fits the uint16 accumulator
    assert halve(image)[0, 0].tolist() == [255, 255, 255]


def test_nuclei_stamped_together_are_those_stamped_one_by_one() -> None:
    """The vectorised stamping gives each block the load of the per-nucleus loop it
    replaced (kept as the before of ``bench synth``), to the bit, blocks on the slide's
    edges included."""
    from bench.bench_synth import reference_stamp_nuclei
    from wsi.synth.render import _stamp_nuclei

    plan = synth.plan_slide(TINY, 0, 0, "macro")
    every = np.arange(len(plan.nuclei.x))
    assert len(every) > 100
    for block in [(0, 200, 0, 300), (300, 768, 500, 1024), (100, 101, 40, 90)]:
        stamped = _stamp_nuclei(plan, every, *block)
        assert stamped.tobytes() == reference_stamp_nuclei(plan, every, *block).tobytes(), block
