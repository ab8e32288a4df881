"""A store's test split alone (wsi/store/test_split.py, `camelyon-proxyfl sites test-split`):
what a centre gives the other sites of a federation, and nothing of its training split."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest

from camelyon_proxyfl import sites
from wsi.store.provenance import Provenance, SourceFile
from wsi.store.reader import PatchSplitReader, read_store_info
from wsi.store.schema import PatchBatch, StoreAttrs, StoreError, store_path
from wsi.store.test_split import write_test_split
from wsi.store.writer import write_patch_store

SLIDES = ["train_0_node_0", "train_1_node_1", "test_0_node_0", "test_1_node_3", "test_2_node_4"]
SOURCES = tuple(SourceFile(f"{slide}.tif", 100 + i, f"{i:064x}") for i, slide in enumerate(SLIDES))
ATTRS = StoreAttrs(center=3, patch_size=8, level=0, mpp=0.25, n_classes=2, params_hash="abc",
                   sources=SOURCES)  # fmt: skip


def _batch(n: int, seed: int, prefix: str, slides: list[str]) -> PatchBatch:
    rng = np.random.default_rng(seed)
    return PatchBatch(
        images=rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8),
        labels=rng.integers(0, 2, size=n),
        patients=[f"{prefix}_{i % 3}" for i in range(n)],
        slides=[slides[i % len(slides)] for i in range(n)],
        coords=rng.integers(0, 10_000, size=(n, 2)),
    )


def _store(folder: Path, center: int = 3, n_test: int = 7) -> Path:
    path = store_path(folder, center)
    write_patch_store(path, replace(ATTRS, center=center), {
        "train": _batch(11, 0, "train", ["train_0_node_0", "train_1_node_1"]),
        "test": _batch(n_test, 1, "test", ["test_0_node_0", "test_1_node_3", "test_2_node_4"]),
    })  # fmt: skip
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("batch", [3, 256])  # several batches, and one
def test_the_copy_holds_the_test_split_and_nothing_of_the_training_split(
    tmp_path: Path, batch: int
) -> None:
    source = _store(tmp_path / "hospital")
    target = store_path(tmp_path / "shared", 3)
    assert write_test_split(source, target, batch=batch) == 7
    full, copy = read_store_info(source), read_store_info(target)
    assert copy.attrs.scalars() == full.attrs.scalars()
    for field in ("labels", "coords"):
        np.testing.assert_array_equal(getattr(copy.splits["test"], field),
                                      getattr(full.splits["test"], field))  # fmt: skip
    assert copy.splits["test"].patients == full.splits["test"].patients
    assert copy.splits["test"].slides == full.splits["test"].slides
    np.testing.assert_array_equal(PatchSplitReader(target, "test").images(),
                                  PatchSplitReader(source, "test").images())  # fmt: skip
    assert len(copy.splits["train"]) == 0
    # not a training slide named: its provenance lists the test patients' slides only
    assert {s.name for s in copy.attrs.sources} == {
        "test_0_node_0.tif", "test_1_node_3.tif", "test_2_node_4.tif"}  # fmt: skip
    with h5py.File(target, "r") as h5:
        provenance = Provenance.from_json(h5.attrs["provenance"])
        assert "train_" not in h5.attrs["provenance"]  # no training slide's name
        assert all(h5["train"][name].shape[0] == 0 for name in h5["train"])
    assert {s.name for s in provenance.sources} == {s.name for s in copy.attrs.sources}


def test_a_store_holding_training_patches_is_never_replaced(tmp_path: Path) -> None:
    source = _store(tmp_path / "hospital")
    own = _store(tmp_path / "other", center=3)  # another folder's full store of that name
    before = {path: _sha(path) for path in (source, own)}
    for target in (source, own):
        with pytest.raises(StoreError, match=r"holds centre 3's training split \(11 patches\)"):
            write_test_split(source, target)
    assert {path: _sha(path) for path in (source, own)} == before
    # an earlier copy is replaced, as any file that is not a store
    copy = store_path(tmp_path / "shared", 3)
    write_test_split(source, copy)
    assert write_test_split(copy, copy) == 7
    assert len(read_store_info(copy).splits["train"]) == 0


def test_a_store_without_test_patches_or_unreadable_is_named(tmp_path: Path) -> None:
    empty = _store(tmp_path / "empty", n_test=0)
    with pytest.raises(StoreError, match="its test split is empty") as raised:
        write_test_split(empty, tmp_path / "out" / "center_3.h5")
    assert raised.value.path == empty
    broken = tmp_path / "broken" / "center_3.h5"
    broken.parent.mkdir()
    broken.write_bytes(b"not HDF5")
    with pytest.raises(StoreError, match="not a readable HDF5 patch store"):
        write_test_split(broken, tmp_path / "out" / "center_3.h5")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_command_copies_each_store_and_names_the_one_it_cannot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stores = [_store(tmp_path / "a", center=0), tmp_path / "missing" / "center_1.h5",
              _store(tmp_path / "b", center=2)]  # fmt: skip
    out = tmp_path / "shared"
    assert sites.main(["test-split", *map(str, stores), "--out", str(out)]) == 2
    said = capsys.readouterr()
    (error,) = said.err.splitlines()
    assert error.startswith(f"error: {stores[1]}: no such patch store"), error
    assert sorted(p.name for p in out.iterdir()) == ["center_0.h5", "center_2.h5"]
    assert "center_2.h5: centre 2's test split, 7 patches (no training patch)" in said.out
    assert all(len(read_store_info(p).splits["train"]) == 0 for p in out.iterdir())


def test_a_rank_evaluates_on_another_centres_copy_and_cannot_train_on_one(tmp_path: Path) -> None:
    """A site's folder: its own store and another centre's test split. Its rank reads the
    copy's test split as it would the full store's; a rank given a copy as its own store
    says it cannot train."""
    from proxyfl.config import TrainConfig
    from proxyfl.engine.validation import SetupError
    from proxyfl.rank_inputs import check_stores

    data = tmp_path / "patches"
    _store(data, center=0)
    write_test_split(_store(tmp_path / "hospital-1", center=1), store_path(data, 1))
    config = TrainConfig(algorithm="ProxyFL", data=data, run_dir=tmp_path / "run",
                         centers=[0, 1], batch_size=4)  # fmt: skip
    plan = check_stores(config, 0, 2)
    assert (plan.center, plan.train_centers, plan.test_centers) == (0, [0], [0, 1])
    with pytest.raises(SetupError, match=r"no training patches in centre\(s\) \[1\] \(a store "
                       "of its test split only"):  # fmt: skip
        check_stores(config, 1, 2)
