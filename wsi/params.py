"""The parameters of preprocessing, as the libraries take them (pydantic, validated).

Kept apart from the code that uses them so that reading a parameters file imports no
image code: these fields are keys of ``params.yaml``'s ``preprocess:`` section, and their
defaults are the paper's protocol.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from plumbing.parameters import Parameters

HealthySource = Literal["negative_slides", "outside_annotations"]
Shortfall = Literal["fail", "take_available"]


class PatchParams(Parameters):
    """Everything that decides which patches a slide offers and how they are labelled.

    The defaults are the paper's protocol (512 px patches at level 0, 0.25 µm/px); these
    fields are also keys of ``params.yaml``'s ``preprocess:`` section.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    patch_size: int = Field(512, ge=8, description="stored patch side, pixels at `level`")
    level: int = Field(0, ge=0, description="pyramid level the patches are read at")
    mask_mpp: float = Field(8.0, gt=0, description="tissue and tumour mask resolution, µm/px")
    tissue_fraction_min: float = Field(
        0.5, gt=0, le=1, description="least tissue fraction of a patch's area"
    )
    tumor_fraction_min: float = Field(
        0.5, gt=0, le=1, description="least lesion fraction of a tumour patch's area"
    )
    healthy_source: HealthySource = Field(
        "negative_slides",
        description="where healthy patches come from: negative_slides (pN0 slides), or "
        "outside_annotations (tissue outside the lesions of annotated slides too)",
    )
    min_saturation: float = Field(
        0.07, ge=0, le=1, description="floor of the Otsu saturation threshold for tissue"
    )


class SamplingRules(Parameters):
    """How a centre's patches are drawn and split, whatever their number.

    ``shortfall`` says what a centre that cannot supply ``patches_per_class`` of every
    label does: ``"fail"`` (:class:`InsufficientPatchesError`), or ``"take_available"``:
    as many of each label as its scarcest label has, so the store stays balanced.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    shortfall: Shortfall = Field(
        "fail",
        description="a centre short of patches_per_class: fail, or take_available "
        "(as many as it has, still balanced)",
    )
    max_per_slide: int | None = Field(None, ge=1, description="cap per slide and label")
    test_fraction: float = Field(
        0.2, gt=0, lt=1, description="share of each centre's patients in the test split"
    )
    seed: int = Field(0, description="seed of the patient split and the patch draw")


class SamplingParams(SamplingRules):
    """:class:`SamplingRules` and the number of patches of each label one centre keeps."""

    patches_per_class: int = Field(1000, ge=1, description="patches of each label")
