"""Evaluation on the merged test splits: accuracy and macro-accuracy.

With the confusion counts ``M[c, p]`` (true class c predicted as p) over the test set,

    accuracy       = Σ_c M[c, c] / Σ_{c,p} M[c, p]
    macro-accuracy = mean over classes c with support of  M[c, c] / Σ_p M[c, p]

(the mean per-class recall, i.e. balanced accuracy; classes absent from the test set are
left out of the mean).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from proxyfl.engine.data import iterate_batches, prepare_images
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
) -> dict[str, Scores]:
    """Score every model in ``models`` on the concatenation of ``test_splits`` (read once)."""
    scores, _ = _evaluate(models, test_splits, n_classes, device, input_size, batch_size, False)
    return scores


def evaluate_with_probabilities(
    models: Mapping[str, nn.Module],
    test_splits: Sequence[PatchSplitReader],
    n_classes: int,
    device: torch.device,
    input_size: int | None,
    batch_size: int = 64,
) -> tuple[dict[str, Scores], dict[str, np.ndarray]]:
    """:func:`evaluate_models`, and each model's softmax probabilities ``p[i, c]`` of every
    test patch i (in the order of ``test_splits``, then rows) and class c, from the same
    pass: the final round's per-patch record (sensitivity, specificity, AUC)."""
    scores, probabilities = _evaluate(
        models, test_splits, n_classes, device, input_size, batch_size, True
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
) -> tuple[dict[str, Scores], dict[str, np.ndarray] | None]:
    confusions = {name: np.zeros((n_classes, n_classes), dtype=np.int64) for name in models}
    kept: dict[str, list[np.ndarray]] = {name: [] for name in models}
    modes = {name: model.training for name, model in models.items()}
    for model in models.values():
        model.eval()
    try:
        for images, labels in iterate_batches(test_splits, batch_size):
            x = prepare_images(images, device, input_size)
            targets = labels.numpy()
            for name, model in models.items():
                logits = model(x)
                predictions = logits.argmax(dim=-1).cpu().numpy()
                confusions[name] += confusion_matrix(predictions, targets, n_classes)
                if keep_probabilities:
                    kept[name].append(torch.softmax(logits.double(), dim=-1).cpu().numpy())
    finally:
        for name, model in models.items():
            model.train(modes[name])
    scores = {name: scores_from_confusion(confusion) for name, confusion in confusions.items()}
    if not keep_probabilities:
        return scores, None
    empty = np.zeros((0, n_classes))
    return scores, {name: np.concatenate(parts) if parts else empty for name, parts in kept.items()}
