"""Local training without DP: PrivateKT's clients train the global model plainly.

PrivateKT protects what leaves a client (the randomized-response labels,
:mod:`proxyfl.privacy.ldp`), not the local training itself, so a client trains Θ_t with Adam on
shuffled mini-batches of its training split (``⌈N/B⌉`` batches per epoch, the last one
smaller, the order drawn from a seeded generator). :class:`PlainTraining` offers the
attributes of :class:`proxyfl.privacy.dp.PrivateTraining` that the training loop uses, so the
loop is the same for both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler

from proxyfl.privacy.per_sample import Objective, cross_entropy


@dataclass
class PlainTraining:
    """A model trained without DP: the model, its optimizer and a shuffling loader."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loader: DataLoader
    steps_per_epoch: int
    sample_rate: float | None = None  # no Poisson sampling, nothing to account

    @property
    def module(self) -> nn.Module:
        """What the loop calls forward on (the model itself: no per-sample wrapper)."""
        return self.model

    @property
    def base_optimizer(self) -> torch.optim.Optimizer:
        return self.optimizer

    def step(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        objective: Objective = cross_entropy,
        partner: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One plain step of ``objective`` on the batch; ``(loss, logits)``, detached, on
        the device."""
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.model(x)
        loss = objective(logits, y, partner)
        loss.backward()
        self.optimizer.step()
        return loss.detach(), logits.detach()


def make_plain(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Dataset,
    *,
    batch_size: int,
    generator: torch.Generator,
    loader_workers: int = 0,
) -> PlainTraining:
    """Shuffled mini-batches of ``batch_size`` over ``dataset``, in an order from ``generator``."""
    n = len(dataset)  # type: ignore[arg-type]
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=RandomSampler(dataset, generator=generator),
        num_workers=loader_workers,
    )
    return PlainTraining(
        model=model, optimizer=optimizer, loader=loader, steps_per_epoch=math.ceil(n / batch_size)
    )
