"""The stage command on input that is not there: one error line naming it, exit 1, and
nothing staged."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.stage import main


def test_a_missing_data_root_is_an_error_naming_it_not_an_empty_staging(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-root"
    out = tmp_path / "staging"
    status = main(["--data-root", str(missing), "--out", str(out),
                   "--summary", str(tmp_path / "staging.json")])  # fmt: skip
    error = capsys.readouterr().err
    assert status == 1, error
    assert f"error: {missing}: no such directory" in error and "Traceback" not in error
    assert not out.exists() and not (tmp_path / "staging.json").exists()


@pytest.fixture(scope="module")
def one_store(synthetic_dataset, tmp_path_factory):  # type: ignore[no-untyped-def]
    """Centre 0's store of the synthetic dataset (no run has trained on it)."""
    from wsi.cache import CandidateCache
    from wsi.catalogue import scan_camelyon
    from wsi.center import SamplingParams
    from wsi.patches import PatchParams
    from wsi.preprocess import center_store, slide_patches

    root = tmp_path_factory.mktemp("stage-flow")
    params = PatchParams(patch_size=32, level=2)
    records = [r for r in scan_camelyon(synthetic_dataset.root).for_centers([0]) if r.node_label]
    patches = [slide_patches(r, params, CandidateCache(root / "cache")) for r in records]
    center_store(0, patches, params, SamplingParams(patches_per_class=8, test_fraction=0.5),
                 root / "stores", records=records)  # fmt: skip
    return root / "stores"


def _stage(root: Path, stores: Path, tmp_path: Path) -> list[str]:
    return ["--data-root", str(root), "--data", str(stores), "--runs", str(tmp_path / "runs"),
            "--algorithms", "ProxyFL", "--seeds", "0", "--centers", "0",
            "--out", str(tmp_path / "staging"),
            "--summary", str(tmp_path / "staging.json")]  # fmt: skip


def test_a_missing_store_is_an_error_naming_it(
    synthetic_dataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    stores = tmp_path / "no-stores"
    status = main(_stage(synthetic_dataset.root, stores, tmp_path))
    error = capsys.readouterr().err
    assert status == 1, error
    assert f"error: {stores / 'center_0.h5'}: no such patch store" in error
    assert "`dvc repro preprocess@0`" in error and "Traceback" not in error
    assert not (tmp_path / "staging").exists() and not (tmp_path / "staging.json").exists()


def test_a_run_without_a_kept_model_is_an_error_naming_it(
    synthetic_dataset, one_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    status = main(_stage(synthetic_dataset.root, one_store, tmp_path))
    error = capsys.readouterr().err
    assert status == 1, error
    run = tmp_path / "runs" / "ProxyFL" / "seed_0"
    assert f"error: {run}" in error and "no kept model" in error and "--replace" in error
    assert "Traceback" not in error
    assert not (tmp_path / "staging").exists() and not (tmp_path / "staging.json").exists()
