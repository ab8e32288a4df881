"""Bad input under real mpiexec: one clear message before any training, all ranks exit != 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def broken_dirs(helpers: Any, stores: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("broken")
    missing = root / "missing"
    missing.mkdir()
    (missing / "center_0.h5").symlink_to(stores / "center_0.h5")
    malformed = root / "malformed"
    malformed.mkdir()
    (malformed / "center_0.h5").symlink_to(stores / "center_0.h5")
    (malformed / "center_1.h5").write_bytes(b"this is not an HDF5 file\n" * 10)
    renamed = root / "renamed"  # centre 2's store copied under centre 1's name
    renamed.mkdir()
    (renamed / "center_0.h5").symlink_to(stores / "center_0.h5")
    (renamed / "center_1.h5").symlink_to(stores / "center_2.h5")
    return {"missing": missing, "malformed": malformed, "renamed": renamed}


CASES = {
    # ... and how to rebuild it
    "missing store": (
        2,
        "missing",
        {},
        "centre 1: ",
        "no such patch store; `python -m flows.preprocess --centers 1` (or `dvc repro "
        "preprocess@1`, where 1 is one of preprocess.centers) rebuilds it",
    ),
    "malformed store": (2, "malformed", {}, "centre 1: ", "not a readable HDF5 patch store"),
    "another centre's store": (
        2,
        "renamed",
        {},
        "centre 1: ",
        "its attribute center is 2: it holds centre 2's patches, not centre 1's",
    ),
    "centre listed twice": (2, None, {"centers": [0, 0]}, "", "listed more than once"),
    "more ranks than centres": (3, None, {"centers": [0, 1]}, "", "3 ranks but only 2 centre"),
    "unknown model": (2, None, {"proxy_model": "resnet50"}, "", "unknown model 'resnet50'"),
    "unknown private model": (2, None, {"private_model": "vgg"}, "", "unknown model 'vgg'"),
    "unknown algorithm": (2, None, {"algorithm": "FedProx"}, "", "unknown algorithm 'FedProx'"),
    "batch larger than data": (2, None, {"batch_size": 41}, "", "larger than the 40 training"),
    "joint with several ranks": (
        2,
        None,
        {"algorithm": "Joint", "centers": [0, 1]},
        "",
        "launch it with mpiexec -n 1",
    ),
    "joint without centres": (1, None, {"algorithm": "Joint"}, "", "list them"),
    # a real allocation failure of torch's CPU allocator (one 1,000,000² px example: 12 TB, which
    # no machine has, so the allocator refuses it at once),
    # caught before round 1 as a GPU's torch.OutOfMemoryError is (proxyfl.engine.memory)
    "does not fit in memory": (
        2,
        None,
        {"input_size": 1_000_000, "proxy_model": "resnet18_gn", "private_model": "resnet18_gn"},
        "",
        "out of memory on cpu in one example's forward pass at batch 1: an allocation of "
        "12000.00 GB more failed",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gives_one_clear_message_and_every_rank_fails(
    helpers: Any, stores: Path, broken_dirs: dict, tmp_path: Path, case: str
) -> None:
    ranks, data_key, settings, context, message = CASES[case]
    options = dict(settings)
    data = broken_dirs[data_key] if data_key else stores
    algorithm = options.pop("algorithm", "ProxyFL")
    args = helpers.train_args(data, tmp_path / "run", algorithm, **options)
    result = helpers.run_mpi(ranks, args, timeout=120)
    assert result.returncode != 0, helpers.explain(result)
    errors = [line for line in result.stderr.splitlines() if "proxyfl.run: error:" in line]
    # Rank 0 prints each distinct problem once (a message shared by ranks is merged).
    assert 1 <= len(errors) <= ranks and len(set(errors)) == len(errors), helpers.explain(result)
    assert all(message in line and context in line and "rank" in line for line in errors), errors
    assert "Traceback" not in result.stderr, helpers.explain(result)
    # Nothing was trained or written.
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_run_record_that_cannot_be_written_is_one_line_naming_rank_0(
    helpers: Any, stores: Path, tmp_path: Path
) -> None:
    """Rank 0 writes the run's first records (machine.json, then run.json "running") once
    every rank is set up, before round 1: where it cannot (a folder where run.json goes),
    one line naming the rank and the file, exit 2, no traceback, and no round trained."""
    run_dir = tmp_path / "run"
    (run_dir / "run.json").mkdir(parents=True)
    result = helpers.run_mpi(2, helpers.train_args(stores, run_dir, "FedAvg"), timeout=120)
    assert result.returncode == 2, helpers.explain(result)
    errors = [line for line in result.stderr.splitlines() if "proxyfl.run: error:" in line]
    assert len(errors) == 1 and errors[0].startswith("proxyfl.run: error: rank 0"), errors
    assert "run.json" in errors[0] and "Is a directory" in errors[0], errors
    assert "Traceback" not in result.stderr, helpers.explain(result)
    assert not (run_dir / "metrics.jsonl").exists()
