"""DP-SGD through Opacus, in one process: clipping, noise scale, empty batches, accounting."""

from __future__ import annotations

import copy
import math
import shutil
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


# some drawn histories (σ down to 0.5, q up to 1/2) have their best order at the end of
# Opacus' grid, and the accountant warns so; the test compares the two results bit for bit
@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")
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


@pytest.mark.parametrize("engine", ["func", "opacus"])
def test_private_model_sees_exactly_the_proxy_batches(
    tmp_path: Path, helpers: Any, engine: str
) -> None:
    """Train one ProxyFL client in-process with tiny Poisson batches (many are empty). The
    proxy's model sees each batch twice: for its logits without gradients (the private
    model's partner), then in its DP step."""
    trainer = helpers.one_client(tmp_path, dp_engine=engine)
    seen: dict[str, list[np.ndarray]] = {"private": [], "partner": [], "proxy": []}
    trainer.private.register_forward_hook(
        lambda m, args, out: seen["private"].append(args[0].detach().numpy().copy())
    )
    shared_logits = trainer.shared_logits

    def recorded_logits(x: torch.Tensor) -> torch.Tensor:
        seen["partner"].append(x.detach().numpy().copy())
        return shared_logits(x)

    trainer.shared_logits = recorded_logits
    step = trainer.dp.step  # what the proxy's step is given (under vmap, no hook sees it)

    def recorded_step(x: torch.Tensor, *args: Any) -> Any:
        seen["proxy"].append(x.detach().numpy().copy())
        return step(x, *args)

    trainer.dp.step = recorded_step
    before = [p.detach().clone() for p in trainer.private.parameters()]
    proxy_before = [p.detach().clone() for p in trainer.dp.model.parameters()]
    losses = trainer.train_round()
    assert losses.empty_batches > 0  # q = 1/30: about a third of the batches are empty
    assert losses.steps + losses.empty_batches == trainer.steps_per_round == 30
    assert len(seen["private"]) == len(seen["partner"]) == len(seen["proxy"]) == losses.steps
    for a, b, c in zip(seen["private"], seen["partner"], seen["proxy"], strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
        assert len(a) > 0
    # The DP model took one accounted step per batch, empty ones included.
    assert trainer.dp.accountant.history == [(trainer.config.sigma, 1 / 30, 30)]
    for old, new in ((before, trainer.private.parameters()),
                     (proxy_before, trainer.dp.model.parameters())):  # fmt: skip
        assert any(not torch.equal(a, b) for a, b in zip(old, new, strict=True))


# -- the func engine (proxyfl/privacy/per_sample.py) against brute force and Opacus -------
MODELS = ["mlp", "cnn1", "cnn2", "resnet18_gn"]


def _batch(n: int = 6, size: int = 16, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = _dataset(n=n, size=size, seed=seed).tensors
    return images.float() / 127.5 - 1, labels


def _both_engines(name: str, dataset: TensorDataset, **kw: Any):
    """The same model, optimizer and seeds under the Opacus and the func engine."""
    torch.manual_seed(0)
    model = build_model(name, n_classes=2, input_size=dataset.tensors[0].shape[-1])
    twin = copy.deepcopy(model)
    opacus = _private(model, dataset, engine="opacus", **kw)
    func = _private(twin, dataset, engine="func", **kw)
    return opacus, func


def _dml(weight: float):
    """The proxy's DML objective with KL weight ``weight`` (as ClientTrainer's)."""
    from proxyfl.algorithms.dml import mutual_learning_loss

    def objective(logits: torch.Tensor, targets: torch.Tensor, partner: torch.Tensor):
        return mutual_learning_loss(logits, partner, targets, weight)

    return objective


def _brute_force_dml(model: torch.nn.Module, x, y, partner, weight: float) -> torch.Tensor:
    """Per-example gradients of the proxy's DML loss, one backward per example."""
    from proxyfl.algorithms.dml import mutual_learning_loss

    grads = []
    for i in range(len(y)):
        model.zero_grad()
        loss = mutual_learning_loss(model(x[i : i + 1]), partner[i : i + 1], y[i : i + 1], weight)
        loss.backward()
        grads.append(torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()]))
    return torch.stack(grads)


