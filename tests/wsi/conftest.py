"""Fixtures for tests of the wsi library: a small synthetic Camelyon-17 dataset."""

from __future__ import annotations

from pathlib import Path

import pytest

from wsi.synth import SynthConfig, SynthManifest, generate_dataset

# Two centres, two patients each (patients 0, 1, 20, 21), five nodes: 20 slides of
# 2048 x 1536 px at 0.25 µm/px in 256-px JPEG tiles, 3 levels. About 3-5 s to write.
SYNTHETIC_CONFIG = SynthConfig(
    centers=(0, 1),
    patients_per_center=2,
    seed=7,
    width=2048,
    height=1536,
    tile_size=256,
)


@pytest.fixture(scope="session")
def synthetic_config() -> SynthConfig:
    return SYNTHETIC_CONFIG


@pytest.fixture(scope="session")
def synthetic_dataset(tmp_path_factory: pytest.TempPathFactory) -> SynthManifest:
    """A tiny synthetic Camelyon-17 dataset (nested layout) and what was written."""
    return generate_dataset(tmp_path_factory.mktemp("synthetic_camelyon"), SYNTHETIC_CONFIG)


@pytest.fixture(scope="session")
def synthetic_root(synthetic_dataset: SynthManifest) -> Path:
    """Root folder of :func:`synthetic_dataset`; treat it as read-only."""
    return synthetic_dataset.root
