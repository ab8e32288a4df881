"""Which kept model stages which centre, and a predictor of it for :mod:`wsi.heatmap`.

A run keeps each client's final models (:mod:`proxyfl.engine.trained`). The one that
stages a centre's patients is the model the hospital came for
(:func:`proxyfl.kept.deployed_model`): the client's ``private`` model (ProxyFL, FML), else
its ``central`` one (FedAvg, PrivateKT), else its ``local`` one; never the proxy, which
was shared. Client k is the run's k-th centre; Joint's single client, trained on every
centre's data, stages every centre.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from plumbing.errors import PipelineError
from plumbing.verified import recorded_digest
from proxyfl.kept import DEPLOYED_MODELS, MODELS_DIR, POOLED, deployed_model, rerun_hint

if TYPE_CHECKING:
    import torch


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
    deployed = deployed_model(run_dir, algorithm, centers, center)
    if deployed is None:
        client = 0 if algorithm == POOLED else list(centers).index(center)
        raise StagingModelError(
            run_dir / MODELS_DIR / f"client_{client}",
            f"no kept model ({', '.join(f'{n}.safetensors' for n in DEPLOYED_MODELS)}) to "
            f"stage centre {center} with; {rerun_hint(run_dir)}",
        )
    client, path = deployed
    return StagingModel(algorithm, seed, client, path, recorded_digest(path) or "unrecorded")


def model_predictor(model: StagingModel, device: torch.device, batch_size: int):  # type: ignore[no-untyped-def]
    """A :data:`wsi.heatmap.Predictor` of ``model``: its probability of tumour per patch
    (verified, built and normalised as its card says), ``batch_size`` patches a pass."""
    # torch on first use: a staging whose centres are up to date, its --help and its
    # refusals of bad input start in ~3 s, not ~7 (torch's import on 2 cores)
    from proxyfl.engine.trained import load_trained, predict_tumor

    network, card = load_trained(model.path, device)

    def predict(patches: np.ndarray) -> np.ndarray:
        return predict_tumor(network, card, patches, batch_size=batch_size)

    return predict


def choose_device(choice: str) -> torch.device:
    """``cuda`` for ``auto``/``cuda`` when a GPU is visible, else the CPU."""
    from proxyfl.engine.runtime import choose_device as rank_device

    return rank_device(choice, local_rank=0)
