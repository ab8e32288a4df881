from __future__ import annotations

import contextlib
import errno
import gc
import hashlib
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path

import h5py
import numpy as np
import pytest

from plumbing.atomic import temporary_path
from wsi.store import writer as store_writer
from wsi.store.provenance import (
    PIXEL_AND_FILE_LIBRARIES,
    Provenance,
    SourceFile,
    pixel_library_versions,
    project_version,
    source_files,
)
from wsi.store.reader import PatchSplitReader, read_store_info
from wsi.store.schema import (
    SCHEMA_VERSION,
    PatchBatch,
    StoreAttrs,
    StoreError,
    StoreSpaceError,
    store_path,
)
from wsi.store.space import disk_full_errno, free_bytes, store_bytes_needed
from wsi.store.writer import PatchStoreWriter, write_patch_store

ATTRS = StoreAttrs(center=2, patch_size=8, level=0, mpp=0.25, n_classes=2, params_hash="abc")


def _batch(n: int, seed: int, prefix: str | None = None) -> PatchBatch:
    """``n`` random patches of 3 patients, named after ``prefix`` (by default after
    ``seed``: batches of different seeds are of different patients)."""
    prefix = f"p{seed}" if prefix is None else prefix
    rng = np.random.default_rng(seed)
    return PatchBatch(
        images=rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8),
        labels=rng.integers(0, 2, size=n),
        patients=[f"{prefix}_{i % 3}" for i in range(n)],
        slides=[f"{prefix}_{i % 3}_node_{i % 5}" for i in range(n)],
        coords=rng.integers(0, 10_000, size=(n, 2)),
    )


def test_round_trip(tmp_path: Path) -> None:
    path = store_path(tmp_path, 2)
    assert path.name == "center_2.h5"
    train, test = _batch(10, 0, "train"), _batch(4, 1, "test")
    write_patch_store(path, ATTRS, {"train": train, "test": test})

    info = read_store_info(path)
    assert info.attrs == ATTRS
    assert info.image_shape == (8, 8, 3)
    assert len(info.splits["train"]) == 10 and len(info.splits["test"]) == 4
    np.testing.assert_array_equal(info.splits["test"].coords, test.coords)
    assert info.splits["train"].patients == tuple(train.patients)
    assert info.splits["train"].label_counts(2) == np.bincount(train.labels, minlength=2).tolist()

    reader = PatchSplitReader(path, "train")
    assert len(reader) == 10
    np.testing.assert_array_equal(reader.labels, train.labels)
    np.testing.assert_array_equal(reader.image(3), train.images[3])
    np.testing.assert_array_equal(reader.images([7, 2, 7]), train.images[[7, 2, 7]])
    np.testing.assert_array_equal(reader.images(), train.images)
    assert reader.images([]).shape == (0, 8, 8, 3)
    images, labels = zip(*reader, strict=True)
    assert len(images) == 10
    assert list(labels) == train.labels.tolist()
    reader.close()


def test_schema_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "center_2.h5"
    write_patch_store(path, ATTRS, {"train": _batch(3, 0), "test": _batch(2, 1)})
    with h5py.File(path, "r") as h5:
        assert h5.attrs["schema_version"] == SCHEMA_VERSION == 2
        images = h5["train/images"]
        assert images.dtype == np.uint8 and images.chunks == (1, 8, 8, 3)
        assert images.compression is None
        assert h5["train/coords"].dtype == np.int64 and h5["train/coords"].shape == (3, 2)
        assert h5["test/patients"].asstr()[0] == "p1_0"


def test_streaming_writer_and_atomic_publication(tmp_path: Path) -> None:
    path = tmp_path / "center_2.h5"
    with PatchStoreWriter(path, ATTRS, {"train": 6, "test": 2}) as writer:
        writer.write("train", 0, _batch(4, 0))
        assert not path.exists()  # nothing published until the store is complete
        writer.write("train", 4, _batch(2, 1))
        writer.write("test", 0, _batch(2, 2))
    assert len(read_store_info(path).splits["train"]) == 6
    assert [p.name for p in tmp_path.iterdir()] == ["center_2.h5"]


