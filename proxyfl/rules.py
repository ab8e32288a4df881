"""The rules a training configuration must meet against the data it reads, each stated once.

The ranks check them on the stores they open (:mod:`proxyfl.run`); the launchers check the
same rules before any server or job starts (``camelyon_proxyfl.training_checks``: on the
stores on disk, or on the sizes preprocessing will give). Each returns the reason a
configuration breaks the rule, for its caller to name the key or flag, or ``None``.
"""

from __future__ import annotations

from collections.abc import Sequence

# the methods whose local training draws Poisson batches (DP-SGD); PrivateKT's clients
# train on shuffled mini-batches, a batch larger than a client's data being all of it (as
# the authors' DataLoader gives)
SHUFFLED_BATCHES = ("PrivateKT",)


def batch_size_problem(
    batch_size: int, n_train: int, clients: str, *, exact: bool = True
) -> str | None:
    """Poisson batches of expected size B from N training patches need B ≤ N (beyond it
    the sample rate q = 1/⌈N/B⌉ is 1: every batch the whole set, of N, not the B asked
    for). ``exact``: N is the stores' count, not an upper bound from preprocessing's plan
    (2 × patches_per_class)."""
    if batch_size <= n_train:
        return None
    what = "training patches" if exact else "patches at most (2 × patches_per_class)"
    return f"{batch_size} is larger than the {n_train} {what} of {clients}"


def held_out_count(n_train: int, share: float) -> int:
    """How many of a client's ``n_train`` training patches PrivateKT's share pool holds out
    (``public_pool: share``): ``int(share · n)``, as the authors' ``partition_public_dataset``."""
    return int(share * n_train)


def share_pool_name(share: float, clients: Sequence[int]) -> str:
    """What the share pool is, in the words of the error messages."""
    return f"a share {share:g} of centres {list(clients)}' training splits"


def public_pool_problems(
    kt_samples: int, self_train_samples: int | None, pool_size: int, pool: str
) -> dict[str, str]:
    """PrivateKT labels K public items a round and self-trains on M: both at most the
    pool's size. The reason for each option (``kt_samples``, ``self_train_samples``) that
    asks for more; ``pool`` says what the pool is."""
    asked = {"kt_samples": kt_samples, "self_train_samples": self_train_samples}
    return {
        key: f"{value} is larger than the {pool_size} items of the public pool ({pool})"
        for key, value in asked.items()
        if value is not None and value > pool_size
    }
