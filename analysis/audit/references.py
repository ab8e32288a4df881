"""Reference models for LiRA offline: the same architecture trained on random halves of the
audited patches, without them being the audited model.

For R (even) reference models over N examples, each example is IN the training data of
exactly R/2 of them, the halves drawn from a seeded generator (the balanced design of
Carlini et al.'s code), so every example has R/2 OUT models to calibrate against. Each is
trained like the private models (no DP): Adam at the private learning rate, shuffled
mini-batches of B, for rounds × local_epochs epochs. The audit of a DP model with
references trained without DP is a weaker attack than one with DP references, never an
invalid one: any score gives a valid AUC.
"""

from __future__ import annotations

import logging
from concurrent.futures import BrokenExecutor, Executor, Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from analysis.audit.workers import ReferenceTrainingError
from plumbing.errors import describe
from proxyfl.engine.data import prepare_images
from proxyfl.engine.models import build_model
from proxyfl.engine.runtime import derived_seed

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReferenceRecipe:
    """How the reference models are trained."""

    architecture: str
    n_classes: int
    input_size: int
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float


@dataclass(frozen=True)
class References:
    """Logits of R reference models on N examples, and which of them each one trained on."""

    logits: np.ndarray  # (R, N, C)
    trained_on: np.ndarray  # (R, N) bool

    @property
    def out_mask(self) -> np.ndarray:
        return ~self.trained_on


def balanced_halves(count: int, n_examples: int, seed: int) -> np.ndarray:
    """(count, n) bool: example j is in exactly ``count / 2`` rows, chosen at random."""
    if count < 2 or count % 2:
        raise ValueError(f"reference models come in pairs (2, 4, ...); got {count}")
    generator = np.random.default_rng(seed)
    order = np.argsort(generator.random((count, n_examples)), axis=0)
    return order < count // 2


@torch.inference_mode()
def model_logits(
    model: torch.nn.Module, images: np.ndarray, input_size: int, batch_size: int = 256
) -> np.ndarray:
    """``model``'s logits (float64, N × C) on uint8 (N, S, S, 3) ``images``."""
    device = next(model.parameters()).device
    model.eval()
    out = []
    for start in range(0, len(images), batch_size):
        block = torch.from_numpy(
            np.ascontiguousarray(images[start : start + batch_size].transpose(0, 3, 1, 2))
        )
        out.append(model(prepare_images(block, device, input_size)).double().cpu().numpy())
    return np.concatenate(out)


def train_reference(
    recipe: ReferenceRecipe, images: np.ndarray, labels: np.ndarray, seed: int
) -> torch.nn.Module:
    """One model of ``recipe`` trained on ``images`` and ``labels`` (CPU)."""
    torch.manual_seed(seed)
    model = build_model(recipe.architecture, recipe.n_classes, recipe.input_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=recipe.lr,
                                 weight_decay=recipe.weight_decay)  # fmt: skip
    x_all = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
    y_all = torch.from_numpy(labels.astype(np.int64))
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(recipe.epochs):
        order = torch.randperm(len(x_all), generator=generator)
        for start in range(0, len(order), recipe.batch_size):
            batch = order[start : start + recipe.batch_size]
            x = prepare_images(x_all[batch], torch.device("cpu"), recipe.input_size)
            loss = F.cross_entropy(model(x), y_all[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return model.eval()


def reference_logits(
    recipe: ReferenceRecipe,
    images: np.ndarray,
    labels: np.ndarray,
    seed: int,
    evaluated: np.ndarray,
) -> np.ndarray:
    """The logits on ``evaluated`` of the model of ``recipe`` trained on ``images`` and
    ``labels`` with ``seed``: one reference model's work, in this process or a worker's."""
    return model_logits(train_reference(recipe, images, labels, seed), evaluated,
                        recipe.input_size)  # fmt: skip


def _submitted(pool: Executor, job: tuple[Any, ...]) -> Future[np.ndarray]:
    """``reference_logits(*job)`` in ``pool``. A pool a dead worker broke refuses new work
    at once: that error is handed back as the model's result, reported like any other."""
    try:
        return pool.submit(reference_logits, *job)
    except BrokenExecutor as error:
        refused: Future[np.ndarray] = Future()
        refused.set_exception(error)
        return refused


def train_references(
    recipe: ReferenceRecipe,
    images: np.ndarray,
    labels: np.ndarray,
    count: int,
    seed: int,
    pool: Executor | None = None,
    where: str = "",
) -> References:
    """``count`` reference models of ``recipe``, each on its half of the examples, and
    their logits on all of them: trained one after the other here, or side by side in
    ``pool`` (:mod:`.workers`: the same bits). ``where`` names the examples in errors."""
    trained_on = balanced_halves(count, len(images), derived_seed(seed, "reference-halves"))
    jobs = [(recipe, images[inside], labels[inside],
             derived_seed(seed, "reference-model", index), images)
            for index, inside in enumerate(trained_on)]  # fmt: skip
    # in a pool, every model is submitted before any result is awaited
    pending = None if pool is None else [_submitted(pool, job) for job in jobs]
    logits = []
    for index, inside in enumerate(trained_on):
        subject = (f"reference model {index + 1}/{count} ({recipe.architecture}"
                   + (f", {where}" if where else "") + ")")  # fmt: skip
        if pending is None:
            logits.append(reference_logits(*jobs[index]))
        else:
            try:
                logits.append(pending[index].result())
            except Exception as error:  # raised in the worker, or the worker died
                for future in pending:
                    future.cancel()
                raise ReferenceTrainingError(subject, f"training failed: {describe(error)}"
                                             ) from error  # fmt: skip
        logger.info("%s trained on %d patches", subject, int(inside.sum()))
    return References(logits=np.stack(logits), trained_on=trained_on)
