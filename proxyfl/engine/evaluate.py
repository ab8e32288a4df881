"""Evaluation on the merged test splits: accuracy and macro-accuracy.

With the confusion counts ``M[c, p]`` (true class c predicted as p) over the test set,

    accuracy       = Σ_c M[c, c] / Σ_{c,p} M[c, p]
    macro-accuracy = mean over classes c with support of  M[c, c] / Σ_p M[c, p]

(the mean per-class recall, i.e. balanced accuracy; classes absent from the test set are
left out of the mean).

The test batches are read ahead by a thread (:mod:`proxyfl.engine.prefetch`, ``prefetch``
of them) and the predictions (and probabilities) stay on the device until the pass ends:
one transfer, no batch waits for the device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from proxyfl.engine.data import iterate_batches, prepare_images
from proxyfl.engine.prefetch import Prefetcher
from wsi.store.reader import PatchSplitReader


@dataclass(frozen=True)
class Scores:
    """Scores of one model on one test set."""

    accuracy: float
    macro_accuracy: float
    n_examples: int
    per_class_recall: tuple[float | None, ...]


def scores_from_confusion(confusion: np.ndarray) -> Scores:
    """:class:`Scores` from an (n_classes × n_classes) confusion count matrix."""
    total = int(confusion.sum())
    support = confusion.sum(axis=1)
    correct = np.diag(confusion)
    recalls = [float(c / s) if s > 0 else None for c, s in zip(correct, support, strict=True)]
    present = [r for r in recalls if r is not None]
    return Scores(
        accuracy=float(correct.sum() / total) if total else float("nan"),
        macro_accuracy=float(np.mean(present)) if present else float("nan"),
        n_examples=total,
        per_class_recall=tuple(recalls),
    )


def confusion_matrix(predictions: np.ndarray, targets: np.ndarray, n_classes: int) -> np.ndarray:
    """Counts ``M[c, p]`` of examples of class c predicted as p."""
    flat = targets.astype(np.int64) * n_classes + predictions.astype(np.int64)
    return np.bincount(flat, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def evaluate_models(
    models: Mapping[str, nn.Module],
    test_splits: Sequence[PatchSplitReader],
    n_classes: int,
    device: torch.device,
    input_size: int | None,
    batch_size: int = 64,
    prefetch: int = 2,
) -> dict[str, Scores]:
    """Score every model in ``models`` on the concatenation of ``test_splits`` (read once)."""
    scores, _ = _evaluate(models, test_splits, n_classes, device, input_size, batch_size,
                          False, prefetch)  # fmt: skip
    return scores


def evaluate_with_probabilities(
    models: Mapping[str, nn.Module],
    test_splits: Sequence[PatchSplitReader],
    n_classes: int,
    device: torch.device,
    input_size: int | None,
    batch_size: int = 64,
    prefetch: int = 2,
) -> tuple[dict[str, Scores], dict[str, np.ndarray]]:
    """:func:`evaluate_models`, and each model's softmax probabilities ``p[i, c]`` of every
    test patch i (in the order of ``test_splits``, then rows) and class c, from the same
    pass: the final round's per-patch record (sensitivity, specificity, AUC)."""
    scores, probabilities = _evaluate(
        models, test_splits, n_classes, device, input_size, batch_size, True, prefetch
    )
    assert probabilities is not None
    return scores, probabilities


@torch.inference_mode()
def _evaluate(
    models: Mapping[str, nn.Module],
    test_splits: Sequence[PatchSplitReader],
    n_classes: int,
    device: torch.device,
    input_size: int | None,
    batch_size: int,
    keep_probabilities: bool,
    prefetch: int = 2,
) -> tuple[dict[str, Scores], dict[str, np.ndarray] | None]:
    predicted: dict[str, list[torch.Tensor]] = {name: [] for name in models}
    kept: dict[str, list[torch.Tensor]] = {name: [] for name in models}
    targets: list[np.ndarray] = []
    modes = {name: model.training for name, model in models.items()}
    for model in models.values():
        model.eval()
    batches = Prefetcher(iterate_batches(test_splits, batch_size), prefetch,
                         pin=device.type == "cuda")  # fmt: skip
    try:
        for images, labels in batches:
            x = prepare_images(images, device, input_size)
            targets.append(labels.numpy())
            for name, model in models.items():
                logits = model(x)
                predicted[name].append(logits.argmax(dim=-1))
                if keep_probabilities:
                    kept[name].append(torch.softmax(logits.double(), dim=-1))
    finally:
        for name, model in models.items():
            model.train(modes[name])
    truth = np.concatenate(targets) if targets else np.zeros(0, dtype=np.int64)
    scores = {
        name: scores_from_confusion(confusion_matrix(_on_host(parts, (0,)), truth, n_classes))
        for name, parts in predicted.items()
    }
    if not keep_probabilities:
        return scores, None
    return scores, {name: _on_host(parts, (0, n_classes)) for name, parts in kept.items()}


def _on_host(parts: list[torch.Tensor], empty_shape: tuple[int, ...]) -> np.ndarray:
    """The device's pieces joined and copied to the host once (an empty array of
    ``empty_shape`` when there are none)."""
    if not parts:
        return np.zeros(empty_shape)
    return torch.cat(parts).cpu().numpy()
