"""DP-SGD with per-example gradients from ``torch.func``: Opacus' mechanism, without hooks.

One step on a Poisson batch B (drawn by the same ``DPDataLoader``, from the same sampler
generator, as :func:`proxyfl.privacy.dp.make_private`'s) computes

    g_i = ∇_θ ℓ(θ; x_i, y_i, p_i)                              for every i ∈ B
    g̃  = ( Σ_{i∈B} g_i · min(1, C / (‖g_i‖₂ + 10⁻⁶))  +  N(0, σ² C² I) ) / E|B|

with ``vmap(grad(ℓ))`` over the examples, then lets the plain optimizer (Adam: "DP-Adam")
step on g̃, and the RDP accountant records one step of (σ, q). Exactly what Opacus'
``DPOptimizer`` does with flat clipping:

* ‖g_i‖₂ is one norm over all parameters: each parameter's per-example norm, then the norm
  of those (the same expression as Opacus'), and the clipping factor is Opacus' with a
  margin of 2⁻¹⁸ below C that float32 rounding cannot cross (:func:`clip_factors`);
* the noise is drawn parameter by parameter, in the optimizer's order, from the seeded
  noise generator with the same call, so the same seeds give the same noise bits;
* E|B| = ``int(N q)``, and an empty batch is a noise-only step, counted;
* ℓ is the per-example loss (an :data:`Objective` on a batch of one): cross-entropy, or
  the proxy's DML loss ``(1 − β)·CE + β·KL(softmax(p_i) ‖ softmax(h(x_i)))`` whose partner
  logits p_i (the private model's, detached) are an input of each example, never
  differentiated.

So ε, the ledger, budgets, checkpoints (the optimizer is the plain one, its state the same)
and resume are those of the Opacus engine; the clipped sums agree to float rounding
(``tests/proxyfl/test_dp.py``).

Memory and speed. The per-example gradients of a chunk of c examples take c times the
parameters (ResNet-18: 45 MB an example): the batch is processed in chunks of
``chunk_size`` (sized from a memory budget, :func:`chunk_size_for`) whose clipped sums are
added up. With ``compiled`` the chunk function goes through ``torch.compile``, which
specialises on the chunk's size even with dynamic shapes (``vmap``): chunks are then of
two sizes only (:func:`chunk_plan`), padded with copies of their own examples whose
clipping factor is 0 (their gradient adds exactly nothing), so that Poisson batches of
every size run two compiled graphs instead of one recompilation per size. With
``autocast`` (CUDA) the forward and backward run in bfloat16; the gradients are float32
(the parameters are), and norms, clipping factors and sums are float32, so no clipped g_i
exceeds C.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from opacus.accountants import RDPAccountant
from opacus.data_loader import DPDataLoader
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

# Opacus' DPOptimizer.clip_and_accumulate: min(1, C / (‖g_i‖ + 1e-6))
CLIP_EPSILON = 1e-6
CLIP_MARGIN = 1.0 - 2.0**-18

ChunkFunction = Callable[..., tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]]
# A batch's mean loss from (logits, targets, partner logits or None); on a batch of one
# example, that example's loss (cross-entropy, or the DML loss of proxyfl.algorithms.dml).
Objective = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, _partner: torch.Tensor | None = None
) -> torch.Tensor:
    """The plain objective: cross-entropy, no partner."""
    return F.cross_entropy(logits, targets)


def per_example_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """‖g_i‖₂ over all parameters, from per-example gradients ``(n, *shape)`` of each one:
    each parameter's per-example norm, then the norm of those (Opacus' expression)."""
    per_parameter = [g.reshape(len(g), -1).float().norm(2, dim=-1) for g in grads]
    return torch.stack(per_parameter, dim=1).norm(2, dim=1)


def clip_factors(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """``min(1, C' / (‖g_i‖ + 1e-6))`` with ``C' = C (1 − 2⁻¹⁸)``: scaled by it, no
    example's gradient exceeds C, its norm computed in float32 included.

    Opacus divides C itself, and for a norm of ~100 (ResNet-18's first steps) the 1e-6 is
    below float32's resolution, so a clipped gradient's float32 norm can come out an ulp or
    two above C. The margin of 3.8e-6 (relative) covers the rounding of the product and of
    the norm's sum; it changes a clipped gradient by less than the engines' agreement
    (1e-5) and can only lower the sensitivity the accounting assumes."""
    return (clip * CLIP_MARGIN / (norms + CLIP_EPSILON)).clamp(max=1.0)


# the smaller of the two chunk sizes a compiled engine runs (the other: its chunk_size)
PAD_MULTIPLE = 8
# What a compiled chunk takes of :func:`estimated_bytes_per_example`'s eager estimate: the
# H100's peaks at a chunk of 32 (GN-ResNet-18, 512 px, bf16), 3.82 GB compiled against
# 12.12 GB eager (../shared/gpu): inductor frees each layer's per-example gradients as it
# reduces them.
COMPILED_MEMORY_SHARE = 0.32


def chunk_plan(n: int, chunk_size: int, padded: bool) -> list[tuple[int, int, int]]:
    """``(first row, rows, chunk size)`` of each chunk of a batch of ``n``.

    Eager: chunks of ``chunk_size``, the last one shorter. Padded (compiled: each chunk
    size is a graph): chunks of ``chunk_size``, then the rest in one chunk of
    ``chunk_size`` when it fills all but less than :data:`PAD_MULTIPLE` of it, else in
    chunks of :data:`PAD_MULTIPLE`, the last padded. Two graphs for Poisson batches of every
    size, and fewer than ``PAD_MULTIPLE`` padding rows a batch (11 % of a batch of 32, on
    average, against 53 % for one chunk of the largest plausible batch)."""
    plan, start = [], 0
    while n - start >= chunk_size:
        plan.append((start, chunk_size, chunk_size))
        start += chunk_size
    rest = n - start
    if rest == 0:
        return plan
    if not padded:
        return [*plan, (start, rest, rest)]
    if rest > chunk_size - PAD_MULTIPLE:
        return [*plan, (start, rest, chunk_size)]
    while rest > 0:
        plan.append((start, min(rest, PAD_MULTIPLE), PAD_MULTIPLE))
        start, rest = start + PAD_MULTIPLE, rest - PAD_MULTIPLE
    return plan


def chunk_rows(
    start: int, real: int, size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A chunk of :func:`chunk_plan`: its ``size`` row indices (``real`` rows from
    ``start``, padded with copies of its own rows) and their weights (1, or 0 for
    padding), so that a padded row adds exactly nothing."""
    rows = torch.arange(start, start + real, device=device)
    if size > real:
        rows = rows[torch.arange(size, device=device) % real]
    return rows, (torch.arange(size, device=device) < real).float()


def compiled_chunk_size(expected_batch: int, largest: int) -> int:
    """A compiled engine's chunk: E|B| rounded up to :data:`PAD_MULTIPLE`, at most
    ``largest`` (a memory budget's) and at least :data:`PAD_MULTIPLE`."""
    rounded = -(-expected_batch // PAD_MULTIPLE) * PAD_MULTIPLE
    return max(PAD_MULTIPLE, min(rounded, largest // PAD_MULTIPLE * PAD_MULTIPLE))


def chunk_size_for(budget_bytes: float, bytes_per_example: float, largest_batch: int) -> int:
    """The examples whose per-example gradients fit ``budget_bytes`` together (at least 1,
    at most ``largest_batch``: a batch that fits is one chunk)."""
    if bytes_per_example <= 0:
        return max(1, largest_batch)
    return int(max(1, min(largest_batch, budget_bytes // bytes_per_example)))


def activation_bytes_per_example(model: nn.Module, example: torch.Tensor) -> int:
    """Bytes of the outputs of ``model``'s leaf modules for one example (1, C, H, W): what
    a forward pass holds for its backward (and a bound on an evaluation's working set),
    counted by one forward pass without gradients."""
    counted = 0

    def count(_module: nn.Module, _args: Any, output: Any) -> None:
        nonlocal counted
        if isinstance(output, torch.Tensor):
            counted += output.numel() * output.element_size()

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(count) for m in leaves]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for handle in handles:
            handle.remove()
    return counted


def estimated_bytes_per_example(model: nn.Module, example: torch.Tensor) -> int:
    """What one example adds to a chunk of per-example gradients: its gradient of every
    parameter three times (the gradient, its float32 copy, its clipped product) and its
    activations twice (the forward's, kept for the backward, and the backward's)."""
    parameters = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    return 3 * parameters + 2 * activation_bytes_per_example(model, example)


@dataclass
class FuncPrivateTraining:
    """A model trained with DP-SGD on ``torch.func`` per-example gradients: the model, its
    plain optimizer, the Poisson loader and the accountant (the attributes of
    :class:`proxyfl.privacy.dp.PrivateTraining` that the training loop uses)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loader: DPDataLoader
    accountant: RDPAccountant
    sample_rate: float
    steps_per_epoch: int
    sigma: float
    clip: float
    expected_batch_size: int
    noise_generator: torch.Generator
    chunk_size: int
    compiled: bool = False
    autocast: bool = False
    _chunk_functions: dict[tuple[Objective, bool], ChunkFunction] = field(
        default_factory=dict, repr=False
    )

    @property
    def module(self) -> nn.Module:
        """What the loop calls forward on: the model itself (no wrapper)."""
        return self.model

    @property
    def base_optimizer(self) -> torch.optim.Optimizer:
        return self.optimizer

    def _parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The optimizer's parameters in its order (the noise's order), with their names."""
        names = {id(p): name for name, p in self.model.named_parameters()}
        return [(names[id(p)], p) for group in self.optimizer.param_groups
                for p in group["params"] if p.requires_grad]  # fmt: skip

    def _chunk_function(self, objective: Objective, with_partner: bool) -> ChunkFunction:
        """``(params, buffers, x, y, partner, keep) -> (clipped sums, losses, logits)`` of
        one chunk, compiled once per objective when ``compiled``."""
        key = (objective, with_partner)
        if key not in self._chunk_functions:
            function = _clipped_chunk_sum(
                self.model, self.clip, objective, with_partner=with_partner,
                autocast=self.autocast,
            )  # fmt: skip
            # static shapes: a chunk's size is its graph (chunk_plan), never a dynamic one
            self._chunk_functions[key] = (torch.compile(function, dynamic=False)
                                          if self.compiled else function)  # fmt: skip
        return self._chunk_functions[key]

    def clipped_sum(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        objective: Objective = cross_entropy,
        partner: torch.Tensor | None = None,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """``Σ_i clip(g_i)`` per parameter name, with every example's loss and logits
        (detached), chunk by chunk."""
        parameters = {name: p.detach() for name, p in self._parameters()}
        buffers = {name: b.detach() for name, b in self.model.named_buffers()}
        function = self._chunk_function(objective, partner is not None)
        sums: dict[str, torch.Tensor] = {}
        losses, logits = [], []
        for start, real, size in chunk_plan(x.shape[0], self.chunk_size, self.compiled):
            rows, keep = chunk_rows(start, real, size, x.device)
            chunk_partner = partner[rows] if partner is not None else x.new_zeros(len(rows), 1)
            chunk_sums, chunk_losses, chunk_logits = function(
                parameters, buffers, x[rows], y[rows], chunk_partner, keep
            )
            for name, value in chunk_sums.items():
                sums[name] = sums[name] + value if name in sums else value
            losses.append(chunk_losses[:real])
            logits.append(chunk_logits[:real])
        return sums, torch.cat(losses), torch.cat(logits)

    def step(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        objective: Objective = cross_entropy,
        partner: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One DP-SGD step on the batch; ``(mean loss, logits)``, both detached, on the
        device (nothing here waits for it)."""
        sums, losses, logits = self.clipped_sum(x, y, objective, partner)
        self._noisy_step(sums)
        return losses.mean(), logits

    def noise_only_step(self) -> None:
        """The step of an empty Poisson batch: noise N(0, σ²C²I) / E|B|, counted."""
        self._noisy_step({})

    def _noisy_step(self, sums: dict[str, torch.Tensor]) -> None:
        std = self.sigma * self.clip
        self.optimizer.zero_grad(set_to_none=True)
        for name, parameter in self._parameters():
            summed = sums.get(name)
            if summed is None:
                summed = torch.zeros_like(parameter)
            summed = summed.to(parameter.dtype)
            if std > 0:
                summed = summed + torch.normal(
                    mean=0, std=std, size=summed.shape, device=summed.device,
                    generator=self.noise_generator, dtype=summed.dtype,
                )  # fmt: skip
            parameter.grad = summed.view_as(parameter) / self.expected_batch_size
        self.accountant.step(noise_multiplier=self.sigma, sample_rate=self.sample_rate)
        self.optimizer.step()


def _clipped_chunk_sum(
    model: nn.Module, clip: float, objective: Objective, *, with_partner: bool, autocast: bool
) -> ChunkFunction:
    """The per-chunk function: per-example gradients of the loss by ``vmap(grad(ℓ))``,
    their flat norms, clipping factors (0 for padding rows: ``keep``) and clipped sums."""
    device_type = next(model.parameters()).device.type

    def loss_of_one(
        parameters: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        partner: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
            logits = functional_call(model, (parameters, buffers), (x.unsqueeze(0),))
        logits = logits.float()
        loss = objective(logits, y.unsqueeze(0), partner.unsqueeze(0) if with_partner else None)
        return loss, logits.squeeze(0).detach()

    per_example = vmap(grad_and_value(loss_of_one, has_aux=True), in_dims=(None, None, 0, 0, 0))

    def chunk(
        parameters: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        partner: torch.Tensor,
        keep: torch.Tensor,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        grads, (losses, logits) = per_example(parameters, buffers, x, y, partner)
        factors = clip_factors(per_example_norms(list(grads.values())), clip) * keep
        sums = {name: torch.einsum("i,i...->...", factors, g.float()) for name, g in grads.items()}
        return sums, losses.detach(), logits

    return chunk


def largest_plausible_batch(n: int, sample_rate: float, tail: float = 1e-3) -> int:
    """The (1 − ``tail``) quantile of a Poisson batch's size, Binomial(n, q): the largest
    batch a run will plausibly draw (the pre-run memory check's)."""
    if sample_rate >= 1.0:
        return n
    # the exact binomial tail, summed from the top (n up to a few hundred thousand)
    log_q, log_p = math.log(sample_rate), math.log1p(-sample_rate)
    total, k = 0.0, n
    log_choose = 0.0  # log C(n, n)
    while k > 0:
        probability = math.exp(log_choose + k * log_q + (n - k) * log_p)
        if total + probability > tail:
            return k
        total += probability
        log_choose += math.log(k) - math.log(n - k + 1)  # C(n, k-1) from C(n, k)
        k -= 1
    return 0
