"""PrivateKT (Qi et al., Nature Communications 2023, Algorithm 1) as an exchange of the one loop.

Roles: rank 0 is the server and also a client (as in FedAvg); every rank is a client.
Round t (Algorithm 1, lines 5–19), in the loop's three steps (:mod:`proxyfl.trainer`):

1. ``distribute`` (line 5–6): the server draws the round's clients G_t (a share
   ``--client-fraction`` of the active ones) and broadcasts G_t and the indices of the K
   knowledge-transfer (KT) items D_d^t of the public pool; in round 1 it also broadcasts
   the global model Θ_1 it initialised (later, every client already holds Θ_t from the
   previous round's broadcast). Clients outside G_t do not train.
2. local training (line 8): each selected client trains Θ_t on its own training split,
   without DP (:mod:`proxyfl.engine.local_training`).
3. ``exchange`` (lines 10–19): each selected client labels the K KT items with its locally
   trained model (argmax, a one-hot label), perturbs the labels by randomized response
   with β from Lemma 1 (Eq. 2; :mod:`proxyfl.privacy.ldp`) and sends the server exactly those K
   int64 labels. The server forms the unbiased estimate of the clients' mean prediction
   (Eq. 3), pushes it into the FIFO knowledge buffer of B rounds, fine-tunes Θ_t on the
   buffer (targets: each item's class of largest estimate) giving Θ'_t, self-trains Θ'_t
   on M public items drawn with weights ∝ exp(−entropy) under Θ'_t (Eq. 5), labelled by
   its own predictions, giving Θ_{t+1}, and draws the next K KT items with weights
   ∝ exp(entropy) under Θ_{t+1} (Eq. 4). It broadcasts Θ_{t+1}, which every client then
   holds and evaluates.

The first KT items (line 3) are drawn by Eq. (4) under Θ_1, as the authors' code draws
them (``--first-kt-items uniform``: uniformly, as Algorithm 1 says). The clients and the
server train with their own optimizer (``--kt-optimizer``, ``--kt-lr``: the authors' plain
SGD at 0.05), started afresh each round; each pass of the server's fine-tuning over the
buffer is one full-batch step (``--finetune-batches``). Ablations (the paper's Fig. 3):
``--no-buffer`` keeps one round of knowledge, ``--no-self-training`` skips step 18,
``--uniform-sampling`` draws every round's KT items uniformly.

Public items cross ranks as indices into the public pool (every rank opens the public
store's images, :mod:`~proxyfl.algorithms.privatekt.public_pool`); a client's only upload
is its K labels.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from proxyfl.algorithms.privatekt.knowledge import (
    KnowledgeBuffer,
    kt_weights,
    self_training_weights,
    weighted_sample,
)
from proxyfl.algorithms.privatekt.public_pool import PublicPool
from proxyfl.algorithms.strategies import Distribution
from proxyfl.comm.exchange import SERVER_RANK, Communicator, flatten_parameters
from proxyfl.config import TrainConfig
from proxyfl.engine.data import prepare_images
from proxyfl.engine.models import build_model
from proxyfl.engine.runtime import derived_seed
from proxyfl.engine.timings import Timings
from proxyfl.privacy.ldp import LDPLedger, keep_probability, randomized_response
from proxyfl.privacy.ldp import unbiased_estimate as estimate_mean_prediction

logger = logging.getLogger(__name__)

SELF_TRAIN_SHARE = 0.1  # the authors' code self-trains on a tenth of the public pool


@dataclass(frozen=True)
class KTSettings:
    """PrivateKT's hyper-parameters (Algorithm 1, line 1: ε, K, β, B, M)."""

    kt_samples: int  # K
    ldp_epsilon: float  # ε of one round (label-level ε-LDP, Lemma 1)
    n_classes: int  # C
    buffer_size: int  # B (1 with --no-buffer)
    self_train_samples: int  # M (0 with --no-self-training)
    soft_self_training: bool  # targets: the model's probabilities, else its argmax
    finetune_epochs: int
    finetune_full_batch: bool  # one step per pass over the buffer (the authors')
    client_fraction: float
    uniform_sampling: bool
    uniform_first_items: bool  # Algorithm 1's line 3 (the authors' code: Eq. 4 under Θ_1)
    fresh_optimizer: bool  # no optimizer state carried from one round to the next
    batch_size: int
    eval_batch_size: int

    @property
    def beta(self) -> float:
        """β of Lemma 1: ``(e^{ε/K} − 1)/(e^{ε/K} − 1 + C)``."""
        return keep_probability(self.ldp_epsilon, self.kt_samples, self.n_classes)

    @classmethod
    def from_config(cls, config: TrainConfig, n_classes: int, pool_size: int) -> KTSettings:
        if config.self_train_samples is not None:
            m = config.self_train_samples
        else:
            m = max(1, math.ceil(SELF_TRAIN_SHARE * pool_size))
        return cls(
            kt_samples=config.kt_samples,
            ldp_epsilon=config.ldp_epsilon,
            n_classes=n_classes,
            buffer_size=config.buffer_size if config.buffer else 1,
            self_train_samples=m if config.self_training else 0,
            soft_self_training=config.self_train_targets == "soft",
            finetune_epochs=config.finetune_epochs,
            finetune_full_batch=config.finetune_batches == "full",
            client_fraction=config.client_fraction,
            uniform_sampling=config.uniform_sampling,
            uniform_first_items=config.uniform_sampling or config.first_kt_items == "uniform",
            fresh_optimizer=config.kt_optimizer_state == "fresh",
            batch_size=config.batch_size,
            eval_batch_size=config.eval_batch_size,
        )