def test_crash_keeps_the_previous_store(tmp_path: Path) -> None:
    path = tmp_path / "center_2.h5"
    write_patch_store(path, ATTRS, {"train": _batch(3, 0), "test": _batch(1, 1)})
    before = path.read_bytes()
    with (
        pytest.raises(RuntimeError, match="boom"),
        PatchStoreWriter(path, ATTRS, {"train": 5, "test": 1}) as writer,
    ):
        writer.write("train", 0, _batch(2, 5))
        raise RuntimeError("boom")
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["center_2.h5"]


def test_incomplete_store_is_never_published(tmp_path: Path) -> None:
    path = tmp_path / "center_2.h5"
    with (
        pytest.raises(RuntimeError, match="unwritten slots"),
        PatchStoreWriter(path, ATTRS, {"train": 5, "test": 1}) as writer,
    ):
        writer.write("train", 0, _batch(5, 0))
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_writer_rejects_bad_batches(tmp_path: Path) -> None:
    with PatchStoreWriter(tmp_path / "c.h5", ATTRS, {"train": 2, "test": 1}) as writer:
        with pytest.raises(IndexError):
            writer.write("train", 1, _batch(2, 0))
        bad_labels = _batch(2, 0)
        bad_labels.labels[:] = 5
        with pytest.raises(ValueError, match="labels outside"):
            writer.write("train", 0, bad_labels)
        wrong_size = PatchBatch(
            np.zeros((1, 4, 4, 3), np.uint8), [0], ["p"], ["s"], np.zeros((1, 2))
        )
        with pytest.raises(ValueError, match="store wants 8x8"):
            writer.write("test", 0, wrong_size)
        writer.write("train", 0, _batch(2, 0))
        writer.write("test", 0, _batch(1, 1))
    with pytest.raises(ValueError, match="different lengths"):
        PatchBatch(np.zeros((2, 8, 8, 3), np.uint8), [0], ["p"], ["s"], np.zeros((2, 2)))
    with pytest.raises(ValueError, match="unknown split"):
        PatchStoreWriter(tmp_path / "d.h5", ATTRS, {"validation": 1})


def test_other_sizes_and_classes(tmp_path: Path) -> None:
    attrs = StoreAttrs(center=0, patch_size=5, level=1, mpp=1.0, n_classes=4, params_hash="x")
    train, test = (
        PatchBatch(np.ones((4, 5, 5, 3), np.uint8), [0, 1, 2, 3], list(names), list(names),
                   np.zeros((4, 2)))
        for names in ("abcd", "efgh")
    )  # fmt: skip
    write_patch_store(tmp_path / "c.h5", attrs, {"train": train, "test": test})
    info = read_store_info(tmp_path / "c.h5")
    assert info.attrs.n_classes == 4 and info.image_shape == (5, 5, 3)


def test_reader_survives_pickling(tmp_path: Path) -> None:
    path = tmp_path / "c.h5"
    batch = _batch(3, 0)
    write_patch_store(path, ATTRS, {"train": _batch(2, 1), "test": batch})
    reader = PatchSplitReader(path, "test")
    reader.image(0)  # open the handle, then make sure it does not travel
    clone = pickle.loads(pickle.dumps(reader))
    np.testing.assert_array_equal(clone.image(2), batch.images[2])


def _corrupt(path: Path, how: str) -> None:
    write_patch_store(path, ATTRS, {"train": _batch(3, 0), "test": _batch(2, 1)})
    with h5py.File(path, "a") as h5:
        if how == "attr":
            del h5.attrs["mpp"]
        elif how == "version":
            h5.attrs["schema_version"] = 7
        elif how == "group":
            del h5["test"]
        elif how == "dataset":
            del h5["train/coords"]
        elif how == "length":
            del h5["train/slides"]
            h5["train/slides"] = np.array([b"a"])
        elif how == "label":
            h5["train/labels"][0] = 9
        elif how in ("images", "labels", "coords", "patients"):
            retyped = {  # each a value the old reader cast without a word
                "images": h5["test/images"][()].astype(np.float64) / 255,
                "labels": h5["test/labels"][()].astype(np.float32) + 0.5,
                "coords": h5["test/coords"][:, :1],
                "patients": np.arange(2),
            }[how]
            del h5[f"test/{how}"]
            h5[f"test/{how}"] = retyped
        elif how == "overlap":  # a test patient of the training split
            h5["test/patients"][1] = h5["train/patients"][2]


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("attr", r"missing attribute\(s\) \['mpp'\]"),
        ("version", "schema_version 7"),
        ("group", "missing group /test"),
        ("dataset", "lacks dataset"),
        ("length", "differ in length"),
        ("label", "labels outside"),
        ("images", "/test/images are float64, the schema's are uint8"),
        ("labels", "/test/labels are float32, the schema's are integers"),
        ("coords", r"/test/coords are int64 of shape \(2, 1\), the schema's are \(N, 2\)"),
        ("patients", "/test/patients are int64, the schema's are strings"),
        ("overlap", r"patient\(s\) \['p0_2'\] in both the train and the test split"),
    ],
)
def test_malformed_stores_are_named(tmp_path: Path, how: str, message: str) -> None:
    path = tmp_path / "center_2.h5"
    _corrupt(path, how)
    with pytest.raises(StoreError, match=message) as caught:
        read_store_info(path)
    assert caught.value.path == path


