"""A slide whose level-0 pixels cannot be decoded, though its masks can, is dropped from
its centre's store with a "pixels" failure, and the store is built from the others."""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import replace
from pathlib import Path

import tifffile

from wsi.cache import CandidateCache
from wsi.catalogue import scan_camelyon
from wsi.center import SamplingParams
from wsi.patches import PatchParams
from wsi.preprocess import center_store, centre_scale, data_root_of, slide_patches
from wsi.slide import is_synthetic_slide
from wsi.store.reader import read_store_info
from wsi.store.schema import store_path
from wsi.summary import read_center_report, report_path
from wsi.synth import SynthManifest


def _corrupt_level0_tiles(path: Path) -> None:
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        spans = list(zip(page.dataoffsets, page.databytecounts, strict=True))
    with path.open("r+b") as handle:
        for offset, count in spans:
            handle.seek(offset)
            handle.write(b"\x00" * min(count, 64))  # no JPEG start-of-image in any tile


def test_unreadable_pixels_drop_the_slide(synthetic_dataset: SynthManifest, tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(synthetic_dataset.root, root)
    params = PatchParams(patch_size=128)
    records = scan_camelyon(root).for_centers([0])
    patches = [
        slide_patches(r, params, CandidateCache(tmp_path / "cache"))
        for r in records
        if r.node_label in ("negative", "macro")
    ]
    victim = next(p for p in patches if (p.labels == 0).any())
    _corrupt_level0_tiles(victim.path)

    report = center_store(0, patches, params, SamplingParams(patches_per_class=6), tmp_path / "out")

    assert [(f.slide, f.stage) for f in report.failures] == [(victim.slide_id, "pixels")]
    assert str(victim.path) in report.failures[0].error
    info = read_store_info(store_path(tmp_path / "out", 0))
    stored = info.splits["train"].slides + info.splits["test"].slides
    assert victim.slide_id not in stored and len(stored) == 12


def _by_slide(info) -> tuple[dict[str, set[tuple[int, int]]], dict[str, set[str]]]:
    patches: dict[str, set[tuple[int, int]]] = {}
    patients: dict[str, set[str]] = {}
    for split in ("train", "test"):
        meta = info.splits[split]
        patients[split] = set(meta.patients)
        for slide_id, (x, y) in zip(meta.slides, meta.coords, strict=True):
            patches.setdefault(slide_id, set()).add((int(x), int(y)))
    return patches, patients


def test_a_slide_failing_moves_no_patient_and_no_other_slides_patch(
    synthetic_dataset: SynthManifest, tmp_path: Path
) -> None:
    root = tmp_path / "data"
    shutil.copytree(synthetic_dataset.root, root)
    params, sampling = PatchParams(patch_size=128), SamplingParams(patches_per_class=8)
    records = [r for r in scan_camelyon(root).for_centers([0]) if r.node_label]
    patches = [slide_patches(r, params, CandidateCache(tmp_path / "cache")) for r in records]
    whole = center_store(0, patches, params, sampling, tmp_path / "whole", records=records)
    before, split_before = _by_slide(read_store_info(store_path(tmp_path / "whole", 0)))
    victim = next(p for p in patches if p.slide_id in before and (p.labels == 0).any())
    _corrupt_level0_tiles(victim.path)

    report = center_store(0, patches, params, sampling, tmp_path / "out", records=records)

    assert [f.slide for f in report.failures] == [victim.slide_id]
    after, split_after = _by_slide(read_store_info(store_path(tmp_path / "out", 0)))
    assert report.patients == whole.patients and split_after == split_before
    assert victim.slide_id not in after
    for slide_id, kept in before.items():
        if slide_id != victim.slide_id:
            assert kept <= after[slide_id], f"{slide_id} lost patches it gave before"
    assert sum(map(len, after.values())) == sum(map(len, before.values())) == 16
    # the victim's split refilled from its own slides; the other split is as it was
    victim_split = "test" if victim.patient in split_before["test"] else "train"
    other = {"train": "test", "test": "train"}[victim_split]
    assert report.counts == whole.counts  # per split and label
    patients_of = {s: split_before[s] for s in ("train", "test")}
    for slide_id, kept in after.items():
        patient = next(p.patient for p in patches if p.slide_id == slide_id)
        if patient in patients_of[other]:
            assert kept == before[slide_id], f"{slide_id} ({other}) changed"


def test_a_failing_slide_never_moves_patches_between_splits(
    synthetic_dataset: SynthManifest, tmp_path: Path
) -> None:
    """Whichever split the failing slide is in, every label of the other split keeps
    exactly its patches, and its own split refills only from its own patients."""
    root = tmp_path / "data"
    shutil.copytree(synthetic_dataset.root, root)
    params, sampling = PatchParams(patch_size=128), SamplingParams(patches_per_class=8)
    records = [r for r in scan_camelyon(root).for_centers([0]) if r.node_label]
    patches = [slide_patches(r, params, CandidateCache(tmp_path / "cache")) for r in records]
    center_store(0, patches, params, sampling, tmp_path / "whole", records=records)
    whole = read_store_info(store_path(tmp_path / "whole", 0))
    test_patients = set(whole.splits["test"].patients)
    for split in ("train", "test"):
        victim = next(p for p in patches if p.slide_id in whole.splits[split].slides
                      and (p.patient in test_patients) == (split == "test"))  # fmt: skip
        copy = tmp_path / f"data-{split}"
        shutil.copytree(root, copy)
        bad = copy / victim.path.relative_to(root)
        _corrupt_level0_tiles(bad)
        moved = [replace(p, path=copy / p.path.relative_to(root)) for p in patches]
        out = tmp_path / f"out-{split}"
        center_store(0, moved, params, sampling, out, records=records)
        after = read_store_info(store_path(out, 0))
        other = "test" if split == "train" else "train"
        assert _patches(after, other) == _patches(whole, other), f"{split} victim moved {other}"
        assert set(after.splits["test"].patients) <= test_patients  # no patient moved
        assert not set(after.splits["train"].patients) & test_patients
        assert victim.slide_id not in after.splits[split].slides
        assert len(after.splits[split].labels) <= len(whole.splits[split].labels)


def _patches(info, split: str) -> set[tuple[str, int, int]]:
    meta = info.splits[split]
    return {(s, int(x), int(y)) for s, (x, y) in zip(meta.slides, meta.coords, strict=True)}


def test_the_same_slides_give_the_same_store_in_any_copy(
    synthetic_dataset: SynthManifest, tmp_path: Path
) -> None:
    """The demo's slides copied to two places with different times give byte-identical
    stores (dvc.lock's md5 is the same on every machine); a changed slide does not."""
    params, sampling = PatchParams(patch_size=128), SamplingParams(patches_per_class=4)
    digests = []
    for copy, when in (("a", 1_600_000_000), ("b", 1_700_000_000), ("c", 1_700_000_000)):
        root = tmp_path / copy / "data"
        shutil.copytree(synthetic_dataset.root, root)
        records = scan_camelyon(root).for_centers([0])
        for record in records:
            os.utime(record.path, (when, when))
        if copy == "c":  # one slide's bytes changed, its size and time kept
            changed = records[0].path
            with open(changed, "r+b") as handle:
                handle.seek(-1, os.SEEK_END)
                last = handle.read(1)
                handle.seek(-1, os.SEEK_END)
                handle.write(bytes([last[0] ^ 0xFF]))
            os.utime(changed, (when, when))
        patches = [slide_patches(r, params, CandidateCache(tmp_path / copy / "cache"))
                   for r in records if r.node_label in ("negative", "macro")]  # fmt: skip
        center_store(0, patches, params, sampling, tmp_path / copy / "out")
        digests.append(hashlib.md5(store_path(tmp_path / copy / "out", 0).read_bytes()).digest())
    assert digests[0] == digests[1]
    assert digests[2] != digests[0]


def test_the_centre_report_says_where_the_slides_are_and_that_they_are_synthetic(
    synthetic_dataset: SynthManifest, openslide_fixtures: Path, tmp_path: Path
) -> None:
    """The report reads these to say what its numbers are of: wsi.synth's slides carry
    its marker in their ImageDescription, a scanner's slides do not."""
    params = PatchParams(patch_size=128)
    records = scan_camelyon(synthetic_dataset.root).for_centers([1])
    patches = [slide_patches(r, params, CandidateCache(tmp_path / "cache"))
               for r in records if r.node_label in ("negative", "macro")]  # fmt: skip
    report = center_store(1, patches, params, SamplingParams(patches_per_class=4), tmp_path)
    assert report.synthetic is True
    assert report.data_root == synthetic_dataset.root.as_posix()
    assert read_center_report(report_path(tmp_path, 1)) == report
    assert all(is_synthetic_slide(r.path) for r in records)
    assert not is_synthetic_slide(openslide_fixtures / "small.svs")  # Aperio's
    assert not is_synthetic_slide(openslide_fixtures / "boxes.tiff")
    assert not is_synthetic_slide(openslide_fixtures / "boxes.png")  # not a TIFF
    assert data_root_of("data/camelyon17/center_3/patient_060/p.tif", 3) == "data/camelyon17"
    assert data_root_of("elsewhere/p.tif", 3) is None


def _rescan(path: Path, factor: int) -> None:
    """Make ``path`` say it was scanned at ``factor`` times the µm/px it was (every page's
    resolution tags, in place)."""
    with tifffile.TiffFile(path, mode="r+b") as tif:
        for page in tif.pages:
            for name in ("XResolution", "YResolution"):
                numerator, denominator = page.tags[name].value
                page.tags[name].overwrite((numerator, denominator * factor))


def test_a_slide_of_another_scale_is_left_out_of_its_centres_store(
    synthetic_dataset: SynthManifest, tmp_path: Path
) -> None:
    """A store says one µm/px: a slide scanned at twice its centre's (0.5 against 0.25 at
    level 0) would give patches of four times the tissue; it is dropped, named, and the
    store is built from the others at their scale."""
    root = tmp_path / "data"
    shutil.copytree(synthetic_dataset.root, root)
    params = PatchParams(patch_size=128)
    records = [
        r for r in scan_camelyon(root).for_centers([0]) if r.node_label in ("negative", "macro")
    ]
    victim, gone = records[-1], records[0]
    _rescan(victim.path, 2)
    patches = [slide_patches(r, params, CandidateCache(tmp_path / "cache")) for r in records]
    gone.path.unlink()  # removed once its candidates were known: left out, named, as well

    report = center_store(0, patches, params, SamplingParams(patches_per_class=6), tmp_path / "out")

    assert [(f.slide, f.stage) for f in report.failures] == [
        (gone.slide_id, "open"), (victim.slide_id, "resolution")]  # fmt: skip
    assert str(gone.path) in report.failures[0].error
    mpp = synthetic_dataset.config.mpp
    assert report.failures[1].error == (f"{2 * mpp:.4g} µm/px at level 0, the centre's other "
                                        f"slides {mpp:.4g}: its patches would be of another "
                                        "scale")  # fmt: skip
    info = read_store_info(store_path(tmp_path / "out", 0))
    assert info.attrs.mpp == report.mpp == mpp
    stored = set(info.splits["train"].slides + info.splits["test"].slides)
    assert not {victim.slide_id, gone.slide_id} & stored


def test_a_centres_scale_is_its_slides_lower_median() -> None:
    """A value one slide has, whatever their order; a slide more than 10 % off is out."""
    assert centre_scale({"a": 0.25}, 0) == (0.25, {})
    centre, off = centre_scale({"b": 0.5, "a": 0.25}, 1)  # two: the finer one
    assert centre == 0.25 and list(off) == ["b"] and off["b"].startswith("0.5 µm/px at level 1")
    scanners = {"a": 0.2431, "b": 0.25, "c": 0.243, "d": 1.0, "e": 0.2675}
    centre, off = centre_scale(scanners, 2)
    assert centre == 0.25 and set(off) == {"d"}  # 0.2675 is 7 % off: in at 10 %, out at 5 %
    assert set(centre_scale(scanners, 2, tolerance=0.05)[1]) == {"d", "e"}
