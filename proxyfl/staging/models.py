"""Which kept model stages which centre, and a predictor of it for :mod:`wsi.heatmap`.

A run keeps each client's final models (:mod:`proxyfl.engine.trained`). The one that
stages a centre's patients is the model the hospital came for: the client's ``private``
model (ProxyFL, FML), else its ``central`` one (FedAvg, PrivateKT), else its ``local``
one; never the proxy, which was shared. Client k is the run's k-th centre; Joint's single
client, trained on every centre's data, stages every centre.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from plumbing.errors import PipelineError
from plumbing.verified import recorded_digest
from proxyfl.engine.trained import load_trained, predict_tumor, trained_path
from proxyfl.kept import rerun_hint

STAGING_MODELS: tuple[str, ...] = ("private", "central", "local")
"""The evaluated models that may stage a centre, in order of preference."""
POOLED = "Joint"  # one client trained on every centre's data


class StagingModelError(PipelineError):
    """A run has no kept model for a centre: names the run and what is missing."""


@dataclass(frozen=True)
class StagingModel:
    """The kept model of one run that stages one centre."""

    algorithm: str
    seed: int
    client: int
    path: Path
    digest: str  # the model file's recorded SHA-256 (sha256:HEX), or "unrecorded"

    @property
    def key(self) -> str:
        """``ALGORITHM/seed_S``: where its maps and calls go."""
        return f"{self.algorithm}/seed_{self.seed}"


def staging_model(
    run_dir: str | os.PathLike[str], algorithm: str, seed: int, centers: Sequence[int], center: int
) -> StagingModel:
    """The model of the run at ``run_dir`` (trained on ``centers``, one client each) that
    stages ``center``; :class:`StagingModelError` when the run keeps none."""
    run_dir = Path(run_dir)
    if center not in centers:
        raise StagingModelError(run_dir, f"centre {center} is not one of its clients {centers}")
    client = 0 if algorithm == POOLED else list(centers).index(center)
    for name in STAGING_MODELS:
        path = trained_path(run_dir, client, name)
        if path.is_file():
            return StagingModel(algorithm, seed, client, path,
                                recorded_digest(path) or "unrecorded")  # fmt: skip
    raise StagingModelError(
        run_dir / "models" / f"client_{client}",
        f"no kept model ({', '.join(f'{n}.safetensors' for n in STAGING_MODELS)}) to stage "
        f"centre {center} with; {rerun_hint(run_dir)}",
    )


def model_predictor(model: StagingModel, device: torch.device, batch_size: int):  # type: ignore[no-untyped-def]
    """A :data:`wsi.heatmap.Predictor` of ``model``: its probability of tumour per patch
    (verified, built and normalised as its card says), ``batch_size`` patches a pass."""
    network, card = load_trained(model.path, device)

    def predict(patches: np.ndarray) -> np.ndarray:
        return predict_tumor(network, card, patches, batch_size=batch_size)

    return predict


def choose_device(choice: str) -> torch.device:
    """``cuda`` for ``auto``/``cuda`` when a GPU is visible, else the CPU."""
    from proxyfl.engine.runtime import choose_device as rank_device

    return rank_device(choice, local_rank=0)
