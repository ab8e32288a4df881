"""Privacy accounting: the one function that turns DP-SGD steps into (ε, δ).

Each DP-SGD step is a sampled Gaussian mechanism: Poisson sampling with rate ``q``, noise
``σ`` (standard deviation σ·C on a sum of gradients clipped to norm C). Its Rényi DP at
order λ is ``RDP_λ(q, σ)`` (Mironov, Talwar & Zhang 2019); ``T`` steps compose to
``T · RDP_λ(q, σ)``, and a history of ``(σ, q, T)`` segments sums. The (ε, δ) guarantee is
``ε = min_λ [RDP_λ + log((λ-1)/λ) - (log δ + log λ)/(λ-1)]`` (Balle et al. 2020), the
conversion of Opacus' :class:`~opacus.accountants.RDPAccountant`, over its default orders:
every ε here is that accountant's, to the last bit, computed by the functions it calls
(``compute_rdp``, ``get_privacy_spent``), with one step's RDP computed once per (σ, q)
instead of once per question.

Sampling convention (Opacus' ``PrivacyEngine.make_private``, which this project uses): a
client with ``N`` examples and batch size ``B`` includes each example in a batch with
probability ``q = 1/⌈N/B⌉`` (≈ B/N) and draws ``int(1/q)`` Poisson batches per epoch, as
Opacus' ``UniformWithReplacementSampler`` counts them: ``⌈N/B⌉``, except where ``1/q``
rounds below it in floating point (``⌈N/B⌉`` = 93, 99, 105, ...: 141 of the first 2,000),
one fewer. With the paper's
histopathology sizes (2338, 2726, 2937, 2841 and pooled 10842; B = 32, σ = 1.4,
δ = 1e-5, 30 epochs) this gives ε = 2.36, 2.17, 2.08, 2.12 and 1.00: Table 2 exactly.

Training reads its ε from its accountant's history through :func:`epsilon_from_history`,
and ``python -m proxyfl.privacy`` feeds the planned history to the same function. Opacus is
imported by the first ε asked for, not with this module: importing it imports torch and
scipy.stats (~4 s of a start on 2 cores), which ``python -m proxyfl.privacy --help``, a
refusal of its input and the schedule's arithmetic never need.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np


@functools.cache
def rdp_orders() -> tuple[float, ...]:
    """The Rényi orders λ the minimum is taken over: Opacus' ``RDPAccountant`` defaults."""
    from opacus.accountants import RDPAccountant

    return tuple(RDPAccountant.DEFAULT_ALPHAS)


# (noise multiplier σ, sample rate q, number of steps)
HistoryEntry = tuple[float, float, int]


def poisson_schedule(n_train: int, batch_size: int) -> tuple[float, int]:
    """``(q, steps_per_epoch) = (1/⌈N/B⌉, int(1/q))``: Opacus' DPDataLoader's rate and
    the batches its sampler draws an epoch (``⌈N/B⌉``, or one fewer where ``1/q`` rounds
    below it)."""
    if n_train < 1 or batch_size < 1:
        raise ValueError(f"need n_train >= 1 and batch_size >= 1, got {n_train}, {batch_size}")
    sample_rate = 1.0 / math.ceil(n_train / batch_size)
    return sample_rate, int(1 / sample_rate)


def planned_history(n_train: int, batch_size: int, sigma: float, epochs: int) -> list[HistoryEntry]:
    """The accountant history of ``epochs`` epochs of DP-SGD on ``n_train`` examples."""
    sample_rate, steps = poisson_schedule(n_train, batch_size)
    return [(float(sigma), sample_rate, steps * epochs)] if epochs > 0 else []


def epsilon_from_history(history: Sequence[HistoryEntry], delta: float) -> float:
    """ε spent by the DP-SGD steps in ``history`` at ``delta``: Opacus'
    :meth:`RDPAccountant.get_epsilon` over that history, to the last bit (0 for no steps,
    inf for σ = 0)."""
    steps = tuple((float(s), float(q), int(t)) for s, q, t in history if int(t) > 0)
    if not steps:
        return 0.0
    if any(sigma <= 0 for sigma, _, _ in steps):
        return math.inf
    return _rdp_epsilon(steps, float(delta))


@functools.lru_cache(maxsize=256)
def _rdp_epsilon(steps: tuple[tuple[float, float, int], ...], delta: float) -> float:
    """What :meth:`RDPAccountant.get_privacy_spent` computes for one history, once (a round
    asks for the same ε for its metrics, its log line and its rank record): the RDP of a
    segment of T steps is T times that of one step, summed over the segments, then
    converted to (ε, δ) by Opacus' ``get_privacy_spent``."""
    from opacus.accountants.analysis import rdp as privacy_analysis

    rdp = sum([_rdp_of_one_step(sigma, q) * t for sigma, q, t in steps])
    epsilon, _ = privacy_analysis.get_privacy_spent(orders=list(rdp_orders()), rdp=rdp,
                                                    delta=delta)  # fmt: skip
    return float(epsilon)


@functools.lru_cache(maxsize=64)
def _rdp_of_one_step(sigma: float, q: float) -> np.ndarray:
    """Opacus' RDP of one sampled Gaussian step at every order: ~0.05 s of series over
    :func:`rdp_orders`, the same for every round of a run, so computed once per (σ, q).
    Opacus' ``compute_rdp(steps=T)`` is this array times T, the same floating-point
    product."""
    from opacus.accountants.analysis import rdp as privacy_analysis

    rdp = privacy_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=1,
                                       orders=list(rdp_orders()))  # fmt: skip
    rdp.flags.writeable = False  # shared by every caller through the cache
    return rdp


def planned_epsilon(
    n_train: int, batch_size: int, sigma: float, epochs: int, delta: float
) -> float:
    """ε after ``epochs`` epochs (rounds × local epochs) on ``n_train`` examples."""
    return epsilon_from_history(planned_history(n_train, batch_size, sigma, epochs), delta)
