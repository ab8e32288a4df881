"""Label-level local differential privacy by randomized response (PrivateKT, Qi et al. 2023).

A client of PrivateKT releases, each round, one class label per knowledge-transfer (KT)
item: its locally trained model's prediction ``y`` (a one-hot vector of C classes),
perturbed by randomized response (the paper's Eq. 2)::

    ŷ = y  if R = 1,   ŷ = f  if R = 0,      R ~ Bernoulli(β),  f ~ Uniform{e_1, ..., e_C}.

The uniform replacement ``f`` may equal ``y``, so a label survives with probability
``β + (1-β)/C`` and turns into any given other class with probability ``(1-β)/C``. The
ratio of the two is ``1 + βC/(1-β)``; with the paper's Lemma 1 (its Eq. 6)::

    β = (e^{ε/K} - 1) / (e^{ε/K} - 1 + C),

where **K is the number of KT items a client labels per round** and **C the number of
classes**, that ratio is exactly ``e^{ε/K}``: each label is (ε/K)-LDP and the K labels of
one round together ε-LDP (sequential composition over the K items). Everything a client
sends in PrivateKT is these K labels, so one round of PrivateKT is ε-LDP for the client's
*prediction labels*: a guarantee about what leaves the client, at the level of the labels
it releases — not the sample-level (ε, δ)-DP of DP-SGD (docs/algorithms.md §4).

Over rounds, basic sequential composition gives ``r·ε`` after a client has released r
rounds of labels (:func:`composed_epsilon`). The paper argues that model shuffling
(its refs. 41, 57) avoids this accumulation; that argument is an assumption about the
deployment (an anonymising shuffler between clients and server), not something this code
computes or enforces, so the figure reported over rounds is the composed one.

The server's aggregate (Eq. 3): with the perturbed one-hot labels ŷ_c of the |G| reporting
clients, ``E[ŷ_c] = β y_c + (1-β)/C · 1``, so::

    ŷ = (1/β) · ( (1/|G|) Σ_c ŷ_c − (1-β)/C · 1 )

is an unbiased estimate of the clients' mean prediction (1/|G|) Σ_c y_c.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from proxyfl.results import LABEL_LDP


def keep_probability(epsilon: float, kt_samples: int, n_classes: int) -> float:
    """β of Lemma 1 (Eq. 6): ``(e^{ε/K} − 1) / (e^{ε/K} − 1 + C)``.

    ``epsilon`` is the per-round budget ε, ``kt_samples`` the number K of KT items labelled
    per round, ``n_classes`` the number C of classes.
    """
    if epsilon <= 0:
        raise ValueError(f"ε must be positive, got {epsilon}")
    if kt_samples < 1 or n_classes < 2:
        raise ValueError(f"need K >= 1 and C >= 2, got K={kt_samples}, C={n_classes}")
    grown = math.expm1(epsilon / kt_samples)  # e^{ε/K} - 1, exact for small ε/K
    return grown / (grown + n_classes)


def randomized_response(
    labels: np.ndarray, beta: float, n_classes: int, rng: np.random.Generator
) -> np.ndarray:
    """Eq. (2) on class indices: keep each label with probability β, else replace it by a
    class drawn uniformly from all C (the original included). Returns int64 labels."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"labels outside 0..{n_classes - 1}")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"β must lie in [0, 1], got {beta}")
    keep = rng.random(labels.shape) < beta  # R ~ Bernoulli(β)
    uniform = rng.integers(0, n_classes, size=labels.shape, dtype=np.int64)  # f ~ P(C)
    return np.where(keep, labels, uniform)


def one_hot(labels: np.ndarray, n_classes: int) -> np.ndarray:
    """Labels (..., ) → float64 one-hot (..., C)."""
    return np.eye(n_classes, dtype=np.float64)[np.asarray(labels, dtype=np.int64)]


def unbiased_estimate(perturbed: np.ndarray, beta: float, n_classes: int) -> np.ndarray:
    """Eq. (3): ``(1/β)((1/|G|) Σ_c ŷ_c − (1−β)/C · 1)`` from the perturbed labels of the
    |G| reporting clients, ``perturbed`` of shape (|G|, K) (class indices). Returns (K, C).
    """
    perturbed = np.asarray(perturbed, dtype=np.int64)
    if perturbed.ndim != 2 or perturbed.shape[0] == 0:
        raise ValueError(
            f"need (clients, K) labels from at least one client, got {perturbed.shape}"
        )
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"β must lie in (0, 1], got {beta}")
    mean = one_hot(perturbed, n_classes).mean(axis=0)
    return (mean - (1.0 - beta) / n_classes) / beta


def composed_epsilon(epsilon_per_round: float, rounds: int) -> float:
    """Basic sequential composition: ``rounds · ε`` for ``rounds`` ε-LDP releases."""
    return float(epsilon_per_round) * int(rounds)


@dataclass
class LDPLedger:
    """A PrivateKT client's label-level ε-LDP: ε per round, and how many rounds it released.

    ``epsilon()`` is the guarantee over everything released so far by basic sequential
    composition (``releases · ε``); with ``--client-fraction 1`` that is ``t·ε`` after
    round t. A round in which the client was not selected releases nothing and costs
    nothing.
    """

    epsilon_per_round: float
    releases: int = 0
    notion: str = LABEL_LDP
    delta: float = 0.0  # pure ε-LDP

    def record_release(self) -> None:
        self.releases += 1

    def epsilon(self) -> float:
        return composed_epsilon(self.epsilon_per_round, self.releases)

    def epsilon_after_next_round(self) -> float:
        return composed_epsilon(self.epsilon_per_round, self.releases + 1)

    def state_dict(self) -> dict[str, Any]:
        return {"epsilon_per_round": self.epsilon_per_round, "releases": self.releases}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epsilon_per_round = float(state["epsilon_per_round"])
        self.releases = int(state["releases"])
