from __future__ import annotations

import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest

from wsi.store import (
    PatchBatch,
    PatchSplitReader,
    PatchStoreWriter,
    StoreAttrs,
    StoreError,
    read_store_info,
    store_path,
    write_patch_store,
)

ATTRS = StoreAttrs(center=2, patch_size=8, level=0, mpp=0.25, n_classes=2, params_hash="abc")


def _batch(n: int, seed: int, prefix: str = "p") -> PatchBatch:
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
        assert h5.attrs["schema_version"] == 1
        images = h5["train/images"]
        assert images.dtype == np.uint8 and images.chunks == (1, 8, 8, 3)
        assert images.compression is None
        assert h5["train/coords"].dtype == np.int64 and h5["train/coords"].shape == (3, 2)
        assert h5["test/patients"].asstr()[0] == "p_0"


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
    with pytest.raises(RuntimeError, match="boom"), PatchStoreWriter(
        path, ATTRS, {"train": 5, "test": 1}
    ) as writer:
        writer.write("train", 0, _batch(2, 5))
        raise RuntimeError("boom")
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["center_2.h5"]


def test_incomplete_store_is_never_published(tmp_path: Path) -> None:
    path = tmp_path / "center_2.h5"
    with pytest.raises(RuntimeError, match="unwritten slots"), PatchStoreWriter(
        path, ATTRS, {"train": 5, "test": 1}
    ) as writer:
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
        writer.write("test", 0, _batch(1, 0))
    with pytest.raises(ValueError, match="different lengths"):
        PatchBatch(np.zeros((2, 8, 8, 3), np.uint8), [0], ["p"], ["s"], np.zeros((2, 2)))
    with pytest.raises(ValueError, match="unknown split"):
        PatchStoreWriter(tmp_path / "d.h5", ATTRS, {"validation": 1})


def test_other_sizes_and_classes(tmp_path: Path) -> None:
    attrs = StoreAttrs(center=0, patch_size=5, level=1, mpp=1.0, n_classes=4, params_hash="x")
    batch = PatchBatch(
        np.ones((4, 5, 5, 3), np.uint8), [0, 1, 2, 3], list("abcd"), list("abcd"), np.zeros((4, 2))
    )
    write_patch_store(tmp_path / "c.h5", attrs, {"train": batch, "test": batch})
    info = read_store_info(tmp_path / "c.h5")
    assert info.attrs.n_classes == 4 and info.image_shape == (5, 5, 3)


def test_reader_survives_pickling(tmp_path: Path) -> None:
    path = tmp_path / "c.h5"
    batch = _batch(3, 0)
    write_patch_store(path, ATTRS, {"train": batch, "test": batch})
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


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("attr", r"missing attribute\(s\) \['mpp'\]"),
        ("version", "schema_version 7"),
        ("group", "missing group /test"),
        ("dataset", "lacks dataset"),
        ("length", "differ in length"),
        ("label", "labels outside"),
    ],
)
def test_malformed_stores_are_named(tmp_path: Path, how: str, message: str) -> None:
    path = tmp_path / "center_2.h5"
    _corrupt(path, how)
    with pytest.raises(StoreError, match=message) as caught:
        read_store_info(path)
    assert caught.value.path == path


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