def test_a_store_is_read_whole_split_by_split(tmp_path: Path) -> None:
    """A patient in both splits is found only when both are read: a client reads another
    centre's test split alone (test_metadata_of_chosen_splits_only); the types are checked
    whichever split is read."""
    path = tmp_path / "center_2.h5"
    _corrupt(path, "overlap")
    assert len(read_store_info(path, splits=("test",)).splits["test"]) == 2
    _corrupt(path, "images")
    with pytest.raises(StoreError, match="/test/images are float64"):
        read_store_info(path, splits=("train",))


def test_the_writer_refuses_a_patient_in_both_splits(tmp_path: Path) -> None:
    path = tmp_path / "center_2.h5"
    write_patch_store(path, ATTRS, {"train": _batch(3, 0), "test": _batch(2, 1)})
    before = path.read_bytes()
    many = _batch(9, 3, prefix="q")
    many.patients = [f"q_{i}" for i in range(9)]
    with (
        pytest.raises(StoreError, match=r"\['q_0', 'q_1', 'q_2', 'q_3', 'q_4'\] and 4 more in "
                                        "both the train and the test split") as caught,
        PatchStoreWriter(path, ATTRS, {"train": 9, "test": 9}) as writer,
    ):  # fmt: skip
        writer.write("train", 0, many)
        writer.write("test", 0, many)
    assert caught.value.path == path
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_missing_and_non_hdf5_stores(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no such patch store"):
        read_store_info(tmp_path / "center_0.h5")
    junk = tmp_path / "center_1.h5"
    junk.write_bytes(b"\x00" * 100)
    with pytest.raises(StoreError, match="not a readable HDF5 patch store"):
        PatchSplitReader(junk, "train")


def test_metadata_of_chosen_splits_only(tmp_path: Path) -> None:
    path = tmp_path / "center_2.h5"
    write_patch_store(path, ATTRS, {"train": _batch(3, 0), "test": _batch(2, 1)})
    info = read_store_info(path, splits=("test",))
    assert list(info.splits) == ["test"] and len(info.splits["test"]) == 2
    assert list(PatchSplitReader(path, "train").info.splits) == ["train"]
    with pytest.raises(ValueError, match="unknown split"):
        read_store_info(path, splits=("validation",))


def test_an_empty_split_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "center_2.h5"
    write_patch_store(path, ATTRS, {"train": _batch(3, 0), "test": _batch(0, 1)})
    info = read_store_info(path)
    assert len(info.splits["test"]) == 0 and len(info.splits["train"]) == 3


def test_a_failure_while_creating_removes_the_temporary(tmp_path: Path) -> None:
    unencodable = StoreAttrs(2, 8, 0, 0.25, 2, params_hash="\ud800")  # a lone surrogate
    with pytest.raises(UnicodeEncodeError):
        write_patch_store(tmp_path / "center_2.h5", unencodable, {"train": _batch(1, 0)})
    assert list(tmp_path.iterdir()) == []


def test_stale_temporaries_of_the_store_are_removed_first(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its PID is free
    stale = temporary_path(tmp_path / "center_2.h5", child.pid)
    stale.write_bytes(b"\0" * 1000)
    other = temporary_path(tmp_path / "center_3.h5", child.pid)
    other.write_bytes(b"\0")
    write_patch_store(tmp_path / "center_2.h5", ATTRS, {"train": _batch(2, 0)})
    assert not stale.exists() and other.exists()  # only this store's are its business


# --------------------------------------------------------------------------------------
# Provenance and reproducible bytes
# --------------------------------------------------------------------------------------


def test_provenance_round_trip(tmp_path: Path) -> None:
    slides = [tmp_path / "patient_001_node_2.tif", tmp_path / "patient_000_node_1.tif"]
    for size, slide in enumerate(slides, start=10):
        slide.write_bytes(b"\0" * size)
    sources = source_files([*slides, slides[0]])
    assert [s.name for s in sources] == ["patient_000_node_1.tif", "patient_001_node_2.tif"]
    zeros = hashlib.sha256(b"\0" * 10).hexdigest()  # by content: the time is not recorded
    assert sources[1] == SourceFile("patient_001_node_2.tif", 10, sha256=zeros)
    attrs = replace(ATTRS, sources=sources)
    path = tmp_path / "center_2.h5"
    write_patch_store(path, attrs, {"train": _batch(3, 0), "test": _batch(2, 1)})

    info = read_store_info(path)
    assert info.attrs == attrs and info.attrs.schema_version == 2
    assert info.provenance is not None and info.provenance.sources == sources
    assert info.provenance.project_version == project_version() == version("camelyon-proxyfl")
    libraries = info.provenance.libraries
    assert set(PIXEL_AND_FILE_LIBRARIES) | {"libhdf5"} == set(libraries)
    assert libraries["numpy"] == np.__version__ and libraries["h5py"] == h5py.__version__
    assert libraries["libhdf5"] == h5py.version.hdf5_version
    assert libraries == pixel_library_versions()
    with h5py.File(path, "r") as h5:
        text = h5.attrs["provenance"]
    assert isinstance(text, str)
    assert json.loads(text)["sources"][0] == {
        "name": "patient_000_node_1.tif", "size": 11,
        "sha256": hashlib.sha256(b"\0" * 11).hexdigest(),
    }  # fmt: skip
    assert Provenance.from_json(text) == info.provenance


def test_provenance_by_time_is_still_read_and_kept_byte_for_byte() -> None:
    """Stores written before content digests recorded each slide's mtime: they parse, and
    serialize to the same text (so the runs trained on them stay up to date)."""
    legacy = (
        '{"libraries":{"numpy":"1.26.4"},"project":{"name":"camelyon-proxyfl","version":'
        '"0.1.0"},"sources":[{"mtime_ns":1700000000000000000,"name":"s.tif","size":5}]}'
    )
    provenance = Provenance.from_json(legacy)
    assert provenance.sources == (SourceFile("s.tif", 5, mtime_ns=1_700_000_000_000_000_000),)
    assert provenance.to_json() == legacy


def test_same_inputs_give_the_same_bytes(tmp_path: Path) -> None:
    attrs = replace(ATTRS, sources=(SourceFile("s.tif", 5, sha256="0" * 64),))
    first, second = tmp_path / "a" / "center_2.h5", tmp_path / "b" / "center_2.h5"
    for path in (first, second):
        write_patch_store(path, attrs, {"train": _batch(10, 0), "test": _batch(3, 1)})
    assert first.read_bytes() == second.read_bytes()
    with h5py.File(first, "r") as h5:  # no creation or modification times recorded
        names: list[str] = []
        h5.visit(names.append)
        for name in ["/", *names]:
            info = h5py.h5o.get_info(h5[name].id)
            assert (info.ctime, info.mtime, info.atime, info.btime) == (0, 0, 0, 0), name


def test_schema_1_stores_are_still_read(tmp_path: Path) -> None:
    path = tmp_path / "center_2.h5"
    write_patch_store(path, ATTRS, {"train": _batch(3, 0), "test": _batch(2, 1)})
    with h5py.File(path, "a") as h5:
        del h5.attrs["provenance"]
        h5.attrs["schema_version"] = 1
    info = read_store_info(path)
    assert info.provenance is None and info.attrs.schema_version == 1
    assert len(PatchSplitReader(path, "train")) == 3


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, r"missing attribute\(s\) \['provenance'\]"),
        ("{]", "provenance is not valid"),
        ('{"project": {}}', "provenance is not valid"),
    ],
)
def test_bad_provenance_is_named(tmp_path: Path, value: str | None, message: str) -> None:
    path = tmp_path / "center_2.h5"
    write_patch_store(path, ATTRS, {"train": _batch(3, 0), "test": _batch(2, 1)})
    with h5py.File(path, "a") as h5:
        if value is None:
            del h5.attrs["provenance"]
        else:
            h5.attrs["provenance"] = value
    with pytest.raises(StoreError, match=message):
        read_store_info(path)


