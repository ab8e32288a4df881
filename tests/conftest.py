"""Shared fixtures: paths to the third-party files every test may use."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def _third_party() -> Path:
    for candidate in (SHARED / "third_party", REPO / "tests" / "third_party"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        "third-party test files not found: expected ../shared/third_party next to the repository"
    )


@pytest.fixture(scope="session")
def third_party() -> Path:
    return _third_party()


@pytest.fixture(scope="session")
def openslide_fixtures(third_party: Path) -> Path:
    return third_party / "openslide-python-tests"


@pytest.fixture(scope="session")
def camelyon_annotation(third_party: Path) -> Path:
    return third_party / "camelyon17" / "patient_004_node_4.xml"


@pytest.fixture(scope="session")
def synthetic_dataset(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A small synthetic Camelyon-17 dataset (2 centres x 2 patients), generated once."""
    from wsi.synth import SynthConfig, generate_dataset

    root = tmp_path_factory.mktemp("camelyon17")
    config = SynthConfig(centers=(0, 1), patients_per_center=2, width=3072, height=2048, seed=7)
    return generate_dataset(root, config, workers=2)
