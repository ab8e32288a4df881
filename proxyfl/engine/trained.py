"""The trained models a run keeps: each client's final models, the ones a hospital came for.

Every client writes its models after the final round to
``RUN_DIR/models/client_{c}/{evaluated_model}.safetensors`` (``private`` and ``proxy`` for
ProxyFL and FML; ``central`` for FedAvg and PrivateKT; ``local`` otherwise), a
:class:`ModelCard` in the file's metadata and beside it as ``{evaluated_model}.json``:
the architecture, its input size, the patches it was trained on, how pixels are
normalised, the classes in output order and the run's configuration digest. The weights
are the tensors of the model's ``state_dict`` as they were after the final round, so the
file gives the predictions of ``predictions/client_{c}.csv`` (the test that says so:
``tests/proxyfl/test_launch_mpi.py``). On new patches, one line each::

    from proxyfl.engine.trained import load_trained, predict_tumor

    model, card = load_trained("runs/ProxyFL/seed_0/models/client_0/private.safetensors")
    p_tumor = predict_tumor(model, card, patches)  # uint8 (N, S, S, 3) RGB, S = patch_size

Safetensors holds tensors and strings only: loading runs no code, unlike a pickle. Each
file's SHA-256 is recorded beside it (``{evaluated_model}.safetensors.sha256``,
:mod:`plumbing.verified`) and :func:`load_trained` checks it: a model cut short or with
flipped bytes is refused with a :class:`~plumbing.verified.DamagedFileError` that names it
and the command that trains its run again, and a launch does not keep such a run
(:func:`proxyfl.kept.damaged_files`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save
from torch import nn

from plumbing.atomic import write_bytes, write_text
from plumbing.verified import DamagedFileError, record_digest, recorded_digest, verify
from proxyfl.engine.data import prepare_images
from proxyfl.engine.models import build_model
from proxyfl.kept import retrain_hint

CARD_KEY = "model_card"  # the safetensors metadata key holding the card's JSON
NORMALISATION = (
    "RGB uint8 x -> (x / 255 - 0.5) / 0.5 in [-1, 1], channels first, resized to input_size "
    "(bilinear, antialiased) when the patches are another size"
)
CLASSES: tuple[str, ...] = ("healthy", "tumor")  # the stores' labels 0 and 1, output order


@dataclass(frozen=True)
class ModelCard:
    """What is needed to use a kept model, and where it came from."""

    architecture: str  # proxyfl.engine.models.build_model's name
    n_classes: int
    input_size: int  # the side the model takes, px
    patch_size: int  # the side of the stored patches it was trained on, px
    normalisation: str
    classes: tuple[str, ...]
    evaluated_model: str  # private | proxy | central | local (metrics.jsonl's)
    algorithm: str
    seed: int
    client: int
    center: int  # the client's centre; -1 for Joint's pooled data
    rounds: int
    config_digest: str  # run.json's: the configuration that trained it

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ModelCard:
        content = json.loads(text)
        return cls(**{**content, "classes": tuple(content["classes"])})


def save_trained(model: nn.Module, path: Path, card: ModelCard) -> None:
    """``model``'s weights at ``path`` (safetensors, the card in its metadata) and the card
    beside it as JSON, each written atomically: the same weights give the same bytes."""
    tensors = {name: tensor.detach().cpu().contiguous()
               for name, tensor in model.state_dict().items()}  # fmt: skip
    # serialised here and written by write_bytes: a full disk is the OSError of that write
    # (ENOSPC, naming the file), where safetensors' own writer raises its SafetensorError
    write_bytes(path, save(tensors, metadata={CARD_KEY: card.to_json()}))
    record_digest(path)
    write_text(path.with_suffix(".json"), card.to_json())
    record_digest(path.with_suffix(".json"))


def read_card(path: str | os.PathLike[str]) -> ModelCard:
    """The card in a kept model's metadata (``ValueError`` for a file without one; a
    :class:`~plumbing.verified.DamagedFileError` for one safetensors cannot read)."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except OSError:
        raise
    except Exception as error:  # safetensors' own SafetensorError: a damaged header
        problem = f"not a model file safetensors can read ({' '.join(str(error).split())})"
        raise DamagedFileError(path, problem, retrain_hint(path)) from None
    if CARD_KEY not in metadata:
        raise ValueError(f"{path}: no {CARD_KEY} in its metadata: not a model a run kept")
    return ModelCard.from_json(metadata[CARD_KEY])


def load_trained(
    path: str | os.PathLike[str], device: str | torch.device = "cpu"
) -> tuple[nn.Module, ModelCard]:
    """The model at ``path``, its digest checked (where one was recorded), built as its
    card says, its weights loaded, in eval mode on ``device``, and its card."""
    if recorded_digest(path) is not None:
        verify(path, retrain_hint(path))
    card = read_card(path)
    model = build_model(card.architecture, n_classes=card.n_classes, input_size=card.input_size)
    model.load_state_dict(load_file(str(path), device="cpu"))
    return model.to(device).eval(), card


@torch.inference_mode()
def predict_tumor(
    model: nn.Module, card: ModelCard, patches: np.ndarray, batch_size: int = 128
) -> np.ndarray:
    """The probability of tumour (softmax of the output for ``card.classes``' "tumor") of
    each patch of ``patches``, uint8 (N, S, S, 3) RGB, normalised as in training."""
    if patches.ndim != 4 or patches.shape[-1] != 3 or patches.dtype != np.uint8:
        raise ValueError(f"patches must be uint8 (N, S, S, 3); got {patches.dtype} {patches.shape}")
    device = next(model.parameters()).device
    tumor = card.classes.index("tumor")
    out = []
    for start in range(0, len(patches), batch_size):
        block = torch.from_numpy(
            np.ascontiguousarray(patches[start : start + batch_size].transpose(0, 3, 1, 2))
        )
        x = prepare_images(block, device, card.input_size)
        out.append(torch.softmax(model(x).double(), dim=-1)[:, tumor].cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0)
