from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from camelyon_proxyfl.params.preprocess import PreprocessConfig
from flows.preprocess import (
    UnknownSlidesError,
    current_store_inputs,
    main,
    parse_config,
    preprocess,
)
from wsi.annotations import read_asap
from wsi.catalogue import scan_camelyon
from wsi.freshness import inputs_path, stale_reason
from wsi.slide import open_slide
from wsi.store.reader import read_store_info
from wsi.store.schema import store_path
from wsi.synth import SynthManifest

REPO = Path(__file__).resolve().parents[2]
PATCH_SIZE = 128
PER_CLASS = 6


def _flags(root: Path, out: Path, workers: int = 1) -> list[str]:
    """The preprocessing command line every test shares (small patches, two centres; one
    pool worker, two for the stores every test reads: :func:`built`)."""
    return [
        *("--config", str(REPO / "params.yaml"), "--data-root", str(root)),
        *("--out", str(out), "--cache-dir", str(out.parent / f"{out.name}-cache")),
        *("--centers", "0", "1", "--patch-size", str(PATCH_SIZE), "--level", "0"),
        *("--patches-per-class", str(PER_CLASS), "--workers", str(workers)),
    ]


def _run(root: Path, out: Path, *extra: str, workers: int = 1) -> int:
    return main([*_flags(root, out, workers), *extra])


