"""``data:``: where the Camelyon-17 dataset is, and how the synthetic one is made."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from camelyon_proxyfl.params.base import Section
from wsi.synth.config import SynthSettings

# The embedded synthetic dataset's root: `dvc.yaml`'s synth stage writes it there, and the
# pipeline flow writes it when data.root is this directory and it is absent.
SYNTHETIC_ROOT = Path("data/synthetic")
DATA_ROOT_FIX = (
    "set data.root in the parameters file (or --data-root) to your copy of the Camelyon-17 "
    f"training set (docs/real-data.md), or to {SYNTHETIC_ROOT} for the embedded "
    "synthetic dataset"
)


class DataSection(Section):
    """``data:``: where the Camelyon-17 dataset is, and how the synthetic one is made."""

    root: Path = Field(
        SYNTHETIC_ROOT,
        description="dataset root (center_*/, lesion_annotations/, stage_labels.csv); "
        f"{SYNTHETIC_ROOT} is the embedded synthetic dataset, written from data.synth",
    )
    synth: SynthSettings = Field(
        default_factory=SynthSettings, description="the embedded synthetic dataset"
    )

    @property
    def is_synthetic(self) -> bool:
        """Whether ``root`` is the embedded synthetic dataset (relative to the working
        directory, as every path of the parameters file)."""
        return self.root.resolve() == SYNTHETIC_ROOT.resolve()
