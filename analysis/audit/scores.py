"""Membership scores of examples under a model: higher means "more likely a member".

From a model's logits ``z`` on example ``(x, y)``:

- the **loss attack** (Yeom et al. 2018): ``s = log p_y = -CE(z, y)``;
- the **logit-scaled confidence** (Carlini et al. 2022, §IV-B):
  ``φ = log(p_y / (1 - p_y)) = z_y - log Σ_{c≠y} exp(z_c)``, computed from the logits so
  that it stays finite when ``p_y`` rounds to 1;
- **LiRA offline** (Carlini et al. 2022, §VI-C, with a fixed variance): reference models
  trained without the example give ``φ_out``; with ``μ_out(x)`` their mean for ``x`` and
  ``σ_out`` the pooled standard deviation of ``φ_out - μ_out`` over all examples (few
  reference models per example, so one variance for all), the one-sided likelihood-ratio
  test ranks examples by ``s = (φ_target(x) - μ_out(x)) / σ_out``: a target model that
  trained on ``x`` is more confident on it than models that did not.
"""

from __future__ import annotations

import numpy as np


def _check(logits: np.ndarray, labels: np.ndarray) -> None:
    if logits.ndim != 2 or labels.shape != (logits.shape[0],):
        raise ValueError(f"logits (N, C) and labels (N,) needed; got {logits.shape}, "
                         f"{labels.shape}")  # fmt: skip


def log_likelihood(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``log p_y`` of each example (the loss attack's score, ``-CE``)."""
    _check(logits, labels)
    z = logits.astype(np.float64)
    top = z.max(axis=1, keepdims=True)
    log_normaliser = top[:, 0] + np.log(np.exp(z - top).sum(axis=1))
    return z[np.arange(len(z)), labels] - log_normaliser


def logit_confidence(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``φ = log(p_y / (1 - p_y))`` of each example, from the logits."""
    _check(logits, labels)
    z = logits.astype(np.float64)
    rows = np.arange(len(z))
    others = z.copy()
    others[rows, labels] = -np.inf
    top = others.max(axis=1, keepdims=True)
    log_rest = top[:, 0] + np.log(np.exp(others - top).sum(axis=1))
    return z[rows, labels] - log_rest


def lira_offline(
    target_confidence: np.ndarray, reference_confidence: np.ndarray, out_mask: np.ndarray
) -> np.ndarray:
    """LiRA offline scores with a fixed variance.

    ``target_confidence`` (N,): φ of the audited model; ``reference_confidence`` (R, N):
    φ of R reference models on the same examples; ``out_mask`` (R, N): True where the
    reference model did not train on the example. Every example needs at least one OUT
    reference model."""
    reference_confidence = np.asarray(reference_confidence, dtype=np.float64)
    out_mask = np.asarray(out_mask, dtype=bool)
    if reference_confidence.shape != out_mask.shape or out_mask.shape[1:] != (
        len(target_confidence),
    ):
        raise ValueError(
            f"reference confidences {reference_confidence.shape}, mask {out_mask.shape} and "
            f"{len(target_confidence)} examples disagree"
        )
    counts = out_mask.sum(axis=0)
    if (counts == 0).any():
        raise ValueError(f"{int((counts == 0).sum())} example(s) have no OUT reference model")
    mean_out = np.where(out_mask, reference_confidence, 0.0).sum(axis=0) / counts
    deviations = (reference_confidence - mean_out)[out_mask]
    # pooled over examples; with one OUT model per example the deviations are all 0 and
    # the scale is the spread of φ_out across examples instead (ranking unchanged)
    spread = float(np.sqrt(np.mean(deviations**2))) if np.any(deviations) else 0.0
    if spread == 0.0:
        spread = float(np.std(mean_out)) or 1.0
    return (np.asarray(target_confidence, dtype=np.float64) - mean_out) / spread
