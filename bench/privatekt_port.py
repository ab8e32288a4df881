"""The authors' PrivateKT as one process: a port of their code (taoqi98/PrivateKT,
``Code/PrivateKT.py`` run by ``Code/main.ipynb``), on the stores and the model our runs use,
so that the project's PrivateKT (``proxyfl.algorithms.privatekt``: ranks, messages, its own
RNG streams) can be held against it on identical inputs. Nothing here is imported from the
project's PrivateKT: the sampling, the randomized response, the aggregation and the buffer
are written again, as the authors wrote them.

One global model Θ; each round (the authors' function ``PrivateKT``):

1. K pool items drawn without replacement with p ∝ exp(H), H the entropy of Θ's softmax
   on every pool item (``importance_sampling``; ``1e-8`` inside the log);
2. ``int(0.5 · C)`` of the C clients drawn (a permutation's first);
3. each drawn client, from Θ: ``local_epochs`` (5) epochs of plain SGD (lr 0.05, batches of
   32 reshuffled every epoch, the last one partial: Keras's ``fit``) with cross-entropy on
   its own training rows; its argmax label of each KT item; randomized response (kept with
   probability β = (e^{ε/K} − 1)/(e^{ε/K} − 1 + C), else a class drawn uniformly from all
   C); Θ restored;
4. the aggregate ``(mean one-hot − (1 − β)/C)/β``, its argmax as a one-hot label, pushed
   into a FIFO buffer of the last ``buffer_rounds`` (25) rounds;
5. Θ fine-tuned by ``finetune_steps`` (4) full-batch SGD steps on the whole buffer
   (``train_on_batch``);
6. self-training: Θ's softmax on the whole pool; ``int(0.1 · N)`` items drawn without
   replacement with p ∝ exp(−H); one epoch of batches of 32 towards those probabilities
   (soft cross-entropy, as Keras's ``fit`` on them).

Θ's accuracy on the clients' merged test splits is recorded after every round. The inputs
are ours: each client's training split without its held-out public rows
(:func:`proxyfl.algorithms.privatekt.public_pool.held_out_rows` of the seed), the pool those
rows, images scaled to [−1, 1] (:func:`proxyfl.engine.data.prepare_images`), the model
``build_model(model)`` initialised as our runs initialise Θ_1 (``derived_seed(seed,
"shared-init")``): the same first model, the port's own draws after it.

    python -m bench.privatekt_port STORES [--clients 4] [--seeds 0 1 2] [--rounds 30]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from proxyfl.algorithms.privatekt.public_pool import held_out_rows, kept_rows
from proxyfl.engine.data import prepare_images
from proxyfl.engine.models import build_model
from proxyfl.engine.runtime import derived_seed
from wsi.store.reader import PatchSplitReader
from wsi.store.schema import store_path

N_CLASSES = 10


@dataclass(frozen=True)
class PortSettings:
    """The authors' hyper-parameters (``main.ipynb`` and ``PrivateKT``'s defaults)."""

    epsilon: float = 5.0
    kt_samples: int = 2  # K
    buffer_rounds: int = 25  # B
    lr: float = 0.05
    batch_size: int = 32  # Keras's fit
    local_epochs: int = 5  # epoch1
    finetune_steps: int = 4  # epoch2
    self_train_share: float = 0.1
    client_share: float = 0.5
    public_share: float = 0.2
    model: str = "mlp"

    @property
    def beta(self) -> float:
        grown = math.exp(self.epsilon / self.kt_samples) - 1.0
        return grown / (grown + N_CLASSES)


@dataclass(frozen=True)
class PortData:
    """One seed's inputs: each client's training images and labels, the pool, the test set
    (images as float tensors, labels as int64 tensors)."""

    clients: list[tuple[torch.Tensor, torch.Tensor]]
    pool: torch.Tensor
    test: tuple[torch.Tensor, torch.Tensor]


def _images(reader: PatchSplitReader, rows: np.ndarray | None = None) -> torch.Tensor:
    block = reader.images(None if rows is None else rows)
    return prepare_images(torch.from_numpy(block.transpose(0, 3, 1, 2).copy()),
                          torch.device("cpu"))  # fmt: skip


def load_inputs(stores: Path, clients: int, seed: int, public_share: float) -> PortData:
    """The stores' splits as our PrivateKT runs read them with ``public_pool: share``."""
    trains, pools, test_images, test_labels = [], [], [], []
    for center in range(clients):
        train = PatchSplitReader(store_path(stores, center), "train")
        held = held_out_rows(len(train), public_share, seed, center)
        kept = kept_rows(len(train), held)
        trains.append((_images(train, kept), torch.from_numpy(train.labels[kept].astype(np.int64))))
        pools.append(_images(train, held))
        test = PatchSplitReader(store_path(stores, center), "test")
        test_images.append(_images(test))
        test_labels.append(torch.from_numpy(test.labels.astype(np.int64)))
        train.close()
        test.close()
    return PortData(trains, torch.cat(pools), (torch.cat(test_images), torch.cat(test_labels)))


