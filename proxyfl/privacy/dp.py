"""DP-SGD through Opacus: per-example clipping, Gaussian noise, Poisson sampling, RDP.

``PrivacyEngine(accountant="rdp").make_private(...)`` wraps the model in a
``GradSampleModule`` (per-example gradients from hooks), the optimizer in a
``DPOptimizer`` and the loader in a ``DPDataLoader``. One step on a Poisson batch B
(each example drawn with probability q) computes

    g̃ = ( Σ_{i∈B} g_i / max(1, ‖g_i‖₂ / C)  +  N(0, σ² C² I) ) / E|B|

with ``E|B| = int(N q)``, then lets the wrapped optimizer (Adam: "DP-Adam") step on g̃,
and the RDP accountant records one step of (σ, q).

Both models of a client train from the same DP data loader, so the private model sees
exactly the proxy's batches. Poisson sampling can draw an empty batch; then the private
model skips its step (it has no data and no privacy to protect), while the DP model still
takes its noise-only step and the accountant counts it, as DP-SGD requires.

Seeds: Poisson sampling draws from ``sampler_generator`` and the noise from
``noise_generator`` (``secure_mode=False``), so a run is reproducible and its generator
states can be checkpointed.

Two engines compute the same mechanism (``train.options.dp_engine``): ``opacus``, the
hooks above, and ``func``, per-example gradients by ``torch.func``
(:mod:`proxyfl.privacy.per_sample`: the same loader, sampler, noise draws, accountant and
plain optimizer; 2.7x faster on a GPU, and no hooks). Both offer :meth:`step` and
:meth:`noise_only_step` to the training loop.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from opacus import GradSampleModule, PrivacyEngine
from opacus.accountants import RDPAccountant
from opacus.data_loader import DPDataLoader
from opacus.optimizers import DPOptimizer
from opacus.validators import ModuleValidator
from torch import nn
from torch.utils.data import DataLoader, Dataset

from proxyfl.privacy.accounting import poisson_schedule
from proxyfl.privacy.per_sample import (
    FuncPrivateTraining,
    Objective,
    cross_entropy,
    largest_plausible_batch,
)

DPEngine = Literal["func", "opacus"]
DP_ENGINES: tuple[str, ...] = ("func", "opacus")

# Expected with seeded noise, and harmless (the first layer's input needs no gradient).
_QUIET = ("Secure RNG turned off", "Full backward hook is firing")


@contextmanager
def quiet_opacus() -> Iterator[None]:
    """Silence the two warnings Opacus and torch give on every run of this set-up."""
    with warnings.catch_warnings():
        for message in _QUIET:
            warnings.filterwarnings("ignore", message=message)
        yield


class DPIncompatibleModelError(ValueError):
    """The model has layers DP-SGD cannot train (e.g. BatchNorm)."""


@dataclass
class PrivateTraining:
    """A model trained with DP-SGD: the wrapped module, its DP optimizer, loader, accountant."""

    module: GradSampleModule
    optimizer: DPOptimizer
    loader: DPDataLoader
    accountant: RDPAccountant
    sample_rate: float
    steps_per_epoch: int

    @property
    def model(self) -> nn.Module:
        """The plain model inside the per-sample-gradient wrapper."""
        return self.module._module

    @property
    def base_optimizer(self) -> torch.optim.Optimizer:
        """The wrapped optimizer (Adam), whose state a checkpoint keeps."""
        return self.optimizer.original_optimizer

    def step(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        objective: Objective = cross_entropy,
        partner: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One DP-SGD step on the batch's ``objective`` (against the ``partner`` logits,
        if any); ``(mean loss, logits)``, detached, on the device."""
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.module(x)
        loss = objective(logits, y, partner)
        with quiet_opacus():
            loss.backward()
        self.optimizer.step()
        return loss.detach(), logits.detach()

    def noise_only_step(self) -> None:
        """The step of an empty Poisson batch (:func:`noise_only_step`)."""
        noise_only_step(self)


def check_dp_compatible(model: nn.Module, name: str) -> None:
    """Raise :class:`DPIncompatibleModelError` listing what Opacus cannot train."""
    problems = ModuleValidator.validate(model, strict=False)
    if problems:
        details = "; ".join(str(problem) for problem in problems)
        raise DPIncompatibleModelError(f"model {name} cannot be trained with DP-SGD: {details}")


def _schedule_of(dp_loader: DataLoader, n: int, batch_size: int) -> tuple[float, int]:
    """:func:`~proxyfl.privacy.accounting.poisson_schedule` of ``n`` and ``batch_size``,
    checked against the rate and the batches an epoch of Opacus' loader: its accountant
    counts the loader's steps, the ledger, the records and the planned tables these."""
    sample_rate, steps = poisson_schedule(n, batch_size)
    sampled = getattr(dp_loader, "sample_rate", None)
    if sampled is None or abs(sampled - sample_rate) > 1e-12 or len(dp_loader) != steps:
        raise RuntimeError(
            f"Opacus sampled q={sampled} x {len(dp_loader)} steps, "
            f"accounting assumes q={sample_rate} x {steps}"
        )
    return sample_rate, steps


