"""Deep mutual learning (DML) losses of ProxyFL's private and proxy models.

For a mini-batch B, private model f and proxy h (logits),

    L_private = (1 - α) · CE(f(x), y) + α · KL(softmax(h(x)) ‖ softmax(f(x)))
    L_proxy   = (1 - β) · CE(h(x), y) + β · KL(softmax(f(x)) ‖ softmax(h(x)))

each averaged over the batch (KL with ``reduction='batchmean'``, as the reference code's
``KLDivLoss(log_softmax(own), softmax(other).detach())``). The other model's output is
detached in each loss, so each model's gradient comes from its own loss only. The proxy's
loss is a mean of per-example terms, which DP-SGD clips example by example.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def distillation_kl(own_logits: torch.Tensor, other_logits: torch.Tensor) -> torch.Tensor:
    """``KL(softmax(other) ‖ softmax(own))`` averaged over the batch; ``other`` detached."""
    return F.kl_div(
        F.log_softmax(own_logits, dim=-1),
        F.softmax(other_logits.detach(), dim=-1),
        reduction="batchmean",
    )


def mutual_learning_loss(
    own_logits: torch.Tensor, other_logits: torch.Tensor, targets: torch.Tensor, weight: float
) -> torch.Tensor:
    """``(1 - weight) · CE(own, y) + weight · KL(other ‖ own)``."""
    cross_entropy = F.cross_entropy(own_logits, targets)
    if weight == 0.0:
        return cross_entropy
    return (1.0 - weight) * cross_entropy + weight * distillation_kl(own_logits, other_logits)


def mutual_learning_losses(
    own_logits: torch.Tensor, other_logits: torch.Tensor, targets: torch.Tensor, weight: float
) -> torch.Tensor:
    """Each example's ``(1 - weight) · CE + weight · KL(other ‖ own)``, shape (n,): their
    mean is :func:`mutual_learning_loss` (``batchmean`` is the sum over classes and
    examples over n). A batch cut in chunks sums its chunks' terms and divides by n."""
    cross_entropy = F.cross_entropy(own_logits, targets, reduction="none")
    if weight == 0.0:
        return cross_entropy
    kl = F.kl_div(
        F.log_softmax(own_logits, dim=-1),
        F.softmax(other_logits.detach(), dim=-1),
        reduction="none",
    ).sum(dim=-1)
    return (1.0 - weight) * cross_entropy + weight * kl


def dml_losses(
    private_logits: torch.Tensor,
    proxy_logits: torch.Tensor,
    targets: torch.Tensor,
    alpha: float,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L_private, L_proxy)`` of one mini-batch (both models saw the same batch)."""
    private_loss = mutual_learning_loss(private_logits, proxy_logits, targets, alpha)
    proxy_loss = mutual_learning_loss(proxy_logits, private_logits, targets, beta)
    return private_loss, proxy_loss
