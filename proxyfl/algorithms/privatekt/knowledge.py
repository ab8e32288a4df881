"""PrivateKT's server-side knowledge: entropy-weighted sampling (Eqs. 4, 5) and the buffer.

With p(x, j; Θ) the model's softmax probability of class j on public item x, the model's
uncertainty on x is its entropy ``u(x) = −Σ_j p(x, j; Θ) log p(x, j; Θ)``.

- Eq. (4), choosing the next round's K knowledge-transfer (KT) items: weights
  ``w^d_i = exp(u_i) / Σ_j exp(u_j)`` under the current global model Θ_{t+1}: the items the
  model is least sure about are the most likely to be asked about.
- Eq. (5), choosing the M self-training items: weights ``w^s_i = exp(−u_i) / Σ_j exp(−u_j)``
  under the fine-tuned model Θ'_t: the items it is surest of, labelled by its own
  predictions.

Items are drawn without replacement (successive draws, each with the weights renormalised
over the items left), as the authors' code draws them.

The knowledge buffer keeps the aggregated knowledge (Eq. 3's estimates, with the KT items
they belong to) of the last B rounds, first in first out; the server fine-tunes the global
model on everything it holds.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np


def entropy(probabilities: np.ndarray) -> np.ndarray:
    """Row-wise ``−Σ_j p_j log p_j`` (0 log 0 = 0) of an (N, C) array of probabilities."""
    p = np.asarray(probabilities, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return -terms.sum(axis=-1)


def _softmax_weights(scores: np.ndarray) -> np.ndarray:
    shifted = np.asarray(scores, dtype=np.float64)
    shifted = shifted - shifted.max()
    weights = np.exp(shifted)
    return weights / weights.sum()


def kt_weights(probabilities: np.ndarray) -> np.ndarray:
    """Eq. (4): ``exp(u_i) / Σ_j exp(u_j)``, favouring high-entropy (uncertain) items."""
    return _softmax_weights(entropy(probabilities))


def self_training_weights(probabilities: np.ndarray) -> np.ndarray:
    """Eq. (5): ``exp(−u_i) / Σ_j exp(−u_j)``, favouring low-entropy (confident) items."""
    return _softmax_weights(-entropy(probabilities))


def weighted_sample(
    weights: np.ndarray | None, size: int, rng: np.random.Generator, n: int | None = None
) -> np.ndarray:
    """``size`` distinct indices drawn with probabilities ``weights`` (uniform if ``None``,
    over ``n`` items), without replacement. Returns sorted int64 indices."""
    count = len(weights) if weights is not None else n
    if count is None:
        raise ValueError("give the weights or the number of items")
    if not 0 <= size <= count:
        raise ValueError(f"cannot draw {size} distinct items from {count}")
    chosen = rng.choice(count, size=size, replace=False, p=weights)
    return np.sort(np.asarray(chosen, dtype=np.int64))


class KnowledgeBuffer:
    """The last ``capacity`` rounds of aggregated knowledge, first in first out.

    Each entry is one round's (KT item indices (K,), Eq. 3 estimates (K, C)).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"the buffer needs room for at least one round, got {capacity}")
        self.capacity = capacity
        self._entries: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._entries)

    def push(self, items: np.ndarray, estimates: np.ndarray) -> None:
        items = np.asarray(items, dtype=np.int64)
        estimates = np.asarray(estimates, dtype=np.float64)
        if estimates.shape[0] != items.shape[0]:
            raise ValueError(f"{items.shape[0]} items but {estimates.shape[0]} estimates")
        self._entries.append((items.copy(), estimates.copy()))

    def contents(self) -> tuple[np.ndarray, np.ndarray]:
        """Every stored (item, estimate) pair, oldest first: ``(items (N,), estimates (N, C))``."""
        if not self._entries:
            raise ValueError("the knowledge buffer is empty")
        items = np.concatenate([items for items, _ in self._entries])
        estimates = np.concatenate([estimates for _, estimates in self._entries])
        return items, estimates

    def targets(self) -> tuple[np.ndarray, np.ndarray]:
        """``(items, labels)``: each item's class of largest estimated mean prediction
        (the argmax of Eq. 3's estimate), the label the server fine-tunes on."""
        items, estimates = self.contents()
        return items, estimates.argmax(axis=-1).astype(np.int64)

    def state_dict(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "entries": [(i, e) for i, e in self._entries]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.capacity = int(state["capacity"])
        self._entries = deque(maxlen=self.capacity)
        for items, estimates in state["entries"]:
            self.push(items, estimates)