@pytest.mark.parametrize("name", MODELS)
def test_func_per_example_gradients_are_brute_forces(name: str) -> None:
    """vmap(grad(ℓ)) gives each example's own gradient of the DML loss, for every model."""
    from proxyfl.privacy.per_sample import clip_factors, per_example_norms

    clip, weight = 1e9, 0.3  # no clipping: the clipped sum is the sum of the raw gradients
    _, func = _both_engines(name, _dataset(), sigma=0.0, clip=clip)
    reference = copy.deepcopy(func.model)
    x, y = _batch()
    partner = torch.randn(len(y), 2, generator=torch.Generator().manual_seed(5))
    raw = _brute_force_dml(reference, x, y, partner, weight)
    func.chunk_size = 4  # two chunks, the second partial
    sums, losses, logits = func.clipped_sum(x, y, _dml(weight), partner)
    summed = torch.cat([sums[n].reshape(-1) for n, _ in func.model.named_parameters()])
    expected = raw.sum(0)  # to float rounding, over all 11 M weights of ResNet-18 too
    assert ((summed - expected).norm() / expected.norm()).item() <= 1e-5
    torch.testing.assert_close(logits, reference(x).detach(), rtol=1e-5, atol=1e-6)
    assert losses.shape == (len(y),)
    # the flat norm is the norm over all parameters of each example's gradient
    grads = [raw[:, :1], raw[:, 1:]]  # any split of the parameters gives the same norm
    torch.testing.assert_close(per_example_norms(grads), raw.norm(dim=1))
    assert (clip_factors(raw.norm(dim=1), 0.1) * raw.norm(dim=1) <= 0.1).all()


@pytest.mark.parametrize("name", MODELS)
def test_func_clipped_noisy_step_is_opacus_step(name: str) -> None:
    """The same batch, seeds and noise generator: the applied gradient (clipped sum plus
    noise, over E|B|) agrees with Opacus' to 1e-5 relative, and the noise is the same
    draws (σ large enough that the noise dominates: then they agree to the last digits)."""
    dataset = _dataset(n=24)
    for sigma in (0.0, 1.0):
        opacus, func = _both_engines(name, dataset, sigma=sigma, clip=0.05)
        x, y = _batch()
        partner = torch.randn(len(y), 2, generator=torch.Generator().manual_seed(5))
        loss_o, logits_o = opacus.step(x, y, _dml(0.3), partner)
        func.chunk_size = 4
        loss_f, logits_f = func.step(x, y, _dml(0.3), partner)
        applied = [torch.cat([p.grad.reshape(-1) for p in t.model.parameters()])
                   for t in (opacus, func)]  # fmt: skip
        assert applied[0].norm() > 0
        relative = ((applied[0] - applied[1]).norm() / applied[0].norm()).item()
        assert relative <= 1e-5, (name, sigma, relative)
        assert float(loss_f) == pytest.approx(float(loss_o), rel=1e-5)
        torch.testing.assert_close(logits_f, logits_o, rtol=1e-5, atol=1e-6)
        assert func.expected_batch_size == opacus.optimizer.expected_batch_size
        assert func.accountant.history == opacus.accountant.history == [(sigma, 1 / 3, 1)]


def test_func_clips_every_example_to_c_in_float32() -> None:
    """No clipped per-example gradient exceeds C (norms, factors and sums in float32)."""
    from proxyfl.privacy.per_sample import clip_factors, per_example_norms

    torch.manual_seed(0)
    model = build_model("cnn1", n_classes=2, input_size=16)
    clip = 0.01
    func = _private(model, _dataset(), sigma=0.0, clip=clip, engine="func")
    x, y = _batch()
    raw = _per_example_gradients(copy.deepcopy(model), x, y)
    assert (raw.norm(dim=1) > clip).all(), "the test needs gradients larger than C"
    factors = clip_factors(per_example_norms([raw]), clip)
    assert ((raw * factors[:, None]).norm(dim=1) <= clip).all()
    sums, _, _ = func.clipped_sum(x, y)
    summed = torch.cat([sums[n].reshape(-1) for n, _ in model.named_parameters()])
    assert summed.dtype == torch.float32
    assert summed.norm() <= len(y) * clip