def selection_size(fraction: float, available: int) -> int:
    """How many of ``available`` clients a round selects: ``int(fraction · n)`` as the
    authors' code (``sampled_user_ratio``), but at least one."""
    if available <= 0:
        return 0
    return min(available, max(1, int(fraction * available)))


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """PrivateKT's optimizer of ``model`` (clients and server alike): ``--kt-optimizer``
    at ``--kt-lr``, without weight decay (the authors' Keras SGD has none)."""
    if config.kt_optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=config.kt_lr)
    return torch.optim.Adam(model.parameters(), lr=config.kt_lr)


def forget_state(optimizer: torch.optim.Optimizer) -> None:
    """Drop ``optimizer``'s per-parameter state (Adam's moments, SGD's momentum): the next
    step starts as the first did."""
    optimizer.state.clear()


class PublicItems:
    """A model's work on public items: class probabilities, and training on given labels."""

    def __init__(self, pool: PublicPool, device: torch.device, input_size: int) -> None:
        self.pool, self.device, self.input_size = pool, device, input_size

    def _input(self, indices: np.ndarray) -> torch.Tensor:
        images = torch.from_numpy(
            np.ascontiguousarray(self.pool.images(indices).transpose(0, 3, 1, 2))
        )
        return prepare_images(images, self.device, self.input_size)

    @torch.no_grad()
    def probabilities(
        self, model: nn.Module, indices: np.ndarray | None, batch_size: int
    ) -> np.ndarray:
        """Softmax outputs (n, C) of ``model`` (eval mode) on ``indices`` (all items: None)."""
        order = np.arange(len(self.pool)) if indices is None else np.asarray(indices, np.int64)
        mode = model.training
        model.eval()
        try:
            parts = [
                F.softmax(model(self._input(order[start : start + batch_size])), dim=-1)
                .double().cpu().numpy()
                for start in range(0, len(order), batch_size)
            ]  # fmt: skip
        finally:
            model.train(mode)
        return np.concatenate(parts) if parts else np.empty((0, 0))

    def fit(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        indices: np.ndarray,
        labels: np.ndarray,
        *,
        epochs: int,
        batch_size: int | None,
        rng: np.random.Generator,
    ) -> float | None:
        """Cross-entropy steps on (item, target) pairs, shuffled by ``rng``; mean loss.
        A target is a class index (``labels`` of shape (n,)) or class probabilities
        (shape (n, C)): −Σ_c q_c log p_c either way. ``batch_size=None``: every item in
        one step per epoch."""
        model.train()
        batch_size = batch_size or max(1, len(indices))
        total, steps = 0.0, 0
        for _ in range(epochs):
            order = rng.permutation(len(indices))
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                x = self._input(indices[batch])
                y = torch.as_tensor(labels[batch], device=self.device)
                y = y.to(torch.int64) if y.ndim == 1 else y.to(torch.float32)
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                total += float(loss.detach())
                steps += 1
        return total / steps if steps else None