# --------------------------------------------------------------------------------------
# A full disk
# --------------------------------------------------------------------------------------

DISK_BYTES = 2 * 1024 * 1024
BIG = StoreAttrs(center=2, patch_size=32, level=0, mpp=0.25, n_classes=2, params_hash="big")
BIG_SIZES = {"train": 300, "test": 20}  # 1.4 MB by store_bytes_needed: fits an empty disk


def _patches(n: int, size: int = 32, patient: str = "patient_004") -> PatchBatch:
    return PatchBatch(
        np.full((n, size, size, 3), 200, np.uint8),
        np.zeros(n),
        [patient] * n,
        [f"{patient}_node_4"] * n,
        np.zeros((n, 2)),
    )


def _write_big(writer: PatchStoreWriter) -> None:
    writer.write("test", 0, _patches(20, patient="patient_003"))
    for start in range(0, 300, 64):
        writer.write("train", start, _patches(min(64, 300 - start)))


def _fill(directory: Path, leave: int = 0) -> Path:
    """Take the free space of ``directory``'s filesystem but ``leave`` bytes, or all of it."""
    ballast = directory / "ballast"
    descriptor = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        if leave:
            os.write(descriptor, b"\0" * (free_bytes(directory) - leave))
            return ballast
        for block in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(descriptor, b"\0" * block)
    finally:
        os.close(descriptor)
    assert free_bytes(directory) == 0
    return ballast


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB filesystem (tmpfs) holding a small store at ``center_2.h5``."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mount_point)],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        pytest.skip("no mount command here to make a small filesystem to fill up")
    if mounted.returncode != 0:
        pytest.skip(
            "cannot mount a 2 MiB tmpfs to fill up (needs root or CAP_SYS_ADMIN): "
            + mounted.stderr.strip()
        )
    try:
        write_patch_store(mount_point / "center_2.h5", ATTRS, {"train": _batch(3, 0)})
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _only_the_old_store_is_left(disk: Path, before: bytes, free_before: int) -> None:
    (disk / "ballast").unlink(missing_ok=True)
    assert sorted(p.name for p in disk.iterdir()) == ["center_2.h5"]  # no temporary left
    assert (disk / "center_2.h5").read_bytes() == before
    gc.collect()  # HDF5 handles left half-closed would crash the process here
    assert free_bytes(disk) == free_before  # every byte of the temporary given back


