"""How well scores separate members from non-members: AUC, TPR at low FPR, intervals.

With members' scores ``s⁺`` and non-members' ``s⁻`` (higher: "member"), the attack that
guesses "member" when ``s ≥ t`` has, over thresholds t, the ROC curve
``(FPR(t), TPR(t)) = (P[s⁻ ≥ t], P[s⁺ ≥ t])``. Reported, as Carlini et al. (2022) ask:

- ``auc``: the area under it, ``P[s⁺ > s⁻] + ½ P[s⁺ = s⁻]`` (0.5: no better than chance);
- ``tpr_at_1pct_fpr``, ``tpr_at_0_1pct_fpr``: the highest TPR of a threshold whose FPR is
  at most 1 % (0.1 %). With n non-members the FPRs that exist are multiples of 1/n, so
  below 1/n only thresholds above every non-member count: with fewer than 1,000
  non-members, "0.1 % FPR" means FPR = 0;
- each with a 95 % percentile-bootstrap interval: members and non-members resampled with
  replacement, separately, ``bootstrap`` times from a seeded generator. A resample is a
  vector of counts (multinomial) over the original scores, so all of them are computed at
  once (:func:`resampled_metrics`): the AUC of counts ``w`` (members) and ``u``
  (non-members) is ``wᵀ K u / (n⁺ n⁻)`` with ``K[i, j] = [s⁺ᵢ > s⁻ⱼ] + ½ [s⁺ᵢ = s⁻ⱼ]``.

Computed directly, for the thousand bootstrap resamples of every model: the AUC as the
Mann–Whitney statistic from average ranks; TPR at FPR ≤ x as the share of members above
the (⌊x·n⌋+1)-th highest non-member score (the tests check both against scikit-learn's
``roc_auc_score`` and ``roc_curve``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LOW_FPRS = (0.01, 0.001)
CONFIDENCE = 0.95
ROC_POINTS = 101  # FPRs at which the report draws the curve


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


@dataclass(frozen=True)
class MembershipResult:
    """How one attack's scores separate one model's members from its non-members."""

    auc: float
    tpr_at_1pct_fpr: float
    tpr_at_0_1pct_fpr: float
    auc_interval: Interval
    tpr_at_1pct_fpr_interval: Interval
    tpr_at_0_1pct_fpr_interval: Interval
    n_members: int
    n_non_members: int
    roc_fpr: tuple[float, ...]  # the curve on a log grid of FPRs, for the report's plot
    roc_tpr: tuple[float, ...]


def auc(member_scores: np.ndarray, non_member_scores: np.ndarray) -> float:
    """``P[s⁺ > s⁻] + ½ P[s⁺ = s⁻]``, from the members' average ranks."""
    from scipy.stats import rankdata  # when scored: scipy.stats is ~1 s of a command's start

    n_members, n_non_members = len(member_scores), len(non_member_scores)
    ranks = rankdata(np.r_[member_scores, non_member_scores])
    rank_sum = ranks[:n_members].sum()
    return float((rank_sum - n_members * (n_members + 1) / 2) / (n_members * n_non_members))


def tpr_at_fpr(member_scores: np.ndarray, non_member_scores: np.ndarray, fpr: float) -> float:
    """The highest TPR among thresholds whose FPR is at most ``fpr``: the share of members
    scoring above the (⌊fpr·n⌋+1)-th highest of the n non-members' scores."""
    allowed = int(np.floor(fpr * len(non_member_scores) + 1e-9))
    if allowed >= len(non_member_scores):
        return 1.0
    threshold = np.sort(non_member_scores)[::-1][allowed]
    return float(np.mean(member_scores > threshold))


def _metrics(member_scores: np.ndarray, non_member_scores: np.ndarray) -> np.ndarray:
    return np.array(
        [auc(member_scores, non_member_scores),
         *(tpr_at_fpr(member_scores, non_member_scores, level) for level in LOW_FPRS)],
        dtype=np.float64,
    )  # fmt: skip