class KnowledgeServer:
    """The server's state and update (Algorithm 1, lines 2–3 and 16–19), on rank 0 only.
    Where its time goes is added to ``timings`` (fine-tuning, self-training, sampling)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        items: PublicItems,
        settings: KTSettings,
        rng: np.random.Generator,
        timings: Timings | None = None,
    ) -> None:
        self.model, self.optimizer, self.items = model, optimizer, items
        self.settings, self.rng = settings, rng
        self.timings = timings if timings is not None else Timings()
        self.buffer = KnowledgeBuffer(settings.buffer_size)
        # line 3: the first K KT items, under Θ_1 (or uniformly)
        self.kt_items = self.next_items(uniform=settings.uniform_first_items)

    def select_clients(self, members: list[int]) -> list[int]:
        """Line 6: G_t, a uniformly drawn share ``client_fraction`` of ``members``."""
        size = selection_size(self.settings.client_fraction, len(members))
        if size == len(members):
            return list(members)
        chosen = self.rng.choice(len(members), size=size, replace=False)
        return sorted(members[int(i)] for i in chosen)

    def update(self, reports: np.ndarray) -> dict[str, float | None]:
        """Lines 16–19 from the (|G|, K) perturbed labels of this round's KT items."""
        s = self.settings
        started = time.perf_counter()
        if s.fresh_optimizer:
            forget_state(self.optimizer)
        estimate = estimate_mean_prediction(reports, s.beta, s.n_classes)  # Eq. 3
        self.buffer.push(self.kt_items, estimate)  # line 16
        items, targets = self.buffer.targets()
        finetune_loss = self.items.fit(  # line 17: Θ_t → Θ'_t
            self.model, self.optimizer, items, targets, epochs=s.finetune_epochs,
            batch_size=None if s.finetune_full_batch else s.batch_size, rng=self.rng,
        )  # fmt: skip
        self.timings.server_finetune_seconds += time.perf_counter() - started
        self_train_loss = None
        if s.self_train_samples > 0:  # line 18: Θ'_t → Θ_{t+1} (Eq. 5)
            started = time.perf_counter()
            probabilities = self.items.probabilities(self.model, None, s.eval_batch_size)
            chosen = weighted_sample(
                self_training_weights(probabilities), s.self_train_samples, self.rng
            )
            own = probabilities[chosen]
            pseudo_targets = own if s.soft_self_training else own.argmax(axis=-1)
            self_train_loss = self.items.fit(
                self.model, self.optimizer, chosen, pseudo_targets,
                epochs=1, batch_size=s.batch_size, rng=self.rng,
            )  # fmt: skip
            self.timings.server_self_train_seconds += time.perf_counter() - started
        self.kt_items = self.next_items(uniform=s.uniform_sampling)  # line 19
        return {"finetune_loss": finetune_loss, "self_train_loss": self_train_loss}

    def next_items(self, *, uniform: bool) -> np.ndarray:
        """Line 19: the next K KT items, by Eq. (4) under the server's model (or uniformly)."""
        s = self.settings
        if uniform:
            return weighted_sample(None, s.kt_samples, self.rng, n=len(self.items.pool))
        started = time.perf_counter()
        probabilities = self.items.probabilities(self.model, None, s.eval_batch_size)
        chosen = weighted_sample(kt_weights(probabilities), s.kt_samples, self.rng)
        self.timings.server_sampling_seconds += time.perf_counter() - started
        return chosen

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "buffer": self.buffer.state_dict(),
            "kt_items": self.kt_items.copy(),
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"])
        self.kt_items = np.asarray(state["kt_items"], dtype=np.int64)
        self.rng.bit_generator.state = state["rng"]


