"""How the audit runs (``params.yaml``'s ``audit:``, less where its files go)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from plumbing.parameters import Parameters, distinct
from proxyfl.names import Algorithm


class CanaryOptions(Parameters):
    """The one-run audit: which methods get a canary run, and its canaries and guesses."""

    model_config = ConfigDict(extra="forbid")

    algorithms: list[Algorithm] = Field(
        ["ProxyFL"],
        description="methods trained once more with canaries (empty: no canary run). "
        "ProxyFL gives a DP model and a model without DP side by side",
    )
    seed: int = Field(0, description="the canary run's training seed")
    count: int = Field(256, ge=2, description="canaries m per client")
    kind: Literal["noise", "flipped"] = Field(
        "noise",
        description="noise: uniform-noise patches with random labels, added (IN) or not "
        "(OUT): only memorising tells them apart, the most visible canaries; flipped: "
        "training patches carrying the other class, kept (IN) or left out (OUT)",
    )
    guesses: list[int] = Field(
        [16, 32, 64],
        description="k: the k highest-scoring canaries guessed IN, the k lowest OUT; one bound "
        "per k, each at (1 - confidence) / len(guesses) (Bonferroni), the largest reported",
    )
    confidence: float = Field(0.95, gt=0, lt=1, description="of the ε lower bound")

    @field_validator("algorithms")
    @classmethod
    def _sample_level_methods(cls, value: list[str]) -> list[str]:
        if "PrivateKT" in value:
            raise ValueError("PrivateKT's guarantee is label-level LDP, which a sample-level "
                             "canary audit does not test; list DP-SGD methods")  # fmt: skip
        return list(distinct(value, "method(s)"))

    @field_validator("guesses")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if not value or any(k < 1 for k in value):
            raise ValueError(f"guess counts must be positive, got {value}")
        return value


class AuditOptions(Parameters):
    """Membership inference on every run's kept models, and the canary runs' ε bounds."""

    model_config = ConfigDict(extra="forbid")

    reference_models: int = Field(
        4, ge=0,
        description="LiRA offline's reference models per client and architecture, an even "
        "number (each patch OUT of half of them); 0: the loss attack only",
    )  # fmt: skip
    bootstrap: int = Field(
        1000, ge=0, description="bootstrap resamples behind the 95-percent intervals"
    )
    seed: int = Field(0, description="reference models, halves, bootstrap and canary coins")
    canary: CanaryOptions = Field(default_factory=CanaryOptions)

    @field_validator("reference_models")
    @classmethod
    def _even(cls, value: int) -> int:
        if value % 2:
            raise ValueError(f"reference models come in pairs (0, 2, 4, ...), got {value}")
        return value
