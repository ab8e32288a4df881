"""An ε lower bound from one training run (Steinke, Nasr and Jagielski, "Privacy auditing
with one (1) training run", NeurIPS 2023).

m canaries, each in the training data independently with probability ½ (``S_i = ±1``).
After the run an attacker guesses for some of them (``T_i = ±1``) and abstains on the
rest; with r guesses, W of them right, and ``q = e^ε / (1 + e^ε)``:

- if training is ε-DP, ``P[W ≥ v] ≤ P[Binomial(r, q) ≥ v] =: f(v)`` (their main theorem);
- if it is (ε, δ)-DP, ``P[W ≥ v] ≤ f(v) + 2 m δ · max_{i=1..v} (f(v - i) - f(v)) / i``
  (its (ε, δ) form, as the authors' appendix code computes it).

The bound at confidence 1 - β is the largest ε whose p-value for the observed ``(r, v)``
is below β: any smaller ε would have made the observation too unlikely, so the training
was not (ε, δ)-DP for it, with confidence 1 - β. Zero when even ε = 0 is not rejected.

The guesses: the ``k`` highest-scoring canaries are guessed IN and the ``k`` lowest OUT,
for each k of a list fixed in advance; the list's bounds are taken at β / len(list)
each (Bonferroni), so their maximum holds at 1 - β. Taking the best k found after the
fact without that correction would overstate the bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def p_value(m: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """The largest probability an (ε, δ)-DP training gives ``correct`` or more right of
    ``guesses`` guesses on ``m`` canaries."""
    from scipy.stats import binom  # when bounded: scipy.stats is ~1 s of a command's start

    if correct <= 0:
        return 1.0
    q = 1.0 / (1.0 + np.exp(-epsilon))
    tail = float(binom.sf(correct - 1, guesses, q))  # P[Bin(r, q) >= v]
    if delta == 0:
        return tail
    i = np.arange(1, correct + 1)
    # f(v - i) - f(v) = P[v - i <= Bin < v]
    excess = binom.sf(correct - i - 1, guesses, q) - tail
    return float(min(1.0, tail + 2 * m * delta * float(np.max(excess / i))))


def epsilon_lower_bound(
    m: int, guesses: int, correct: int, delta: float, beta: float = 0.05
) -> float:
    """The largest ε rejected at level ``beta`` for ``correct`` right of ``guesses`` on
    ``m`` canaries (0 if ε = 0 is not rejected)."""
    if not 0 <= correct <= guesses <= m:
        raise ValueError(f"need 0 <= correct ({correct}) <= guesses ({guesses}) <= m ({m})")
    from scipy.optimize import brentq

    if p_value(m, guesses, correct, 0.0, delta) >= beta:
        return 0.0
    high = 1.0
    while p_value(m, guesses, correct, high, delta) < beta:  # ends: P[Bin(r, q) >= v] -> 1
        high *= 2
    return float(brentq(lambda e: p_value(m, guesses, correct, e, delta) - beta, 0.0, high,
                        xtol=1e-6))  # fmt: skip


@dataclass(frozen=True)
class CanaryAudit:
    """The best bound over the guess counts fixed in advance, and what gave it."""

    epsilon_lower_bound: float
    canaries: int
    guesses: int  # r of the bound reported (k IN guesses + k OUT guesses)
    correct: int  # v of it
    confidence: float


def audit_canaries(
    scores: np.ndarray,
    included: np.ndarray,
    guess_counts: Sequence[int],
    delta: float,
    confidence: float = 0.95,
) -> CanaryAudit:
    """The ε lower bound from canary ``scores`` (higher: "IN") and their coins
    ``included``: for each k in ``guess_counts`` the top k are guessed IN and the bottom k
    OUT, each bound taken at level (1 - confidence) / len(guess_counts)."""
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    m = len(scores)
    if included.shape != (m,) or m == 0:
        raise ValueError(f"{m} canary scores and {included.shape} coins")
    counts = sorted({min(int(k), m // 2) for k in guess_counts if k > 0})
    if not counts:
        raise ValueError(f"no guess count in {list(guess_counts)} fits {m} canaries")
    beta = (1 - confidence) / len(counts)
    order = np.argsort(-scores, kind="stable")
    best = CanaryAudit(0.0, m, 0, 0, confidence)
    for k in counts:
        correct = int(included[order[:k]].sum() + (~included[order[m - k :]]).sum())
        bound = epsilon_lower_bound(m, 2 * k, correct, delta, beta)
        if bound > best.epsilon_lower_bound or best.guesses == 0:
            best = CanaryAudit(bound, m, 2 * k, correct, confidence)
    return best
