"""The digits stores of ``bench privatekt`` (bench/digits.py): a Dirichlet partition that
places every training item once, and stores that the training reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.digits import N_CLASSES, PATCH, dirichlet_partition, write_digit_stores
from wsi.store.reader import PatchSplitReader, read_store_info
from wsi.store.schema import store_path


def test_the_partition_places_every_item_once_and_small_alpha_skews_the_clients() -> None:
    labels = np.repeat(np.arange(10), 100)
    rng = np.random.default_rng(0)
    parts = dirichlet_partition(labels, 4, 0.5, rng)
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
    shares = np.array([np.bincount(labels[p], minlength=10) / max(1, len(p)) for p in parts])
    even = dirichlet_partition(labels, 4, 1000.0, np.random.default_rng(0))
    even_shares = np.array([np.bincount(labels[p], minlength=10) / len(p) for p in even])
    # α = 0.5: each client's label mix is far from uniform; α = 1000: close to it
    assert np.abs(shares - 0.1).max() > 0.2 and np.abs(even_shares - 0.1).max() < 0.05


def test_the_stores_hold_all_digits_and_the_test_set_is_shared_evenly(tmp_path: Path) -> None:
    counts = write_digit_stores(tmp_path, clients=4, alpha=0.5, seed=1)
    total = sum(sum(c["train"]) + sum(c["test"]) for c in counts.values())
    assert total == 1797  # scikit-learn's digits, each once
    tests = [sum(c["test"]) for c in counts.values()]
    assert max(tests) - min(tests) <= 1
    for center in range(4):
        info = read_store_info(store_path(tmp_path, center))
        assert (info.attrs.patch_size, info.attrs.n_classes) == (PATCH, N_CLASSES)
        reader = PatchSplitReader(store_path(tmp_path, center), "train")
        images = reader.images(slice(0, len(reader)))
        assert images.shape[1:] == (PATCH, PATCH, 3) and images.max() > 200
        assert np.bincount(reader.labels, minlength=10).tolist() == counts[center]["train"]


def test_the_port_of_the_authors_code_reads_the_runs_inputs_and_learns(tmp_path: Path) -> None:
    """bench/privatekt_port.py, the yardstick of our PrivateKT: each client trains on its
    training split less the rows our runs hold out as the pool (the same rows), the pool is
    those rows, the test set every client's; 15 rounds lift Θ from chance, a no-op step
    does not."""
    from bench.privatekt_port import PortSettings, load_inputs, port_curves
    from proxyfl.algorithms.privatekt.public_pool import held_out_rows

    counts = write_digit_stores(tmp_path, clients=4, alpha=0.5, seed=0)
    data = load_inputs(tmp_path, clients=4, seed=0, public_share=0.2)
    for center, (images, labels) in enumerate(data.clients):
        n = sum(counts[center]["train"])
        held = held_out_rows(n, 0.2, 0, center)
        assert len(images) == len(labels) == n - len(held) > 0
        kept_counts = np.bincount(labels.numpy(), minlength=N_CLASSES)
        reader = PatchSplitReader(store_path(tmp_path, center), "train")
        held_counts = np.bincount(reader.labels[held], minlength=N_CLASSES)
        assert (kept_counts + held_counts).tolist() == counts[center]["train"]
    n_train = [sum(c["train"]) for c in counts.values()]
    assert len(data.pool) == sum(int(0.2 * n) for n in n_train)
    assert len(data.test[1]) == sum(sum(c["test"]) for c in counts.values())
    learnt = port_curves(tmp_path, 4, [0], 15)[0]
    frozen = port_curves(tmp_path, 4, [0], 15, PortSettings(lr=1e-9))[0]
    assert np.mean(learnt[-5:]) > 0.2 and np.mean(learnt[-5:]) > np.mean(learnt[:3]) + 0.05
    assert max(frozen) - min(frozen) < 0.01 and np.mean(learnt[-5:]) > max(frozen) + 0.1