@pytest.fixture(scope="module")
def built(synthetic_dataset: SynthManifest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both centres' stores, their slides cut by two pool workers at once."""
    out = tmp_path_factory.mktemp("run") / "patches"
    assert _run(synthetic_dataset.root, out, workers=2) == 0
    return out


def test_stores_hold_the_slides_pixels_with_labels_by_the_rule(
    built: Path, synthetic_dataset: SynthManifest
) -> None:
    catalogue = scan_camelyon(synthetic_dataset.root)
    for center in (0, 1):
        info = read_store_info(store_path(built, center))
        assert info.attrs.patch_size == PATCH_SIZE and info.attrs.center == center
        assert info.attrs.mpp == pytest.approx(0.25)
        import h5py

        with h5py.File(store_path(built, center)) as h5:
            for split in ("train", "test"):
                images = h5[split]["images"][()]
                meta = info.splits[split]
                for index, (slide_id, (x, y), label) in enumerate(
                    zip(meta.slides, meta.coords, meta.labels, strict=True)
                ):
                    record = catalogue.get(slide_id)
                    assert record.center == center
                    with open_slide(record.path, "tiffslide") as slide:
                        expected = slide.read_region(int(x), int(y), 0, (PATCH_SIZE, PATCH_SIZE))
                    np.testing.assert_array_equal(images[index], expected)
                    if label == 0:
                        assert record.node_label == "negative"
                    else:
                        assert record.annotation is not None
                        lesions = read_asap(record.annotation).tumor
                        centre = np.array([x + PATCH_SIZE / 2, y + PATCH_SIZE / 2])
                        from matplotlib.path import Path as PolygonPath

                        assert any(PolygonPath(r.vertices).contains_point(centre) for r in lesions)


def test_counts_are_balanced_and_patients_disjoint(built: Path) -> None:
    summary = json.loads((built / "summary.json").read_text())
    for center in (0, 1):
        info = read_store_info(store_path(built, center))
        train, test = info.splits["train"], info.splits["test"]
        assert set(train.patients).isdisjoint(test.patients)
        assert np.bincount(np.concatenate([train.labels, test.labels])).tolist() == [PER_CLASS] * 2
        report = summary["centers"][str(center)]
        assert report["counts"]["train"] == dict(
            zip(("healthy", "tumor"), train.label_counts(2), strict=True)
        )
        assert report["patients"]["test"] == sorted(set(test.patients))
    csv_lines = (built / "summary.csv").read_text().splitlines()
    assert csv_lines[0] == "center,split,healthy,tumor,total,patients" and len(csv_lines) == 5
    assert json.loads((built / "failures.json").read_text()) == []


def test_corrupt_slide_is_recorded_and_the_rest_stored(
    synthetic_dataset: SynthManifest, tmp_path: Path
) -> None:
    root = tmp_path / "data"
    shutil.copytree(synthetic_dataset.root, root)
    victim = next(s for s in scan_camelyon(root).slides if s.node_label == "negative")
    victim.path.write_bytes(b"II*\x00" + os.urandom(4000))
    out = tmp_path / "patches"
    assert _run(root, out) == 0
    failures = json.loads((out / "failures.json").read_text())
    assert [(f["slide"], f["stage"]) for f in failures] == [(victim.slide_id, "open")]
    assert str(victim.path) in failures[0]["error"]
    for center in (0, 1):
        stored = read_store_info(store_path(out, center)).splits["train"].slides
        assert victim.slide_id not in stored
    assert _run(root, tmp_path / "strict", "--strict") == 1


def test_short_centre_fails_naming_it(
    synthetic_dataset: SynthManifest, tmp_path: Path, capsys
) -> None:
    assert _run(synthetic_dataset.root, tmp_path / "p", "--patches-per-class", "5000") == 1
    error = capsys.readouterr().err
    assert "centre 0: can supply only" in error and "5000 of each requested" in error
    assert not store_path(tmp_path / "p", 0).exists()
    assert not inputs_path(tmp_path / "p", 0).exists(), "no record of a store that failed"


def test_a_store_is_up_to_date_until_an_input_it_depends_on_changes(
    synthetic_dataset: SynthManifest, built: Path, tmp_path: Path
) -> None:
    """The record beside each store (wsi.freshness) holds while its slides, parameters,
    libraries and the store itself are as they were, and names what changed when not."""
    root, out = tmp_path / "data", tmp_path / "patches"
    shutil.copytree(synthetic_dataset.root, root)  # copies keep sizes and modification times
    shutil.copytree(built, out)
    config, _ = parse_config(_flags(root, out))

    def reasons(flags: tuple[str, ...] = ()) -> dict[int, str | None]:
        asked = parse_config([*_flags(root, out), *flags])[0] if flags else config
        return {c: stale_reason(out, i) for c, i in current_store_inputs(asked).items()}

    assert reasons() == {0: None, 1: None}
    assert reasons(("--seed", "5")) == dict.fromkeys((0, 1), "its parameters changed")
    assert reasons(("--workers", "3", "--backend", "tiffslide")) == {0: None, 1: None}

    slide = next(r for r in scan_camelyon(root).slides if r.center == 1)
    stat = slide.path.stat()
    os.utime(slide.path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    now = reasons()
    assert now[0] is None, "another centre's slide is not this store's input"
    assert now[1] == f"its source files changed ({slide.path.relative_to(root).as_posix()})"
    os.utime(slide.path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (root / "lesion_annotations" / "patient_999_node_0.xml").write_text("<ASAP_Annotations/>")
    assert all("lesion_annotations/patient_999_node_0.xml" in r for r in reasons().values())
    (root / "lesion_annotations" / "patient_999_node_0.xml").unlink()
    assert reasons() == {0: None, 1: None}

    record_file = inputs_path(out, 0)
    record = json.loads(record_file.read_text())
    record["inputs"]["libraries"]["h5py"] = "0.0"  # as recorded by another installation
    record_file.write_text(json.dumps(record))
    assert reasons()[0] == "library versions changed (h5py)"
    record_file.unlink()
    assert reasons()[0] == "no record of the inputs it was built from (center_0.inputs.json)"

    shutil.copy(store_path(out, 1), tmp_path / "center_1.h5")  # a copy: new times, same bytes
    os.replace(tmp_path / "center_1.h5", store_path(out, 1))
    assert reasons()[1] is None
    shutil.copy(store_path(out, 0), store_path(out, 1))  # another store in its place
    assert reasons()[1] == "center_1.h5 changed since it was built"
    store_path(out, 1).write_bytes(b"not HDF5")  # torn by hand: never taken for a store
    assert reasons()[1].startswith("center_1.h5 does not read (")
    inputs_path(out, 1).write_text("{not json")
    assert reasons()[1].startswith("its record center_1.inputs.json does not read (")

    assert _run(root, out) == 0  # built again: recorded again
    assert reasons() == {0: None, 1: None}


def test_bad_parameters_exit_2(synthetic_dataset: SynthManifest, tmp_path: Path, capsys) -> None:
    assert _run(synthetic_dataset.root, tmp_path / "p", "--test-fraction", "1.5") == 2
    assert "test_fraction" in capsys.readouterr().err
    assert _run(tmp_path / "nowhere", tmp_path / "p") == 2


def test_killed_run_reruns_to_identical_stores(
    synthetic_dataset: SynthManifest, built: Path, tmp_path: Path
) -> None:
    out = tmp_path / "patches"
    cache = tmp_path / "patches-cache"
    command = [
        sys.executable,
        "-m",
        "flows.preprocess",
        *_flags(synthetic_dataset.root, out, workers=1),
    ]
    process = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list(cache.glob("*.npz"))) < 3:
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    done = len(list(cache.glob("*.npz")))
    assert 3 <= done < 20, "the run should have been killed midway"
    assert not list(out.glob("*.h5")), "no store may be published before the run completes"
    out.mkdir(exist_ok=True)
    leftover = out / f".center_0.h5.{process.pid}.tmp"  # as a store write killed midway
    leftover.write_bytes(b"\0" * 4096)
    assert _run(synthetic_dataset.root, out) == 0
    assert not leftover.exists() and not list(out.glob(".*.tmp"))
    assert len(list(cache.glob("*.npz"))) == 20
    for center in (0, 1):
        assert store_path(out, center).read_bytes() == store_path(built, center).read_bytes()


def test_redo_slides_recomputes_exactly_those_and_rebuilds_identical_stores(
    synthetic_dataset: SynthManifest, built: Path, tmp_path: Path, caplog
) -> None:
    out, cache = tmp_path / "patches", tmp_path / "patches-cache"
    shutil.copytree(built, out)
    shutil.copytree(built.parent / f"{built.name}-cache", cache)
    records = [r for r in scan_camelyon(synthetic_dataset.root).for_centers([0, 1]) if r.node_label]
    redo = records[0].slide_id
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.glob("*.npz")}
    assert len(before) == len(records)
    stores_before = {c: store_path(out, c).stat().st_ino for c in (0, 1)}

    assert _run(synthetic_dataset.root, out, "--redo-slides", redo, redo) == 0

    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.glob("*.npz")}
    assert after.keys() == before.keys(), "same parameters, same keys"
    changed = {name for name in before if after[name] != before[name]}
    assert [name.rsplit("-", 1)[0] for name in changed] == [redo]
    assert f"redo {redo}: removed {cache / next(iter(changed))}" in caplog.text
    for center in (0, 1):
        assert store_path(out, center).stat().st_ino != stores_before[center], "store rebuilt"
        assert store_path(out, center).read_bytes() == store_path(built, center).read_bytes()


