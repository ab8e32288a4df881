"""How each centre looks: its stains (a Beer-Lambert H&E model), scanner and nuclei."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wsi.synth.config import _STREAM_STAIN

# --------------------------------------------------------------------------------------
# Stains
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StainProfile:
    """How a centre stains: optical-density directions and strengths, and its glass."""

    hematoxylin_od: tuple[float, float, float]
    eosin_od: tuple[float, float, float]
    hematoxylin_strength: float
    eosin_strength: float
    background_rgb: tuple[float, float, float]

    def jittered(self, rng: np.random.Generator, amount: float = 0.06) -> StainProfile:
        h, e = rng.uniform(1 - amount, 1 + amount, size=2)
        return StainProfile(
            self.hematoxylin_od,
            self.eosin_od,
            self.hematoxylin_strength * float(h),
            self.eosin_strength * float(e),
            self.background_rgb,
        )


_CENTER_STAINS: dict[int, StainProfile] = {
    # Ruifrok & Johnston's H&E directions, a neutral glass.
    0: StainProfile((0.65, 0.70, 0.29), (0.07, 0.99, 0.11), 1.00, 1.00, (240.0, 238.0, 240.0)),
    # Strong, bluer hematoxylin; light eosin; bright glass.
    1: StainProfile((0.52, 0.74, 0.42), (0.10, 0.95, 0.20), 1.30, 0.75, (244.0, 243.0, 242.0)),
    # Pink-red: strong eosin, weak hematoxylin.
    2: StainProfile((0.70, 0.68, 0.22), (0.02, 0.97, 0.03), 0.85, 1.40, (238.0, 235.0, 236.0)),
    # Dark and purple: both stains strong, a purplish eosin; greyer glass.
    3: StainProfile((0.62, 0.72, 0.33), (0.20, 0.92, 0.30), 1.20, 1.20, (236.0, 235.0, 238.0)),
    # Pale and faded, warm glass.
    4: StainProfile((0.72, 0.64, 0.28), (0.05, 0.88, 0.30), 0.70, 0.70, (245.0, 242.0, 236.0)),
}


def center_stain(center: int) -> StainProfile:
    """The stain profile of a centre: fixed presets for 0-4, derived ones beyond."""
    if center in _CENTER_STAINS:
        return _CENTER_STAINS[center]
    rng = np.random.default_rng([_STREAM_STAIN, center])
    base = _CENTER_STAINS[center % len(_CENTER_STAINS)]
    h = np.clip(np.array(base.hematoxylin_od) + rng.normal(0, 0.06, 3), 0.05, None)
    e = np.clip(np.array(base.eosin_od) + rng.normal(0, 0.06, 3), 0.01, None)
    strengths = rng.uniform(0.7, 1.35, 2)
    glass = np.clip(np.array(base.background_rgb) + rng.normal(0, 2.0, 3), 235, 246)
    return StainProfile(
        (float(h[0]), float(h[1]), float(h[2])),
        (float(e[0]), float(e[1]), float(e[2])),
        float(strengths[0]),
        float(strengths[1]),
        (float(glass[0]), float(glass[1]), float(glass[2])),
    )


@dataclass(frozen=True)
class CenterLook:
    """Everything about a centre's slides that is not the patient: stain, scanner, lab.

    * ``stain``: :class:`StainProfile` (the hue and strength of both stains, the glass);
    * ``focus_blur_um``: how far the scanner's point spread smears an edge (µm): nuclei
      get a soft rim of that width, so fine chromatin detail fades at a blurry centre;
    * ``noise``: the scanner's sensor and stain grain, as a multiple of centre 0's;
    * ``nucleus_scale``: every nucleus radius is multiplied by it (section thickness and
      fixation swell or shrink cells alike in healthy and tumour tissue);
    * ``tumour_contrast``: how far tumour cytoplasm moves from stroma towards hematoxylin
      (1: centre 0; < 1: a lab whose tumour cytoplasm is almost as pink as its stroma).

    The presets make the centres differ the way Camelyon-17's hospitals do, enough that a
    classifier trained on one centre's colours misreads another's (the premise of federated
    learning across hospitals) while nuclear size and paleness separate the classes
    everywhere.
    """

    stain: StainProfile
    focus_blur_um: float = 0.0
    noise: float = 1.0
    nucleus_scale: float = 1.0
    tumour_contrast: float = 1.0


_CENTER_LOOKS: dict[int, tuple[float, float, float, float]] = {
    # (focus_blur_um, noise, nucleus_scale, tumour_contrast)
    0: (0.0, 1.0, 1.00, 1.0),
    1: (1.5, 0.6, 1.15, 0.45),
    2: (0.5, 2.0, 0.85, 0.7),
    3: (2.5, 1.4, 1.05, 0.35),
    4: (1.0, 1.0, 0.95, 0.6),
}


def center_look(center: int) -> CenterLook:
    """The :class:`CenterLook` of a centre: presets for 0-4, derived ones beyond."""
    stain = center_stain(center)
    if center in _CENTER_LOOKS:
        return CenterLook(stain, *_CENTER_LOOKS[center])
    rng = np.random.default_rng([_STREAM_STAIN, center, 1])
    return CenterLook(
        stain,
        focus_blur_um=float(rng.uniform(0.0, 2.5)),
        noise=float(rng.uniform(0.6, 2.0)),
        nucleus_scale=float(rng.uniform(0.85, 1.15)),
        tumour_contrast=float(rng.uniform(0.35, 1.0)),
    )


def _unit(vector: Sequence[float]) -> np.ndarray:
    array = np.asarray(vector, dtype=np.float32)
    return array / np.linalg.norm(array)