class PrivateKTExchange:
    """One rank's part of PrivateKT: the client role on every rank, the server's on rank 0."""

    def __init__(
        self,
        client_model: nn.Module,
        items: PublicItems,
        settings: KTSettings,
        ledger: LDPLedger,
        rr_rng: np.random.Generator,
        server: KnowledgeServer | None,
        timings: Timings | None = None,
    ) -> None:
        self.client_model, self.items, self.settings = client_model, items, settings
        self.ledger, self.rr_rng, self.server = ledger, rr_rng, server
        self.timings = timings if timings is not None else Timings()
        self.kt_items = np.zeros(settings.kt_samples, dtype=np.int64)
        self.selected: list[int] = []
        self.last_losses: dict[str, float | None] = {}

    def device_holders(self) -> list[nn.Module | torch.optim.Optimizer]:
        """The server's model and optimiser, on the rank that serves."""
        return [] if self.server is None else [self.server.model, self.server.optimizer]

    def distribute(
        self, comm: Communicator, theta: np.ndarray, members: list[int], round_number: int
    ) -> Distribution:
        """Lines 5–6: G_t and D_d^t to every rank (and Θ_1 in round 1)."""
        seconds = 0.0
        held: np.ndarray | None = None
        if round_number == 1:  # line 2: the server's Θ_1; afterwards clients hold Θ_t
            model = (
                flatten_parameters(self.server.model)
                if self.server is not None
                else np.empty_like(theta)
            )
            seconds += comm.broadcast(model, round_number, "global_model")
            held = model
        selection = np.zeros(comm.size, dtype=np.int64)
        items = np.empty(self.settings.kt_samples, dtype=np.int64)
        if self.server is not None:
            selection[self.server.select_clients(members)] = 1
            items[:] = self.server.kt_items
        seconds += comm.broadcast(selection, round_number, "selection")
        seconds += comm.broadcast(items, round_number, "kt_items")
        self.selected = [int(rank) for rank in np.flatnonzero(selection)]
        self.kt_items = items
        return Distribution(theta=held, trains=comm.rank in self.selected, seconds=seconds)

    def perturbed_labels(self) -> np.ndarray:
        """Lines 10–12: the locally trained model's labels of the KT items, after Eq. (2)."""
        probabilities = self.items.probabilities(
            self.client_model, self.kt_items, self.settings.eval_batch_size
        )
        labels = probabilities.argmax(axis=-1).astype(np.int64)
        perturbed = randomized_response(
            labels, self.settings.beta, self.settings.n_classes, self.rr_rng
        )
        self.ledger.record_release()
        return perturbed

    def exchange(
        self, comm: Communicator, theta: np.ndarray, members: list[int], round_number: int
    ) -> tuple[np.ndarray | None, float]:
        """Lines 14–19, then Θ_{t+1} to every rank (which every client evaluates)."""
        labels = self.perturbed_labels() if comm.rank in self.selected else None
        reports, seconds = comm.gather_labels(
            labels, self.selected, self.settings.kt_samples, round_number
        )
        if self.server is not None and reports is not None and len(reports):
            self.last_losses = self.server.update(reports)
        started = time.perf_counter()
        comm.comm.Barrier()  # waiting for the server's update is not communication
        if self.server is None:  # the server's own time is in its update's parts
            self.timings.wait_seconds += time.perf_counter() - started
        model = (
            flatten_parameters(self.server.model) if self.server is not None
            else np.empty_like(theta)
        )  # fmt: skip
        seconds += comm.broadcast(model, round_number, "global_model")
        return model, seconds

    def state_dict(self) -> dict[str, Any]:
        return {
            "kt_items": self.kt_items.copy(),
            "selected": list(self.selected),
            "rr_rng": self.rr_rng.bit_generator.state,
            "server": self.server.state_dict() if self.server is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kt_items = np.asarray(state["kt_items"], dtype=np.int64)
        self.selected = [int(rank) for rank in state["selected"]]
        self.rr_rng.bit_generator.state = state["rr_rng"]
        if self.server is not None:
            self.server.load_state_dict(state["server"])


def knowledge_transfer_exchange(
    config: TrainConfig,
    client_model: nn.Module,
    pool: PublicPool,
    ledger: LDPLedger,
    timings: Timings,
    *,
    rank: int,
    center: int,
    n_classes: int,
    input_size: int,
    device: torch.device,
) -> PrivateKTExchange:
    """One rank's PrivateKT exchange around its ``client_model``: the client role, and on
    rank 0 the server with its own model Θ_1 (from the seed every client's copy has) and
    optimizer. The seeded draws are fixed: the server's from the run seed, each client's
    randomized response from the run seed and its centre."""
    settings = KTSettings.from_config(config, n_classes, len(pool))
    items = PublicItems(pool, device, input_size)
    server = None
    if rank == SERVER_RANK:
        torch.manual_seed(derived_seed(config.seed, "shared-init"))  # Θ_1, as every client's
        model = build_model(config.proxy_model, n_classes, input_size).to(device)
        server = KnowledgeServer(
            model, make_optimizer(model, config), items, settings,
            np.random.default_rng(derived_seed(config.seed, "privatekt-server")), timings,
        )  # fmt: skip
    rr_rng = np.random.default_rng(derived_seed(config.seed, "randomized-response", center))
    return PrivateKTExchange(client_model, items, settings, ledger, rr_rng, server, timings)
