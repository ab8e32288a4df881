"""DP-SGD through Opacus, in one process: clipping, noise scale, empty batches, accounting."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from opacus.accountants import RDPAccountant
from torch.utils.data import TensorDataset

from proxyfl.engine.models import build_model
from proxyfl.privacy.accounting import epsilon_from_history, planned_epsilon, poisson_schedule
from proxyfl.privacy.dp import accountant_after, make_private, noise_only_step
from proxyfl.privacy.planned import privacy_report


def _dataset(n: int = 24, size: int = 16, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, size, size), generator=generator, dtype=torch.uint8)
    labels = torch.randint(0, 2, (n,), generator=generator)
    return TensorDataset(images, labels)


def _private(model: torch.nn.Module, dataset: TensorDataset, **kw: Any):
    settings = {"batch_size": 8, "sigma": 1.0, "clip": 0.1}
    settings.update(kw)
    return make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        dataset,
        sampler_generator=torch.Generator().manual_seed(1),
        noise_generator=torch.Generator().manual_seed(2),
        **settings,
    )


def _per_example_gradients(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
    """Per-example gradients by brute force: one backward per example."""
    grads = []
    for i in range(len(y)):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        grads.append(torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()]))
    return torch.stack(grads)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_per_example_clipping_bounds_every_gradient() -> None:
    torch.manual_seed(0)
    model = build_model("cnn1", n_classes=2, input_size=16)
    reference = copy.deepcopy(model)
    clip = 0.1
    training = _private(model, _dataset(), sigma=0.0, clip=clip)
    x = _dataset().tensors[0][:8].float() / 127.5 - 1
    y = _dataset().tensors[1][:8]

    raw = _per_example_gradients(reference, x, y)
    norms = raw.norm(dim=1)
    assert (norms > clip).all(), "the test needs gradients larger than C"

    training.optimizer.zero_grad()
    F.cross_entropy(training.module(x), y).backward()
    opacus_per_example = torch.cat(
        [p.grad_sample.reshape(8, -1) for p in training.module.parameters()], dim=1
    )
    torch.testing.assert_close(opacus_per_example, raw, rtol=1e-4, atol=1e-6)

    training.optimizer.step()  # σ = 0: the step's gradient is Σ clip(g_i) / E|B|
    clipped = raw / torch.clamp(norms / clip, min=1.0)[:, None]
    assert (clipped.norm(dim=1) <= clip * (1 + 1e-5)).all()
    applied = torch.cat([p.grad.reshape(-1) for p in training.module.parameters()])
    expected_batch = training.optimizer.expected_batch_size
    torch.testing.assert_close(applied, clipped.sum(0) / expected_batch, rtol=1e-3, atol=1e-7)
    # Each example's share is bounded by C, so the summed gradient is bounded by |B|·C.
    assert applied.norm() * expected_batch <= 8 * clip * (1 + 1e-5)


def test_noise_has_standard_deviation_sigma_c_over_expected_batch() -> None:
    torch.manual_seed(0)
    model = build_model("cnn1", n_classes=2, input_size=16)
    sigma, clip = 2.0, 0.5
    training = _private(model, _dataset(), sigma=sigma, clip=clip)
    samples = []
    for _ in range(4):
        noise_only_step(training)  # empty batch: the gradient is pure noise
        samples.append(torch.cat([p.grad.reshape(-1) for p in training.module.parameters()]))
    noise = torch.cat(samples).double()
    expected = sigma * clip / training.optimizer.expected_batch_size
    assert noise.numel() > 20_000
    assert noise.std().item() == pytest.approx(expected, rel=0.03)
    assert abs(noise.mean().item()) < 4 * expected / math.sqrt(noise.numel())
    # Kurtosis of a Gaussian is 3.
    standardised = (noise - noise.mean()) / noise.std()
    assert (standardised**4).mean().item() == pytest.approx(3.0, abs=0.15)
    # Every noise-only step was counted by the accountant.
    assert training.accountant.history == [(sigma, training.sample_rate, 4)]


def test_opacus_sampling_matches_the_accounting_convention() -> None:
    for n, batch in [(24, 8), (2338, 32), (41, 8)]:
        model = build_model("mlp", n_classes=2, input_size=4)
        training = _private(model, _dataset(n=n, size=4), batch_size=batch)
        q, steps = poisson_schedule(n, batch)
        assert training.loader.sample_rate == q and len(training.loader) == steps
        assert steps == math.ceil(n / batch)


def test_privacy_tool_reproduces_table_2_of_the_paper() -> None:
    report = privacy_report([2338, 2726, 2937, 2841], sigma=1.4, batch_size=32, epochs=30,
                            delta=1e-5)  # fmt: skip
    assert [round(c["epsilon"], 2) for c in report["clients"]] == [2.36, 2.17, 2.08, 2.12]
    assert round(report["joint"]["epsilon"], 2) == 1.00
    assert report["joint"]["n_train"] == 10842


def test_epsilon_function_is_the_accountants() -> None:
    model = build_model("mlp", n_classes=2, input_size=4)
    training = _private(model, _dataset(n=24, size=4), batch_size=8)
    for _ in range(7):
        noise_only_step(training)
    assert training.accountant.get_epsilon(1e-5) == epsilon_from_history(
        training.accountant.history, 1e-5
    )
    q, steps = poisson_schedule(24, 8)
    assert epsilon_from_history([(1.0, q, 2 * steps)], 1e-5) == planned_epsilon(24, 8, 1.0, 2, 1e-5)
    assert epsilon_from_history([], 1e-5) == 0.0
    assert math.isinf(epsilon_from_history([(0.0, q, 3)], 1e-5))


def test_epsilon_is_the_accountants_to_the_last_bit_for_any_history() -> None:
    """One step's RDP computed once and scaled by T (the accountant recomputes it for every
    question): the same floating-point result for histories of several segments, any δ."""
    rng = np.random.default_rng(7)
    for _ in range(25):
        segments = int(rng.integers(1, 4))
        history = [(float(rng.uniform(0.5, 3.0)), float(1 / rng.integers(2, 200)),
                    int(rng.integers(1, 5000))) for _ in range(segments)]  # fmt: skip
        delta = float(10.0 ** -rng.uniform(3, 8))
        accountant = RDPAccountant()
        accountant.history = list(history)
        assert epsilon_from_history(history, delta) == accountant.get_epsilon(delta), history


def test_planned_accountant_is_the_accountant_after_the_steps() -> None:
    """The budget check's plan: Opacus' own accountant, stepped ahead on a copy."""
    model = build_model("mlp", n_classes=2, input_size=4)
    training = _private(model, _dataset(n=24, size=4), batch_size=8)
    q, steps = training.sample_rate, training.steps_per_epoch
    planned = accountant_after(training.accountant, sigma=1.0, sample_rate=q, steps=steps)
    assert training.accountant.history == []  # the real accountant is left as it was
    assert planned.history == [(1.0, q, steps)]
    for _ in range(steps):
        noise_only_step(training)
    assert training.accountant.history == planned.history  # one merged segment, as Opacus
    again = accountant_after(training.accountant, sigma=1.0, sample_rate=q, steps=2 * steps)
    assert again.history == [(1.0, q, 3 * steps)]
    assert training.accountant.history == [(1.0, q, steps)]
    assert epsilon_from_history(again.history, 1e-5) == planned_epsilon(24, 8, 1.0, 3, 1e-5)
    other = accountant_after(training.accountant, sigma=2.0, sample_rate=q, steps=1)
    assert other.history == [(1.0, q, steps), (2.0, q, 1)]


def test_private_model_sees_exactly_the_proxy_batches(tmp_path: Path, helpers: Any) -> None:
    """Train one ProxyFL client in-process with tiny Poisson batches (many are empty)."""
    from mpi4py import MPI

    from proxyfl.algorithms.strategies import strategy_for
    from proxyfl.comm.graphs import parse_schedule_spec
    from proxyfl.config import TrainConfig
    from proxyfl.engine.data import PatchDataset, open_split
    from proxyfl.engine.runtime import make_runtime
    from proxyfl.trainer import ClientData, ClientTrainer

    stores = helpers.write_stores(tmp_path / "stores", centers=(0,), n_train=30, n_test=4)
    config = TrainConfig(
        algorithm="ProxyFL", data=stores, run_dir=tmp_path / "run", batch_size=1,
        proxy_model="cnn1", private_model=["mlp"], device="cpu",
    )  # fmt: skip
    data = ClientData(
        client=0, center=0, train=PatchDataset([open_split(stores, 0, "train")]),
        test_splits=[open_split(stores, 0, "test")], n_classes=2, patch_size=16,
    )  # fmt: skip
    trainer = ClientTrainer(
        config=config, runtime=make_runtime(MPI.COMM_WORLD, "cpu"),
        strategy=strategy_for("ProxyFL"), data=data,
        schedule=parse_schedule_spec("exponential"), run_dir=tmp_path / "run",
    )  # fmt: skip
    seen: dict[str, list[np.ndarray]] = {"private": [], "proxy": []}
    trainer.private.register_forward_hook(
        lambda m, args, out: seen["private"].append(args[0].detach().numpy().copy())
    )
    trainer.dp.model.register_forward_hook(
        lambda m, args, out: seen["proxy"].append(args[0].detach().numpy().copy())
    )
    before = [p.detach().clone() for p in trainer.private.parameters()]
    losses = trainer.train_round()
    assert losses.empty_batches > 0  # q = 1/30: about a third of the batches are empty
    assert losses.steps + losses.empty_batches == trainer.steps_per_round == 30
    assert len(seen["private"]) == len(seen["proxy"]) == losses.steps
    for a, b in zip(seen["private"], seen["proxy"], strict=True):
        np.testing.assert_array_equal(a, b)
        assert len(a) > 0
    # The DP model took one accounted step per batch, empty ones included.
    assert trainer.dp.accountant.history == [(config.sigma, 1 / 30, 30)]
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.private.parameters(),
                                                     strict=True))  # fmt: skip