def test_redo_of_an_unknown_slide_exits_2_naming_it_and_writes_nothing(
    synthetic_dataset: SynthManifest, tmp_path: Path, capsys
) -> None:
    other_centre = next(
        r for r in scan_camelyon(synthetic_dataset.root).slides if r.center == 1 and r.node_label
    )
    for centers, ids in ((["0", "1"], ["patient_099_node_0"]), (["0"], [other_centre.slide_id])):
        out = tmp_path / "p"
        assert _run(synthetic_dataset.root, out, "--centers", *centers, "--redo-slides", *ids) == 2
        error = capsys.readouterr().err
        assert f"{ids[0]} is not a labelled slide of centres {', '.join(centers)}" in error
        assert not out.exists() and not (tmp_path / "p-cache").exists()
    config = PreprocessConfig(
        data_root=synthetic_dataset.root, out=tmp_path / "p", cache_dir=tmp_path / "p-cache"
    )
    with pytest.raises(UnknownSlidesError, match="patient_099_node_0"):  # the flow checks too
        preprocess(config, redo_slides=("patient_099_node_0",))
    assert not (tmp_path / "p").exists() and not (tmp_path / "p-cache").exists()


def test_a_centre_without_slides_exits_2_before_any_work_and_writes_nothing(
    synthetic_dataset: SynthManifest, tmp_path: Path, capsys
) -> None:
    """As `pipeline --check` says it: before a flow starts, a report or summary is written."""
    out = tmp_path / "p"
    assert _run(synthetic_dataset.root, out, "--centers", "0", "7", "9") == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: preprocess.centers: centre {c} has no labelled slide under "
        f"{synthetic_dataset.root} (centres with labelled slides: "
        f"{scan_camelyon(synthetic_dataset.root).centers})"
        for c in (7, 9)
    ]
    assert not out.exists() and not (tmp_path / "p-cache").exists()