def make_private(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Dataset,
    *,
    batch_size: int,
    sigma: float,
    clip: float,
    sampler_generator: torch.Generator,
    noise_generator: torch.Generator,
    loader_workers: int = 0,
    engine: DPEngine = "opacus",
    chunk_size: int | None = None,
    compiled: bool = False,
    autocast: bool = False,
) -> PrivateTraining | FuncPrivateTraining:
    """``model``/``optimizer`` set up for DP-SGD on ``dataset`` with Poisson batches of mean
    B, by ``engine``. The func engine's options: examples per chunk of per-example gradients
    (``None``: the whole batch), ``torch.compile``, a bfloat16 forward."""
    loader = DataLoader(
        dataset, batch_size=batch_size, generator=sampler_generator, num_workers=loader_workers
    )
    if engine == "func":
        return _func_private(
            model, optimizer, loader, sigma=sigma, clip=clip, noise_generator=noise_generator,
            chunk_size=chunk_size, compiled=compiled, autocast=autocast,
        )  # fmt: skip
    if engine != "opacus":
        raise ValueError(f"unknown DP engine {engine!r}; choose one of {', '.join(DP_ENGINES)}")
    with quiet_opacus():
        engine = PrivacyEngine(accountant="rdp", secure_mode=False)
        module, dp_optimizer, dp_loader = engine.make_private(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=sigma,
            max_grad_norm=clip,
            poisson_sampling=True,
            noise_generator=noise_generator,
        )
    sample_rate, steps = _schedule_of(dp_loader, len(dataset), batch_size)  # type: ignore[arg-type]
    assert isinstance(engine.accountant, RDPAccountant)
    return PrivateTraining(
        module=module,
        optimizer=dp_optimizer,
        loader=dp_loader,
        accountant=engine.accountant,
        sample_rate=sample_rate,
        steps_per_epoch=steps,
    )


def _func_private(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: DataLoader,
    *,
    sigma: float,
    clip: float,
    noise_generator: torch.Generator,
    chunk_size: int | None,
    compiled: bool,
    autocast: bool,
) -> FuncPrivateTraining:
    """The func engine over the loader, sampler and accountant Opacus would make: the
    ``DPDataLoader`` drawing from the loader's own generator, E|B| = int(N q)."""
    n = len(loader.dataset)  # type: ignore[arg-type]
    dp_loader = DPDataLoader.from_data_loader(loader)
    sample_rate, steps = _schedule_of(dp_loader, n, loader.batch_size or 1)
    expected_batch_size = int(n * sample_rate)
    return FuncPrivateTraining(
        model=model, optimizer=optimizer, loader=dp_loader, accountant=RDPAccountant(),
        sample_rate=sample_rate, steps_per_epoch=steps, sigma=sigma, clip=clip,
        expected_batch_size=expected_batch_size, noise_generator=noise_generator,
        chunk_size=chunk_size or largest_plausible_batch(n, sample_rate), compiled=compiled,
        autocast=autocast,
    )  # fmt: skip


def accountant_after(
    accountant: RDPAccountant, *, sigma: float, sample_rate: float, steps: int
) -> RDPAccountant:
    """A copy of ``accountant`` that has also counted ``steps`` DP-SGD steps of (σ, q): the
    history it will hold after them, for checking a budget before spending it.

    The copy steps exactly as the optimizer's hook makes the real one step, so its history
    (adjacent equal (σ, q) merged into one segment) is the one the next round will leave.
    ``accountant`` itself is left as it is.
    """
    planned = RDPAccountant()
    planned.load_state_dict(accountant.state_dict())  # state_dict deep-copies the history
    for _ in range(steps):
        planned.step(noise_multiplier=sigma, sample_rate=sample_rate)
    return planned


def noise_only_step(training: PrivateTraining) -> None:
    """The DP step of an empty Poisson batch: no gradient, noise N(0, σ²C²I) / E|B|, counted.

    Each parameter gets an empty (0, *shape) per-sample gradient, so the DP optimizer
    sums nothing, adds its noise, divides by the expected batch size, calls the
    accountant and steps, exactly as for a non-empty batch.
    """
    optimizer = training.optimizer
    optimizer.zero_grad(set_to_none=True)
    for parameter in optimizer.params:
        parameter.grad_sample = torch.zeros(
            (0, *parameter.shape), dtype=parameter.dtype, device=parameter.device
        )
    optimizer.step()