def resampled_metrics(
    members: np.ndarray,
    non_members: np.ndarray,
    member_counts: np.ndarray,
    non_member_counts: np.ndarray,
) -> np.ndarray:
    """(B, 3): AUC, TPR at 1 % and at 0.1 % FPR of each of B resamples, resample b taking
    score i ``member_counts[b, i]`` times (each row sums to n⁺) and likewise for the
    non-members: the same numbers as :func:`auc` and :func:`tpr_at_fpr` on the repeated
    scores."""
    n_members, n_non_members = len(members), len(non_members)
    kernel = (members[:, None] > non_members[None, :]) + 0.5 * (
        members[:, None] == non_members[None, :]
    )
    weights_m = member_counts.astype(np.float64)
    weights_n = non_member_counts.astype(np.float64)
    # wᵀ K u as a matrix product (BLAS), not a three-operand einsum (a plain loop, ~20× slower):
    # every term is a multiple of ½ and every sum at most n⁺ n⁻ (< 2⁵³), so both are exact
    # and give the same bits whatever the order of summation
    aucs = ((weights_m @ kernel) * weights_n).sum(axis=1) / (n_members * n_non_members)
    # the (⌊x·n⌋+1)-th highest non-member score of each resample, then the members above it
    order = np.argsort(-non_members, kind="stable")
    descending = non_members[order]
    cumulative = np.cumsum(non_member_counts[:, order], axis=1)
    member_order = np.argsort(members, kind="stable")
    ascending = members[member_order]
    cumulative_m = np.cumsum(member_counts[:, member_order], axis=1)
    columns = [aucs]
    for level in LOW_FPRS:
        allowed = int(np.floor(level * n_non_members + 1e-9))
        position = np.argmax(cumulative > allowed, axis=1)
        threshold = descending[position]
        at_or_below = np.searchsorted(ascending, threshold, side="right")  # members <= thr
        below = np.where(at_or_below > 0,
                         cumulative_m[np.arange(len(threshold)), np.maximum(at_or_below - 1, 0)],
                         0)  # fmt: skip
        columns.append((n_members - below) / n_members)
    return np.stack(columns, axis=1)


def membership_result(
    member_scores: np.ndarray,
    non_member_scores: np.ndarray,
    *,
    bootstrap: int,
    seed: int,
) -> MembershipResult:
    """AUC and TPR at 1 % and 0.1 % FPR of ``member_scores`` against
    ``non_member_scores``, with 95 % bootstrap intervals (``bootstrap`` resamples)."""
    members = np.asarray(member_scores, dtype=np.float64)
    non_members = np.asarray(non_member_scores, dtype=np.float64)
    if len(members) == 0 or len(non_members) == 0:
        raise ValueError(f"membership inference needs members and non-members; got "
                         f"{len(members)} and {len(non_members)}")  # fmt: skip
    if not (np.isfinite(members).all() and np.isfinite(non_members).all()):
        raise ValueError("membership scores must be finite")
    point = _metrics(members, non_members)
    generator = np.random.default_rng(seed)
    uniform_m = np.full(len(members), 1 / len(members))
    uniform_n = np.full(len(non_members), 1 / len(non_members))
    resampled = np.zeros((0, len(point)))
    for start in range(0, bootstrap, 250):  # bounded memory: 250 resamples at a time
        size = min(250, bootstrap - start)
        resampled = np.r_[resampled, resampled_metrics(
            members, non_members,
            generator.multinomial(len(members), uniform_m, size=size),
            generator.multinomial(len(non_members), uniform_n, size=size),
        )]  # fmt: skip
    tail = (1 - CONFIDENCE) / 2 * 100
    if bootstrap:
        lows, highs = np.percentile(resampled, [tail, 100 - tail], axis=0)
    else:
        lows, highs = point, point
    intervals = [Interval(float(lo), float(hi)) for lo, hi in zip(lows, highs, strict=True)]
    grid = np.r_[0.0, np.geomspace(1e-3, 1.0, ROC_POINTS - 1)]
    grid_tpr = [tpr_at_fpr(members, non_members, level) for level in grid]
    return MembershipResult(
        auc=float(point[0]),
        tpr_at_1pct_fpr=float(point[1]),
        tpr_at_0_1pct_fpr=float(point[2]),
        auc_interval=intervals[0],
        tpr_at_1pct_fpr_interval=intervals[1],
        tpr_at_0_1pct_fpr_interval=intervals[2],
        n_members=len(members),
        n_non_members=len(non_members),
        roc_fpr=tuple(float(x) for x in grid),
        roc_tpr=tuple(grid_tpr),
    )
