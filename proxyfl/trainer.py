"""One client's set-up and its steps of a round (:class:`ClientTrainer`), for the one
training loop every algorithm runs, one client per MPI rank (:mod:`proxyfl.loop`; what
each round records: :mod:`proxyfl.records`).

Round t = 1..T at client k:

1. participation: a client whose ε after this round would exceed ``--epsilon-budget``
   stops for good (no more training, no more sharing); the ranks agree on the round's
   members with one small ``allgather`` of flags;
2. distribution, by the algorithm's strategy (:mod:`proxyfl.algorithms.strategies`): only
   PrivateKT's server hands anything out here (the round's clients and knowledge-transfer
   items, :mod:`proxyfl.algorithms.privatekt.strategy`); a client it does not select
   skips step 3;
3. local training (members only): ``local_epochs`` epochs of Poisson batches from the
   DP data loader. With mutual learning both models take a step on every batch (DML
   losses, :mod:`proxyfl.algorithms.dml`): the private model with Adam, the DP model with
   DP-Adam.
   An empty batch gives the DP model a noise-only step and the private model none.
   PrivateKT trains its shared model without DP, on shuffled mini-batches, for its own
   ``kt_local_epochs`` with its own optimizer (``kt_optimizer``, ``kt_lr``), afresh each
   round unless ``kt_optimizer_state: kept`` (:mod:`proxyfl.engine.local_training`);
4. exchange of the shared model, by the algorithm's strategy;
5. evaluation of the strategy's models on the merged test splits of all listed centres;
6. ε from the client's privacy ledger (:mod:`proxyfl.privacy.ledger`: the RDP accountant's
   sample-level (ε, δ), or PrivateKT's label-level ε-LDP), metrics gathered to rank 0 and
   written, checkpoint written.

Models are initialised from seeds derived from ``--seed``: the DP (shared) model from the
same seed on every client (a common starting point, as FedAvg needs), the private model
from a seed that also depends on the client's centre.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from proxyfl.algorithms.dml import mutual_learning_loss, mutual_learning_losses
from proxyfl.algorithms.privatekt.public_pool import PublicPool
from proxyfl.algorithms.privatekt.strategy import (
    forget_state,
    knowledge_transfer_exchange,
    make_optimizer,
)
from proxyfl.algorithms.strategies import Distribution, Exchange, Strategy
from proxyfl.comm.exchange import (
    Communicator,
    assign_flat_parameters,
    flatten_parameters,
)
from proxyfl.comm.graphs import Schedule
from proxyfl.config import TrainConfig
from proxyfl.engine import compilation
from proxyfl.engine.data import PatchDataset, prepare_images
from proxyfl.engine.evaluate import Scores, evaluate_models, evaluate_with_probabilities
from proxyfl.engine.local_training import PlainTraining, make_plain
from proxyfl.engine.memory import (
    MemoryContext,
    OutOfMemoryError,
    batch_within,
    device_memory_bytes,
    is_out_of_memory,
    out_of_memory_message,
    rank_budget_bytes,
    reset_peaks,
)
from proxyfl.engine.models import build_model, count_parameters
from proxyfl.engine.prefetch import Prefetcher
from proxyfl.engine.residency import DeviceResidency
from proxyfl.engine.runtime import Runtime, derived_seed, kernel_set, seeded_generator
from proxyfl.engine.timings import Timings
from proxyfl.privacy.accounting import poisson_schedule
from proxyfl.privacy.dp import PrivateTraining, check_dp_compatible, make_private
from proxyfl.privacy.ldp import LDPLedger
from proxyfl.privacy.ledger import DPSGDLedger, PrivacyLedger
from proxyfl.privacy.per_sample import (
    COMPILED_MEMORY_SHARE,
    PAD_MULTIPLE,
    FuncPrivateTraining,
    activation_bytes_per_example,
    chunk_plan,
    chunk_rows,
    chunk_size_for,
    compiled_chunk_size,
    cross_entropy,
    estimated_bytes_per_example,
    largest_plausible_batch,
)
from wsi.store.reader import PatchSplitReader

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class ClientData:
    """What one client trains on and evaluates on."""

    client: int
    center: int  # JOINT_CENTER for Joint's pooled data
    train: PatchDataset
    test_splits: list[PatchSplitReader]
    n_classes: int
    patch_size: int
    public_pool: PublicPool | None = None  # PrivateKT's unlabelled public images


@dataclass
class RoundLosses:
    shared: float | None = None
    private: float | None = None
    steps: int = 0
    empty_batches: int = 0


class _DeviceSum:
    """A running sum kept on the device: adding a step's loss does not wait for the
    device; :meth:`mean` reads it once, at the end of the round."""

    def __init__(self, device: torch.device) -> None:
        self.total = torch.zeros((), dtype=torch.float64, device=device)

    def add(self, value: torch.Tensor) -> None:
        self.total += value.detach().to(torch.float64)

    def mean(self, count: int) -> float:
        return float(self.total.item()) / count


@dataclass
class ClientTrainer:
    """One client's models, optimizers, accountant and loop state."""

    config: TrainConfig
    runtime: Runtime
    strategy: Strategy
    data: ClientData
    schedule: Schedule
    run_dir: Path
    communicator: Communicator = field(init=False)

    def __post_init__(self) -> None:
        """Build the client, always in this order: the models' initial weights come from
        seeded draws of torch's global generator, so the order is part of the result."""
        self.input_size = self.config.input_size or self.data.patch_size
        self.communicator = Communicator(self.runtime.comm)
        self.timings = Timings()
        self.knowledge_transfer = self.strategy.exchange_kind == "knowledge_transfer"
        # PrivateKT's local epochs are its own option (the DP methods' is local_epochs)
        self.local_epochs = (
            self.config.kt_local_epochs if self.knowledge_transfer else self.config.local_epochs
        )
        self.active = True
        self.residency: DeviceResidency | None = None  # a hosted client's (device_residency)
        self.last_scores: dict[str, Scores] | None = None
        self.graphs_before_training = 0  # torch._dynamo's count once the pre-run check ran
        proxy = self._build_proxy_model()
        self.private, self.private_optimizer = self._build_private_model()
        self.sampler_generator, self.noise_generator = self._build_generators()
        self.training, self.ledger = self._build_proxy_training(proxy)
        self.exchange = self.strategy.make_exchange(self.schedule, self._knowledge_transfer)
        self.proxy_parameters = count_parameters(self.training.model)
        self.private_parameters = count_parameters(self.private) if self.private else 0
        self.eval_batch_size = self._size_for_memory()
        self.private_forward = self._compiled_private()

    # -- set-up, in __post_init__'s order ---------------------------------------------------
    def _build_proxy_model(self) -> nn.Module:
        """The proxy (shared) model, initialised from the same seed on every client."""
        cfg = self.config
        torch.manual_seed(derived_seed(cfg.seed, "shared-init"))
        proxy = build_model(cfg.proxy_model, self.data.n_classes, self.input_size)
        proxy = proxy.to(self.runtime.device)
        if self.strategy.dp_training:
            check_dp_compatible(proxy, cfg.proxy_model)
        return proxy

    def _build_private_model(self) -> tuple[nn.Module | None, torch.optim.Optimizer | None]:
        """The private model and its Adam (mutual learning only), from a seed of its own
        centre."""
        cfg = self.config
        if not self.strategy.mutual_learning:
            return None, None
        name = cfg.private_model_for(self.data.client)
        torch.manual_seed(derived_seed(cfg.seed, "private-init", self.data.center))
        private = build_model(name, self.data.n_classes, self.input_size).to(self.runtime.device)
        optimizer = torch.optim.Adam(
            private.parameters(), lr=cfg.private_learning_rate, weight_decay=cfg.weight_decay
        )
        return private, optimizer

    def _build_generators(self) -> tuple[torch.Generator, torch.Generator]:
        """Poisson sampling's generator (CPU) and the DP noise's (on the device)."""
        cfg, center = self.config, self.data.center
        sampler = seeded_generator(
            derived_seed(cfg.seed, "poisson-sampling", center), torch.device("cpu")
        )
        noise = seeded_generator(derived_seed(cfg.seed, "dp-noise", center), self.runtime.device)
        return sampler, noise

    def _build_proxy_training(
        self, proxy: nn.Module
    ) -> tuple[PrivateTraining | FuncPrivateTraining | PlainTraining, PrivacyLedger]:
        """The proxy model's training and the ledger of what it spends: DP-Adam on Poisson
        batches with the RDP accountant, or (PrivateKT) its own optimizer on shuffled batches
        with the label-level LDP ledger."""
        cfg = self.config
        if not self.strategy.dp_training:
            optimizer = make_optimizer(proxy, cfg)
            plain = make_plain(
                proxy, optimizer, self.data.train, batch_size=cfg.batch_size,
                generator=self.sampler_generator, loader_workers=cfg.loader_workers,
            )  # fmt: skip
            return plain, LDPLedger(cfg.ldp_epsilon)
        optimizer = torch.optim.Adam(proxy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        device_type = self.runtime.device.type
        # compiled or not is decided once the memory is known (_size_for_memory)
        private = make_private(
            proxy, optimizer, self.data.train, batch_size=cfg.batch_size, sigma=cfg.sigma,
            clip=cfg.clip, sampler_generator=self.sampler_generator,
            noise_generator=self.noise_generator, loader_workers=cfg.loader_workers,
            engine=cfg.dp_engine, chunk_size=cfg.dp_chunk_size, compiled=False,
            autocast=cfg.autocast_on(device_type),
        )  # fmt: skip
        ledger = DPSGDLedger(
            private.accountant, sigma=cfg.sigma, sample_rate=private.sample_rate,
            steps_per_round=private.steps_per_epoch * cfg.local_epochs, delta=cfg.delta,
        )  # fmt: skip
        return private, ledger

    def _compiled_private(self) -> nn.Module | None:
        """The private model's forward, through ``torch.compile`` when the run compiles,
        with static shapes: it runs on the DP engine's chunks (:meth:`private_chunks`),
        whose two sizes the pre-run check compiles; the model itself otherwise."""
        if self.private is None or not self.compiled:
            return self.private
        return torch.compile(self.private, dynamic=False)  # type: ignore[return-value]

    def _size_for_memory(self) -> int:
        """Size the func engine's chunks of per-example gradients (unless ``dp_chunk_size``
        says) and the evaluation batch from this rank's memory budget
        (:mod:`proxyfl.engine.memory`), deciding on the way whether the run compiles
        (:meth:`_decide_compilation`); returns the evaluation batch."""
        cfg, device = self.config, self.runtime.device
        self.budget_bytes = rank_budget_bytes(device, self.runtime.ranks_on_device,
                                              cfg.gpu_memory_gb)  # fmt: skip
        model = self.training.model
        models = [model] + ([self.private] if self.private is not None else [])

        def probe() -> tuple[int, int]:
            example = torch.zeros(1, 3, self.input_size, self.input_size, device=device)
            return (estimated_bytes_per_example(model, example),
                    max(activation_bytes_per_example(m, example) for m in models))  # fmt: skip

        per_example, per_image = self._guarded("one example's forward pass", 1, probe)
        training = self.training
        share = 0.5 * self.budget_bytes
        eager_chunk = compiled_chunk = self.expected_batch
        if isinstance(training, FuncPrivateTraining):
            eager_chunk = cfg.dp_chunk_size or chunk_size_for(share, per_example,
                                                              self.largest_batch)  # fmt: skip
            compiled_chunk = cfg.dp_chunk_size or compiled_chunk_size(
                self.expected_batch,
                chunk_size_for(share / COMPILED_MEMORY_SHARE, per_example, self.largest_batch),
            )
        elif self.private is not None:  # Opacus' proxy: the private model alone is chunked
            compiled_chunk = compiled_chunk_size(self.expected_batch, self.largest_batch)
        self.compiled = self._decide_compilation(compiled_chunk)
        self.chunk_size = compiled_chunk if self.compiled else eager_chunk
        if isinstance(training, FuncPrivateTraining):
            training.compiled, training.chunk_size = self.compiled, self.chunk_size
        return batch_within(self.budget_bytes, per_image, cfg.eval_batch_size)

    # -- compilation ---------------------------------------------------------------------
    def _decide_compilation(self, chunk_size: int) -> bool:
        """Does this rank compile (``compile``: on, off, or auto: on a GPU when the run's
        steps repay it, :func:`proxyfl.engine.compilation.compile_pays`)? What can be
        compiled: the func engine's per-example function and the private model."""
        cfg, device = self.config, self.runtime.device
        compilable = self.strategy.dp_training and (
            isinstance(self.training, FuncPrivateTraining) or self.private is not None
        )
        self.compile_key = self.compile_cache = None
        self.compile_facts: dict[str, Any] = {}
        self.graphs_cached = False  # the cache has served these graphs before
        if not compilable or cfg.compile == "off" or (cfg.compile == "auto"
                                                      and device.type != "cuda"):  # fmt: skip
            return False
        self.compile_cache = compilation.use_compile_cache(cfg.compile_cache)
        self.compile_facts = {
            "kernels": kernel_set(device).split(",")[0], "proxy": cfg.proxy_model,
            "private": cfg.private_model_for(self.data.client) if self.private else None,
            "engine": cfg.dp_engine, "autocast": cfg.autocast_on(device.type),
            "input_size": self.input_size, "classes": self.data.n_classes,
            "chunks": [chunk_size, PAD_MULTIPLE], "clip": cfg.clip,
            "dml": [cfg.dml_alpha, cfg.dml_beta] if self.private else None,
        }  # fmt: skip
        self.compile_key = compilation.graph_key(**self.compile_facts)
        self.graphs_cached = compilation.cache_serves(self.compile_cache, self.compile_key)
        if cfg.compile == "on":
            return True
        n_train = len(self.data.train)
        steps = cfg.rounds * cfg.local_epochs * poisson_schedule(n_train, cfg.batch_size)[1]
        return compilation.compile_pays(
            steps, self.expected_batch * self.input_size**2,
            mutual_learning=self.private is not None, cache_serves=self.graphs_cached,
        )  # fmt: skip

    @property
    def recompiles(self) -> int:
        """Graphs compiled since the pre-run check: 0 unless a shape changed mid-run."""
        return compilation.graphs_compiled() - self.graphs_before_training

    @property
    def expected_batch(self) -> int:
        """E|B| = int(N q): the mean of this client's Poisson batches (B, or N when B > N)."""
        q = self.training.sample_rate
        return self.config.batch_size if q is None else int(len(self.data.train) * q)

    @property
    def largest_batch(self) -> int:
        """The largest training batch this client will plausibly draw: the 99.9th
        percentile of its Poisson batches' sizes (the whole batch without DP sampling)."""
        q = self.training.sample_rate
        if q is None:
            return self.config.batch_size
        return largest_plausible_batch(len(self.data.train), q)

    @property
    def checkpointed_model_bytes(self) -> int:
        """The bytes of the weights (and buffers) of the models its checkpoints hold: the
        shared model and the private one, if any (:meth:`state_dict`)."""
        models = [self.training.model, *([self.private] if self.private is not None else [])]
        return sum(tensor.numel() * tensor.element_size()
                   for model in models for tensor in model.state_dict().values())  # fmt: skip

    def device_residency(self) -> DeviceResidency:
        """The client's models and optimisers (and its exchange's own: PrivateKT's server),
        for a rank that moves them off the device while its other clients compute
        (:mod:`proxyfl.engine.residency`); kept for the rank's record."""
        self.residency = DeviceResidency(self.runtime.device, [
            self.private, self.private_optimizer, self.training.module,
            self.training.base_optimizer, *self.exchange.device_holders(),
        ])  # fmt: skip
        return self.residency

    @property
    def dp(self) -> PrivateTraining | FuncPrivateTraining | PlainTraining:
        """The shared model's training (DP-SGD, or plain for PrivateKT); old name of
        :attr:`training`."""
        return self.training

    def _knowledge_transfer(self) -> Exchange:
        """PrivateKT's exchange: the client role here, the server's too on rank 0."""
        pool = self.data.public_pool
        if pool is None:
            raise ValueError("PrivateKT needs its public pool (--public-pool)")
        if not isinstance(self.ledger, LDPLedger):
            raise TypeError("PrivateKT accounts label-level ε-LDP")
        return knowledge_transfer_exchange(
            self.config, self.training.model, pool, self.ledger, self.timings,
            rank=self.runtime.rank, center=self.data.center, n_classes=self.data.n_classes,
            input_size=self.input_size, device=self.runtime.device,
        )  # fmt: skip

    # -- privacy -------------------------------------------------------------------------
    @property
    def steps_per_round(self) -> int:
        return self.training.steps_per_epoch * self.local_epochs

    def epsilon(self) -> float:
        return self.ledger.epsilon()

    def within_budget_after_next_round(self) -> bool:
        """Would ε after one more round stay within ``--epsilon-budget``?"""
        if self.config.epsilon_budget is None:
            return True
        return self.ledger.epsilon_after_next_round() <= self.config.epsilon_budget

    # -- one round -----------------------------------------------------------------------
    def batches(self, source: Any) -> Prefetcher:
        """``source``'s batches read ahead by a thread (``prefetch`` of them), pinned for
        a GPU (:mod:`proxyfl.engine.prefetch`)."""
        return Prefetcher(source, self.config.prefetch, pin=self.runtime.device.type == "cuda")

    def train_round(self) -> RoundLosses:
        """``local_epochs`` epochs of Poisson batches; both models step on every batch.
        The next batch is read while the current step runs, and the losses are summed on
        the device and read once, at the end: no step waits for the device."""
        device = self.runtime.device
        losses = RoundLosses()
        shared_sum, private_sum = _DeviceSum(device), _DeviceSum(device)
        training = self.training
        if self.knowledge_transfer and self.config.kt_optimizer_state == "fresh":
            forget_state(training.optimizer)  # Θ_t is new each round: so are its moments
        training.module.train()
        if self.private is not None:
            self.private.train()
        for _ in range(self.local_epochs):
            batches = self.batches(training.loader)
            for images, labels in batches:
                if labels.shape[0] == 0:  # only Poisson (DP) batches can be empty
                    assert not isinstance(training, PlainTraining)
                    training.noise_only_step()
                    losses.empty_batches += 1
                    continue
                x = prepare_images(images, device, self.input_size)
                y = labels.to(device, non_blocking=True)
                shared_loss, private_loss = self._step(x, y)
                shared_sum.add(shared_loss)
                if private_loss is not None:
                    private_sum.add(private_loss)
                losses.steps += 1
            self.timings.data_wait_seconds += batches.wait_seconds
        if losses.steps:
            losses.shared = shared_sum.mean(losses.steps)
            if self.private is not None:
                losses.private = private_sum.mean(losses.steps)
        return losses

    def proxy_objective(
        self, logits: torch.Tensor, targets: torch.Tensor, partner: torch.Tensor | None
    ) -> torch.Tensor:
        """The proxy's DML loss ``(1 − β)·CE + β·KL(partner ‖ proxy)`` (an
        :data:`~proxyfl.privacy.per_sample.Objective`: per example under the func engine)."""
        if partner is None:
            return cross_entropy(logits, targets)
        return mutual_learning_loss(logits, partner, targets, self.config.dml_beta)

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Both models' step on one batch; ``(shared loss, private loss)``, detached, on
        the device.

        DML: each model's loss takes the other's logits, detached, computed before either
        stepped. In this order, so that one model's activations are never held while the
        other trains: the proxy's logits without gradients (a forward pass that keeps
        nothing), the private model's forward and backward pass (which gives its logits)
        and its step, then the proxy's DP step against those logits. The price is a second
        forward pass of the proxy, a third of a plain step (the proxy is the smaller model
        where the two differ); the gain, a DML step's peak memory is the larger of the two
        models' steps, not their sum."""
        if self.private is None or self.private_optimizer is None:
            shared_loss, _ = self.training.step(x, y)
            return shared_loss, None
        private_loss, partner = self.private_backward(x, y, self.shared_logits(x))
        self.private_optimizer.step()
        shared_loss, _ = self.training.step(x, y, self.proxy_objective, partner)
        return shared_loss, private_loss

    def private_chunks(self, n: int) -> list[tuple[int, int, int]]:
        """How the private model takes a batch of ``n``: whole, or (compiled) in the DP
        engine's padded chunks, whose two sizes are its two graphs
        (:func:`proxyfl.privacy.per_sample.chunk_plan`)."""
        if not self.compiled:
            return [(0, n, n)]
        return chunk_plan(n, self.chunk_size, padded=True)

    def shared_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The shared model's logits of ``x``, without gradients (the private model's
        partner), in the precision its DP step's forward pass takes."""
        device_type = self.runtime.device.type
        autocast = self.config.autocast_on(device_type)
        with torch.no_grad(), torch.autocast(device_type, torch.bfloat16, enabled=autocast):
            return self.training.model(x).float()

    def private_backward(
        self, x: torch.Tensor, y: torch.Tensor, partner: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The private model's DML loss against ``partner`` (the proxy's logits), its
        gradient accumulated chunk by chunk (padding rows weigh 0); ``(loss, logits)``,
        detached (the logits of the model before it steps: the proxy's partner)."""
        assert self.private_forward is not None and self.private_optimizer is not None
        alpha, n = self.config.dml_alpha, x.shape[0]
        self.private_optimizer.zero_grad(set_to_none=True)
        losses, logits = [], []
        for start, real, size in self.private_chunks(n):
            if size == real == n:  # the whole batch: the batch's mean loss
                output = self.private_forward(x)
                loss = mutual_learning_loss(output, partner, y, alpha)
            else:
                rows, keep = chunk_rows(start, real, size, x.device)
                output = self.private_forward(x[rows])
                terms = mutual_learning_losses(output, partner[rows], y[rows], alpha)
                loss = (terms * keep).sum() / n
            loss.backward()
            losses.append(loss.detach())
            logits.append(output.detach()[:real])
        total = losses[0] if len(losses) == 1 else torch.stack(losses).sum()
        return total, logits[0] if len(logits) == 1 else torch.cat(logits)

    # -- before round 1 ------------------------------------------------------------------
    def preflight(self) -> float:
        """One training step at the largest batch the run will plausibly draw and one
        evaluation batch, on zeros, nothing stepped: a run that does not fit its device
        fails here, in seconds, with :class:`OutOfMemoryError`, not mid-run. The first
        calls compile where the run compiles; returns the compilation's seconds (the first
        call's time less the second's)."""
        device = self.runtime.device
        reset_peaks(device)
        rounds = 2 if self.compiled else 1
        seconds = []
        # a compiled engine's two chunk sizes (per_sample.chunk_plan) both compile here
        batches = [self.largest_batch] + ([PAD_MULTIPLE] if rounds == 2 else [])
        for _ in range(rounds):
            started = time.perf_counter()
            for batch in batches:
                self._guarded("a training step", batch, lambda b=batch: self._dry_step(b))
            self._guarded("an evaluation batch", self.eval_batch_size, self._dry_evaluation)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds.append(time.perf_counter() - started)
        self.graphs_before_training = compilation.graphs_compiled()
        if self.compiled and self.compile_cache is not None and self.compile_key is not None:
            compilation.mark_cached(self.compile_cache, self.compile_key, self.compile_facts)
        return max(0.0, seconds[0] - seconds[-1]) if rounds == 2 else 0.0

    def _dry_step(self, batch: int) -> None:
        """A training step's memory at ``batch``, in the order and the shapes (chunks)
        training runs (:meth:`_step`), its gradients then dropped."""
        device, size = self.runtime.device, self.input_size
        x = torch.zeros(batch, 3, size, size, device=device)
        y = torch.zeros(batch, dtype=torch.long, device=device)
        partner = None
        if self.private is not None:
            _, partner = self.private_backward(x, y, self.shared_logits(x))
            self.private.zero_grad(set_to_none=True)
        training = self.training
        if isinstance(training, FuncPrivateTraining):
            training.clipped_sum(x, y, self.proxy_objective, partner)
        else:
            self.proxy_objective(training.module(x), y, partner).backward()
            training.optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    def _dry_evaluation(self) -> None:
        size, device = self.input_size, self.runtime.device
        x = torch.zeros(self.eval_batch_size, 3, size, size, device=device)
        for model in self.evaluated_models().values():
            was_training = model.training
            model.eval()
            with torch.no_grad():
                model(x)
            model.train(was_training)

    def _guarded(self, what: str, batch: int, action: Callable[[], T]) -> T:
        """``action()``, its out-of-memory error told as :class:`OutOfMemoryError`."""
        try:
            return action()
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            raise OutOfMemoryError(self.out_of_memory_message(error, what, batch)) from None

    def out_of_memory_message(self, error: BaseException, what: str, batch: int) -> str:
        """What :func:`proxyfl.engine.memory.out_of_memory_message` says of this rank."""
        device = self.runtime.device
        dp = self.training.sample_rate is not None and what == "a training step"
        context = MemoryContext(
            device=device, what=what, batch=batch,
            expected_batch=self.expected_batch if dp else None,
            budget_bytes=self.budget_bytes, device_bytes=device_memory_bytes(device),
            ranks_on_device=self.runtime.ranks_on_device,
        )  # fmt: skip
        return out_of_memory_message(error, context)

    def distribute_round(self, members: list[int], round_number: int) -> Distribution:
        """What the strategy hands out before training (PrivateKT's server), applied."""
        theta = flatten_parameters(self.training.model)
        distribution = self.exchange.distribute(self.communicator, theta, members, round_number)
        if distribution.theta is not None:
            assign_flat_parameters(self.training.model, distribution.theta)
        return distribution

    def exchange_round(self, members: list[int], round_number: int) -> float:
        """Mix the DP model with the other members'; returns seconds spent communicating."""
        theta = flatten_parameters(self.training.model)
        started = time.perf_counter()
        self.runtime.comm.Barrier()  # waiting for slower clients is not communication
        self.timings.wait_seconds += time.perf_counter() - started
        new_theta, seconds = self.exchange.exchange(self.communicator, theta, members, round_number)
        if new_theta is not None:
            assign_flat_parameters(self.training.model, new_theta)
        return seconds

    def evaluated_models(self, primary_only: bool = False) -> dict[str, nn.Module]:
        """The client's models by their metrics label (``private``; ``proxy``, ``central``
        or ``local`` for the shared one), or only the primary one (the paper's)."""
        models: dict[str, nn.Module] = {self.strategy.shared_label: self.training.model}
        if self.private is not None:
            models["private"] = self.private
        if primary_only:
            return {self.strategy.primary_label: models[self.strategy.primary_label]}
        return models

    def evaluate(self, primary_only: bool = False) -> dict[str, Scores]:
        """Scores of the client's models (or of its primary one) on the merged test set."""
        return evaluate_models(*self._evaluation(primary_only))

    def evaluate_with_probabilities(self) -> tuple[dict[str, Scores], dict[str, np.ndarray]]:
        """:meth:`evaluate`, and each model's per-patch probabilities (the final round)."""
        return evaluate_with_probabilities(*self._evaluation())

    def _evaluation(self, primary_only: bool = False) -> tuple[Any, ...]:
        """The models, test splits and settings every evaluation of this client takes."""
        return (self.evaluated_models(primary_only), self.data.test_splits, self.data.n_classes,
                self.runtime.device, self.input_size, self.eval_batch_size,
                self.config.prefetch)  # fmt: skip

    # -- checkpoints ---------------------------------------------------------------------
    def state_dict(self, round_number: int) -> dict[str, Any]:
        return {
            "round": round_number,
            "shared_model": self.training.model.state_dict(),
            "shared_optimizer": self.training.base_optimizer.state_dict(),
            "private_model": self.private.state_dict() if self.private else None,
            "private_optimizer": (
                self.private_optimizer.state_dict() if self.private_optimizer else None
            ),
            "accountant": self.ledger.state_dict(),
            "sampler_generator": self.sampler_generator.get_state(),
            "noise_generator": self.noise_generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "exchange": self.exchange.state_dict(),
            "active": self.active,
            "last_scores": self.last_scores,
            "send_log": list(self.communicator.log.entries),
            "timings": self.timings.as_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.training.model.load_state_dict(state["shared_model"])
        self.training.base_optimizer.load_state_dict(state["shared_optimizer"])
        if self.private is not None and self.private_optimizer is not None:
            self.private.load_state_dict(state["private_model"])
            self.private_optimizer.load_state_dict(state["private_optimizer"])
        self.ledger.load_state_dict(state["accountant"])
        self.sampler_generator.set_state(state["sampler_generator"])
        self.noise_generator.set_state(state["noise_generator"])
        torch.set_rng_state(state["torch_rng"])
        self.exchange.load_state_dict(state["exchange"])
        self.active = bool(state["active"])
        self.last_scores = state["last_scores"]
        self.communicator.log.entries = list(state["send_log"])
        self.timings.restore(state["timings"])

    def private_digest_source(self) -> np.ndarray | None:
        """The private model's flat parameters (for checks that it never left the rank)."""
        return flatten_parameters(self.private) if self.private is not None else None