def test_preflight_refuses_a_store_that_cannot_fit(small_disk: Path) -> None:
    before = (small_disk / "center_2.h5").read_bytes()
    sizes = {"train": 900, "test": 100}
    needed = store_bytes_needed(sizes, 32)
    assert needed == 1000 * (32 * 32 * 3 + 512) + 256 * 1024
    with (
        pytest.raises(StoreSpaceError) as caught,
        PatchStoreWriter(small_disk / "center_2.h5", BIG, sizes),
    ):
        pytest.fail("the writer must not start")
    message = str(caught.value)
    assert message == (
        f"{small_disk / 'center_2.h5'}: needs {needed:,} bytes but only "
        f"{free_bytes(small_disk):,} are free on its filesystem"
    )
    assert sorted(p.name for p in small_disk.iterdir()) == ["center_2.h5"]
    assert (small_disk / "center_2.h5").read_bytes() == before


def test_disk_filling_up_during_the_write(small_disk: Path) -> None:
    before = (small_disk / "center_2.h5").read_bytes()
    free_before = free_bytes(small_disk)
    unclosable = len(store_writer._UNCLOSABLE)
    with (
        pytest.raises(StoreSpaceError) as caught,
        PatchStoreWriter(small_disk / "center_2.h5", BIG, BIG_SIZES) as writer,
    ):
        _fill(small_disk, leave=600_000)  # someone else takes space after the check
        _write_big(writer)
    message = str(caught.value)
    assert message.startswith(
        f"{small_disk / 'center_2.h5'}: no space left on device writing the store: "
        f"it needs {store_bytes_needed(BIG_SIZES, 32):,} bytes, "
    )
    assert "\n" not in message
    cause = caught.value.__cause__
    assert isinstance(cause, OSError) and cause.errno == errno.ENOSPC  # h5py's, chained
    assert len(store_writer._UNCLOSABLE) == unclosable  # the HDF5 file was closed cleanly
    _only_the_old_store_is_left(small_disk, before, free_before)


