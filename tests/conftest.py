"""Shared fixtures: paths to the third-party files every test may use."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

# The fast tier (`make test-fast`, `pytest -m "not slow"`): the tests that run in one
# process, about 2 minutes on 2 cores. The tests that start MPI jobs, flows, Prefect
# servers or DVC are `slow`: every test of these files, and those marked so elsewhere.
SLOW_FILES = (
    "tests/flows/",
    "tests/pipeline/test_dvc.py",
    "tests/pipeline/test_interrupt.py",
    "tests/pipeline/test_deployment.py",
    "tests/pipeline/test_resume.py",
    "_mpi.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path.relative_to(REPO).as_posix()
        if any(part in path for part in SLOW_FILES):
            item.add_marker(pytest.mark.slow)


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
    config = SynthConfig(centers=(0, 1), patients_per_center=2, width=3072, height=2048, seed=8)
    return generate_dataset(root, config, workers=2)