def test_func_noise_has_standard_deviation_sigma_c_over_expected_batch() -> None:
    torch.manual_seed(0)
    model = build_model("cnn1", n_classes=2, input_size=16)
    sigma, clip = 2.0, 0.5
    training = _private(model, _dataset(), sigma=sigma, clip=clip, engine="func")
    samples = []
    for _ in range(4):
        training.noise_only_step()  # empty batch: the gradient is pure noise
        samples.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    noise = torch.cat(samples).double()
    expected = sigma * clip / training.expected_batch_size
    assert noise.std().item() == pytest.approx(expected, rel=0.03)
    assert abs(noise.mean().item()) < 4 * expected / math.sqrt(noise.numel())
    standardised = (noise - noise.mean()) / noise.std()
    assert (standardised**4).mean().item() == pytest.approx(3.0, abs=0.15)
    assert training.accountant.history == [(sigma, training.sample_rate, 4)]


def test_func_samples_the_batches_opacus_samples() -> None:
    """The same Poisson loader: the same batches from the same sampler generator state."""
    opacus, func = _both_engines("mlp", _dataset(n=41, size=4), batch_size=8)
    assert func.sample_rate == opacus.sample_rate and func.steps_per_epoch == opacus.steps_per_epoch
    for (xa, ya), (xb, yb) in zip(opacus.loader, func.loader, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_func_padding_rows_add_nothing() -> None:
    """A compiled chunk is padded to its size with copies whose clipping factor is 0: the
    sums are those of the real rows alone (run here uncompiled, padded by hand)."""
    _, func = _both_engines("cnn1", _dataset(), sigma=0.0, clip=0.1)
    x, y = _batch(n=3)
    unpadded, _, _ = func.clipped_sum(x, y)
    assert len(func._chunk_functions) == 1  # made once, eager, kept
    func.compiled = True  # now chunks are padded to chunk_size, through the same function
    func.chunk_size = 8
    padded, losses, logits = func.clipped_sum(x, y)
    assert losses.shape == (3,) and logits.shape == (3, 2)
    for name, value in unpadded.items():
        torch.testing.assert_close(padded[name], value, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("engine", ["func", "opacus"])
def test_models_opacus_refuses_are_refused(engine: str) -> None:
    from proxyfl.privacy.dp import DPIncompatibleModelError, check_dp_compatible

    with pytest.raises(DPIncompatibleModelError, match="BatchNorm"):
        check_dp_compatible(torch.nn.Sequential(torch.nn.BatchNorm2d(3)), "bn")


def test_both_engines_train_one_client_alike(tmp_path: Path, helpers: Any) -> None:
    """A round of one ProxyFL client under each engine from the same seeds: the same
    accountant history and ε, the same batches, and losses and weights that agree to
    float rounding (the engines sum in another order)."""
    trainers = {engine: helpers.one_client(tmp_path / engine, dp_engine=engine, batch_size=8)
                for engine in ("func", "opacus")}  # fmt: skip
    losses = {engine: trainer.train_round() for engine, trainer in trainers.items()}
    func, opacus = trainers["func"], trainers["opacus"]
    assert func.dp.accountant.history == opacus.dp.accountant.history
    assert func.epsilon() == opacus.epsilon() > 0
    assert losses["func"].steps == losses["opacus"].steps > 0
    assert losses["func"].shared == pytest.approx(losses["opacus"].shared, rel=1e-4)
    for a, b in zip(func.dp.model.parameters(), opacus.dp.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize(
    ("n", "q"), [(30, 1 / 30), (2338, 1 / 74), (10842, 1 / 339), (5, 1.0), (41, 1 / 6)]
)
def test_largest_plausible_batch_is_the_binomial_quantile(n: int, q: float) -> None:
    """P(|B| > k) ≤ 1e-3 < P(|B| ≥ k) for the returned k, against scipy's binomial."""
    from scipy.stats import binom

    from proxyfl.privacy.per_sample import largest_plausible_batch

    k = largest_plausible_batch(n, q)
    assert binom.sf(k, n, q) <= 1e-3
    assert k == n or binom.sf(k - 1, n, q) > 1e-3


@pytest.mark.slow  # torch.compile on a CPU: ~1 minute of C++ compilation
@pytest.mark.skipif(
    not any(shutil.which(compiler) for compiler in ("g++", "c++", "clang++")),
    reason="torch.compile on a CPU needs a C++ compiler",
)
def test_compiled_training_is_the_eager_training(tmp_path: Path, helpers: Any) -> None:
    """``compile: on`` on a CPU: the private model's forward and the func engine's padded
    chunk function compiled; a round from the same seeds gives the same batches, accountant
    and (to float rounding) weights as the eager round, and Poisson batches of every size
    run without a recompilation after the pre-run check. E|B| = 8, one chunk size: every
    batch is chunks of 8, padded (two sizes, E|B| rounded up and 8, are chunk_plan's, a
    pure function: test_chunk_plans_cover_the_batch_with_two_sizes_and_little_padding;
    each graph is a few C++ compilations, ~40 s of this test's CPU on 2 cores)."""
    import torch._dynamo

    trainers = {
        setting: helpers.one_client(
            tmp_path / setting,
            batch_size=8,
            compile=setting,
            compile_cache=str(tmp_path / "compile-cache"),
        )
        for setting in ("off", "on")
    }
    compiled = trainers["on"]
    assert compiled.private_forward is not compiled.private  # the compiled wrapper
    torch._dynamo.utils.counters.clear()
    compile_seconds = compiled.preflight()
    assert compile_seconds > 0
    losses = {setting: trainer.train_round() for setting, trainer in trainers.items()}
    assert losses["on"].steps == losses["off"].steps > 0
    assert losses["on"].shared == pytest.approx(losses["off"].shared, rel=1e-4)
    assert compiled.dp.accountant.history == trainers["off"].dp.accountant.history
    for a, b in zip(compiled.dp.model.parameters(), trainers["off"].dp.model.parameters(),
                    strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)
    # every graph compiled in the pre-run check, none after: for the one chunk size (E|B| = 8),
    # the chunk function and the private model
    counters = torch._dynamo.utils.counters
    assert compiled.chunk_size == 8 and compiled.dp.chunk_size == 8
    assert compiled.graphs_before_training == 2, dict(counters["stats"])
    assert compiled.recompiles == 0, dict(counters["stats"])
    assert counters["stats"]["unique_graphs"] == 2
    assert (tmp_path / "compile-cache" / "inductor").is_dir() and compiled.compile_cache


@pytest.mark.parametrize("n", range(0, 70))
def test_chunk_plans_cover_the_batch_with_two_sizes_and_little_padding(n: int) -> None:
    from proxyfl.privacy.per_sample import PAD_MULTIPLE, chunk_plan

    for chunk, padded in ((32, True), (32, False), (48, True), (8, True), (4, True)):
        plan = chunk_plan(n, chunk, padded)
        covered = [row for start, real, _ in plan for row in range(start, start + real)]
        assert covered == list(range(n)), (n, chunk, plan)
        sizes = {size for _, _, size in plan}
        assert all(size >= real > 0 for _, real, size in plan)
        if padded:
            assert sizes <= {chunk, PAD_MULTIPLE}  # two graphs at most
            assert sum(size for _, _, size in plan) - n < max(chunk, PAD_MULTIPLE)
            assert sum(size for _, _, size in plan) - n < PAD_MULTIPLE or chunk <= PAD_MULTIPLE
        else:
            assert all(size == real for _, real, size in plan)


def test_a_compiled_chunk_is_the_expected_batch_rounded_within_the_budget() -> None:
    from proxyfl.privacy.per_sample import compiled_chunk_size

    assert compiled_chunk_size(32, 49) == 32
    assert compiled_chunk_size(30, 49) == 32
    assert compiled_chunk_size(32, 20) == 16  # the budget's, rounded down to 8
    assert compiled_chunk_size(3, 3) == 8  # never below the small chunk


@pytest.mark.parametrize("engine", ["opacus", "func"])
def test_the_schedule_is_the_batches_opacus_draws_where_one_over_q_rounds_down(engine: str) -> None:
    """Opacus' sampler draws ``int(1/q)`` batches an epoch: for ⌈N/B⌉ = 93 (N = 2950,
    B = 32) ``1/(1/93)`` is 92.99... and it draws 92. The schedule the ledger and the tables
    plan with is the loader's, and the opacus engine starts (it refused such sizes)."""
    n, batch = 2950, 32
    assert poisson_schedule(n, batch) == (1 / 93, 92)
    assert poisson_schedule(2338, batch) == (1 / 74, 74)  # Table 2's sizes are as before
    dataset = TensorDataset(torch.zeros(n, 3), torch.zeros(n, dtype=torch.long))
    training = _private(torch.nn.Linear(3, 2), dataset, batch_size=batch, engine=engine)
    assert len(training.loader) == training.steps_per_epoch == 92