def _probabilities(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return F.softmax(model(images), dim=1)


def _entropy(probabilities: torch.Tensor) -> np.ndarray:
    p = probabilities.double().numpy()
    return (-p * np.log(p + 1e-8)).sum(axis=1)


def _draw(weights: np.ndarray, count: int, rng: np.random.RandomState) -> np.ndarray:
    """``count`` items without replacement with p ∝ exp(weights) (``np.random.choice``)."""
    p = np.exp(weights)
    return rng.choice(len(weights), count, replace=False, p=p / p.sum())


def _fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, settings: PortSettings,
         epochs: int, generator: torch.Generator) -> None:  # fmt: skip
    """Keras's ``fit``: ``epochs`` passes of shuffled batches; ``y`` class indices or
    probabilities (soft targets)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=settings.lr)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), settings.batch_size):
            batch = order[start : start + settings.batch_size]
            optimizer.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()


def _randomized_response(labels: np.ndarray, beta: float, rng: np.random.RandomState) -> np.ndarray:
    """The authors' ``LDP``: one-hot labels kept with probability β, else a uniform class's."""
    keep = rng.uniform(0, 1, len(labels)) < beta
    noise = rng.randint(0, N_CLASSES, len(labels))
    return np.eye(N_CLASSES)[np.where(keep, labels, noise)]


def train_port(data: PortData, seed: int, rounds: int, settings: PortSettings) -> list[float]:
    """The accuracy of Θ on the test set after each of ``rounds`` rounds."""
    rng = np.random.RandomState(seed)
    torch.manual_seed(derived_seed(seed, "shared-init"))  # Θ_1: our runs' first model
    model = build_model(settings.model, N_CLASSES, data.pool.shape[-1])
    generator = torch.Generator().manual_seed(seed)
    beta = settings.beta
    buffer: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=settings.buffer_rounds)
    accuracies = []
    for _ in range(rounds):
        items = _draw(_entropy(_probabilities(model, data.pool)), settings.kt_samples, rng)
        drawn = rng.permutation(len(data.clients))[: int(len(data.clients) * settings.client_share)]
        start = {name: value.clone() for name, value in model.state_dict().items()}
        uploads = []
        for client in drawn:
            x, y = data.clients[client]
            _fit(model, x, y, settings, settings.local_epochs, generator)
            labels = _probabilities(model, data.pool[items]).argmax(dim=1).numpy()
            uploads.append(_randomized_response(labels, beta, rng))
            model.load_state_dict(start)
        estimate = (np.mean(uploads, axis=0) - (1.0 - beta) / N_CLASSES) / beta
        buffer.append((items, estimate.argmax(axis=1)))
        kt_items = np.concatenate([entry[0] for entry in buffer])
        kt_labels = torch.from_numpy(np.concatenate([entry[1] for entry in buffer]))
        optimizer = torch.optim.SGD(model.parameters(), lr=settings.lr)
        model.train()
        for _ in range(settings.finetune_steps):
            optimizer.zero_grad()
            F.cross_entropy(model(data.pool[kt_items]), kt_labels).backward()
            optimizer.step()
        probabilities = _probabilities(model, data.pool)
        chosen = _draw(-_entropy(probabilities), int(len(data.pool) * settings.self_train_share),
                       rng)  # fmt: skip
        _fit(model, data.pool[chosen], probabilities[chosen], settings, 1, generator)
        test_x, test_y = data.test
        predicted = _probabilities(model, test_x).argmax(dim=1)
        accuracies.append(float((predicted == test_y).double().mean()))
    return accuracies


def port_curves(stores: Path, clients: int, seeds: Sequence[int], rounds: int,
                settings: PortSettings = PortSettings()) -> list[list[float]]:  # fmt: skip
    """Each seed's accuracy after every round, on one CPU thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [train_port(load_inputs(stores, clients, seed, settings.public_share), seed,
                           rounds, settings) for seed in seeds]  # fmt: skip
    finally:
        torch.set_num_threads(threads)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.privatekt_port", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("stores", type=Path, help="a folder of center_{c}.h5 (bench.digits)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--model", default="mlp")
    args = parser.parse_args(argv)
    settings = PortSettings(model=args.model)
    curves = port_curves(args.stores, args.clients, args.seeds, args.rounds, settings)
    finals = np.array([curve[-1] for curve in curves])
    print(f"authors' PrivateKT, ported: {args.clients} clients, {args.rounds} rounds, seeds "
          f"{args.seeds}: {' '.join(f'{v:.3f}' for v in finals)}; "
          f"{finals.mean():.3f} ± {finals.std():.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