def test_disk_full_when_the_store_is_flushed(small_disk: Path) -> None:
    before = (small_disk / "center_2.h5").read_bytes()
    free_before = free_bytes(small_disk)
    unclosable = len(store_writer._UNCLOSABLE)
    with (
        pytest.raises(StoreSpaceError, match="no space left on device") as caught,
        PatchStoreWriter(small_disk / "center_2.h5", BIG, BIG_SIZES) as writer,
    ):
        _write_big(writer)
        _fill(small_disk)  # the patches are on disk; HDF5's metadata is not yet
    # h5py gives a RuntimeError here, its errno only in HDF5's message
    assert disk_full_errno(caught.value.__cause__) == errno.ENOSPC
    assert len(store_writer._UNCLOSABLE) == unclosable
    _only_the_old_store_is_left(small_disk, before, free_before)


_CHILD = """
import os, sys
import numpy as np
from wsi.store.schema import PatchBatch, StoreAttrs, StoreError
from wsi.store.writer import PatchStoreWriter
mode, target = sys.argv[1], sys.argv[2]
if mode == "efbig":
    import resource
    resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, resource.RLIM_INFINITY))
n = 400
batch = PatchBatch(np.zeros((n, 32, 32, 3), np.uint8), np.zeros(n), ["p"] * n, ["s"] * n,
                   np.zeros((n, 2)))
try:
    with PatchStoreWriter(target, StoreAttrs(2, 32, 0, 0.25, 2, "x"), {"train": n}) as writer:
        if mode == "full":  # take the whole disk as soon as the temporary exists
            with open(os.path.join(os.path.dirname(target), "ballast"), "wb", buffering=0) as f:
                for block in (65536, 4096, 1):
                    try:
                        while True:
                            f.write(bytes(block))
                    except OSError:
                        pass
        writer.write("train", 0, batch)
except StoreError as error:
    print(error)
"""


def _child(mode: str, target: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(target)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_a_completely_full_disk_ends_cleanly(small_disk: Path) -> None:
    """With no room even for HDF5's metadata the temporary cannot be closed: the process
    (a child here, since it keeps that descriptor) must still exit normally, not crash."""
    before = (small_disk / "center_2.h5").read_bytes()
    free_before = free_bytes(small_disk)
    child = _child("full", small_disk / "center_2.h5")
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.startswith(
        f"{small_disk / 'center_2.h5'}: no space left on device writing the store: it needs "
    )
    assert len(child.stderr.splitlines()) <= 2, child.stderr  # one log line, no tracebacks
    _only_the_old_store_is_left(small_disk, before, free_before)


def test_file_size_limit(tmp_path: Path) -> None:
    child = _child("efbig", tmp_path / "center_2.h5")
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.startswith(f"{tmp_path / 'center_2.h5'}: file too large writing the")
    assert list(tmp_path.iterdir()) == []


def test_disk_full_errno() -> None:
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        assert disk_full_errno(OSError(code, os.strerror(code))) == code
    hdf5 = "Can't decrement id ref count (file write failed: ..., errno = 28, error message = "
    assert disk_full_errno(RuntimeError(hdf5)) == errno.ENOSPC
    assert disk_full_errno(OSError(errno.EACCES, "Permission denied")) is None
    assert disk_full_errno(RuntimeError("errno = 13, error message = 'denied'")) is None
    assert disk_full_errno(ValueError("errno = 28")) is None


def test_needed_bytes_bound_real_stores(tmp_path: Path) -> None:
    for size, n in ((8, 1), (8, 2000), (32, 500)):
        path = tmp_path / f"c{size}_{n}.h5"
        attrs = StoreAttrs(0, size, 0, 0.25, 2, "x")
        write_patch_store(
            path, attrs, {"train": _patches(n, size), "test": _patches(1, size, "patient_003")}
        )
        pixels = (n + 1) * size * size * 3
        needed = store_bytes_needed({"train": n, "test": 1}, size)
        assert pixels < path.stat().st_size <= needed
