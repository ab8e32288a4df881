"""scikit-learn's handwritten digits as patch stores, split across clients as PrivateKT's
authors split their data: a non-IID Dirichlet partition of the training data.

The 1,797 8×8 digits (10 classes, grey levels 0–16; bundled with scikit-learn, nothing to
download) become 16×16 RGB uint8 patches (each pixel doubled, grey copied to the three
channels, scaled to 0–255). A random ``test_share`` of them is the test set, spread
uniformly over the clients' test splits, so that the clients' merged test splits (what
every client is evaluated on) are the whole test set. The rest is the training data: for
each class, the shares of the clients are drawn from Dirichlet(α) (α = 0.5 as the
authors' ``local_data_partition``), so each client sees a few classes mostly.

    python -m bench.digits OUT [--clients 4] [--alpha 0.5] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from wsi.store.schema import PatchBatch, StoreAttrs, store_path
from wsi.store.writer import write_patch_store

PATCH = 16
N_CLASSES = 10


def digit_images() -> tuple[np.ndarray, np.ndarray]:
    """The digits as uint8 (N, 16, 16, 3) patches and int64 (N,) labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    grey = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # (N, 8, 8)
    large = grey.repeat(2, axis=1).repeat(2, axis=2)
    return np.repeat(large[..., None], 3, axis=-1), digits.target.astype(np.int64)


def dirichlet_partition(
    labels: np.ndarray, clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Each class's items shared among ``clients`` in proportions drawn from
    Dirichlet(α, …, α): small α, few classes per client. Returns each client's sorted
    item indices (every item exactly once)."""
    parts: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for label in np.unique(labels):
        items = rng.permutation(np.flatnonzero(labels == label))
        shares = rng.dirichlet([alpha] * clients)
        cuts = np.round(np.cumsum(shares)[:-1] * len(items)).astype(int)
        for client, chunk in enumerate(np.split(items, cuts)):
            parts[client].append(chunk)
    return [np.sort(np.concatenate(chunks)) for chunks in parts]


def _batch(images: np.ndarray, labels: np.ndarray, items: np.ndarray, center: int,
           split: str) -> PatchBatch:  # fmt: skip
    names = [f"digit_{center}{split[0]}{int(i):04d}" for i in items]
    coords = np.stack([items, np.zeros_like(items)], axis=1).astype(np.int64)
    return PatchBatch(images=images[items], labels=labels[items], patients=names,
                      slides=names, coords=coords)  # fmt: skip


def write_digit_stores(
    directory: Path, clients: int = 4, alpha: float = 0.5, test_share: float = 0.2,
    seed: int = 0,
) -> dict[int, dict[str, list[int]]]:  # fmt: skip
    """``center_{c}.h5`` for c = 0..clients-1; returns each store's label counts."""
    images, labels = digit_images()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    n_test = int(test_share * len(labels))
    test, train = order[:n_test], order[n_test:]
    test_parts = np.array_split(np.sort(test), clients)
    train_parts = [train[part] for part in dirichlet_partition(labels[train], clients, alpha, rng)]
    directory.mkdir(parents=True, exist_ok=True)
    counts = {}
    for center in range(clients):
        attrs = StoreAttrs(center=center, patch_size=PATCH, level=0, mpp=1.0,
                           n_classes=N_CLASSES, params_hash=f"digits-a{alpha}-s{seed}")  # fmt: skip
        splits = {
            "train": _batch(images, labels, np.sort(train_parts[center]), center, "train"),
            "test": _batch(images, labels, test_parts[center], center, "test"),
        }
        write_patch_store(store_path(directory, center), attrs, splits)
        counts[center] = {name: np.bincount(batch.labels, minlength=N_CLASSES).tolist()
                          for name, batch in splits.items()}  # fmt: skip
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.digits", description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for center, count in write_digit_stores(args.out, args.clients, args.alpha,
                                            seed=args.seed).items():  # fmt: skip
        print(f"centre {center}: train {count['train']} test {count['test']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
