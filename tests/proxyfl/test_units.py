"""In-process unit tests: models, losses, graphs, evaluation, configuration, devices, buffers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from opacus.validators import ModuleValidator
from pydantic import ValidationError
from torch import nn

from proxyfl.algorithms.dml import dml_losses
from proxyfl.comm.exchange import assign_flat_parameters, flatten_parameters
from proxyfl.comm.graphs import check_column_stochastic, exponential_offset, parse_schedule_spec
from proxyfl.config import TrainConfig
from proxyfl.engine.evaluate import confusion_matrix, scores_from_confusion
from proxyfl.engine.models import (
    ModelInputError,
    build_model,
    count_parameters,
    max_pool_2x2,
)
from proxyfl.engine.runtime import DeviceError, choose_device, derived_seed
from proxyfl.names import MODEL_NAMES


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize(("size", "classes"), [(16, 2), (28, 5)])
def test_registry_models_fit_any_size_and_class_count(name: str, size: int, classes: int) -> None:
    model = build_model(name, n_classes=classes, input_size=size)
    assert model(torch.zeros(3, 3, size, size)).shape == (3, classes)
    assert ModuleValidator.validate(model, strict=False) == []  # trainable with DP-SGD


def test_resnet18_gn_is_torchvision_resnet18_with_group_norm() -> None:
    import torchvision

    model = build_model("resnet18_gn", n_classes=2, input_size=32)
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert norms and all(m.num_groups == 32 for m in norms)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    reference = torchvision.models.resnet18(num_classes=2)
    assert count_parameters(model) == count_parameters(reference)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in reference.named_parameters()]


def test_paper_models_have_the_appendix_layers() -> None:
    mlp = build_model("mlp", n_classes=10, input_size=28, in_channels=1)
    assert [m.out_features for m in mlp.modules() if isinstance(m, nn.Linear)] == [200, 200, 10]
    cnn1 = build_model("cnn1", n_classes=10, input_size=32)
    assert [m.out_channels for m in cnn1.modules() if isinstance(m, nn.Conv2d)] == [6, 16]
    assert [m.out_features for m in cnn1.modules() if isinstance(m, nn.Linear)] == [64, 10]
    cnn2 = build_model("cnn2", n_classes=10, input_size=32)
    assert [m.out_channels for m in cnn2.modules() if isinstance(m, nn.Conv2d)] == [128, 128]
    lenet = build_model("lenet5", n_classes=10, input_size=28, in_channels=1)
    assert [m.out_features for m in lenet.modules() if isinstance(m, nn.Linear)] == [120, 84, 10]
    assert lenet.classifier[0].in_features == 16 * 4 * 4  # the classic LeNet-5 on 28 px


def test_models_reject_inputs_too_small_and_unknown_names() -> None:
    with pytest.raises(ModelInputError, match="at least"):
        build_model("lenet5", n_classes=2, input_size=8)
    with pytest.raises(KeyError, match="unknown model"):
        build_model("resnet50", n_classes=2, input_size=32)


@pytest.mark.parametrize("name", ["cnn1", "cnn2", "lenet5"])
@pytest.mark.parametrize("size", [32, 29])
def test_conv_nets_evaluate_as_they_train(name: str, size: int) -> None:
    """The inference path (channels-last conv → pool → ReLU, no indices) computes the
    training path's function: logits equal to float32 rounding and the same predictions,
    rows of exact zeros included; a forward with gradients still takes the training path."""
    torch.manual_seed(0)
    model = build_model(name, n_classes=2, input_size=size).eval()
    x = torch.randn(70, 3, size, size)
    x[:5] = 0.0  # rows whose activations are exact zeros after the first conv's bias
    x[5:10] = -x[5:10].abs()
    with torch.no_grad():
        trained_path = model.classifier(model.features(x))
    with torch.inference_mode():
        inference_path = model(x)
    torch.testing.assert_close(inference_path, trained_path, rtol=1e-5, atol=1e-5)
    margin = (trained_path[:, 0] - trained_path[:, 1]).abs()
    decided = margin > 1e-4  # a near-tie may go either way within rounding
    assert decided.sum() > 50
    assert torch.equal(inference_path.argmax(1)[decided], trained_path.argmax(1)[decided])
    assert model.training is False  # and a forward with gradients still trains through it
    model.train()
    model(x[10:14]).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_conv_nets_infer_channels_last_on_a_cpu() -> None:
    """The layout is what makes evaluation fast on a CPU (bench startup (c)): every
    convolution of the inference path sees channels-last input, the training path's do not."""
    torch.manual_seed(0)
    model = build_model("cnn2", n_classes=2, input_size=32)
    layouts: list[tuple[bool, bool]] = []
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            module.register_forward_hook(lambda _m, args, _out: layouts.append((
                torch.is_grad_enabled(),
                args[0].is_contiguous(memory_format=torch.channels_last),
            )))  # fmt: skip
    x = torch.randn(4, 3, 32, 32)
    with torch.inference_mode():
        model(x)
    model(x)
    assert layouts == [(False, True), (False, True), (True, False), (True, False)]


@pytest.mark.parametrize("shape", [(3, 5, 30, 30), (2, 4, 13, 13), (1, 2, 7, 10)])
def test_max_pool_2x2_is_max_pool2d(shape: tuple[int, ...]) -> None:
    torch.manual_seed(1)
    x = torch.randn(shape)
    x[0, 0, :2, :2] = float("nan")
    x[-1, -1, 2:4, 2:4] = -0.0
    torch.testing.assert_close(max_pool_2x2(x), torch.nn.functional.max_pool2d(x, 2),
                               rtol=0, atol=0, equal_nan=True)  # fmt: skip


def test_dml_losses_mix_cross_entropy_and_detached_kl() -> None:
    torch.manual_seed(0)
    private = torch.randn(6, 3, requires_grad=True)
    proxy = torch.randn(6, 3, requires_grad=True)
    y = torch.randint(0, 3, (6,))
    private_loss, proxy_loss = dml_losses(private, proxy, y, alpha=0.3, beta=0.6)
    ce = nn.functional.cross_entropy(private, y)
    kl = nn.functional.kl_div(private.log_softmax(-1), proxy.softmax(-1), reduction="batchmean")
    assert private_loss.item() == pytest.approx((0.7 * ce + 0.3 * kl).item(), rel=1e-6)
    # Each loss moves only its own model.
    private_loss.backward()
    assert proxy.grad is None and private.grad is not None
    proxy_loss.backward()
    assert proxy.grad is not None
    same, _ = dml_losses(private, private.detach(), y, alpha=0.5, beta=0.5)
    assert same.item() == pytest.approx(0.5 * ce.item(), rel=1e-6)  # KL(p‖p) = 0


def test_exponential_schedule_matches_the_paper() -> None:
    schedule = parse_schedule_spec("exponential")
    assert [exponential_offset(t, 4) for t in range(5)] == [1, 2, 1, 2, 1]
    assert [exponential_offset(t, 8) for t in range(4)] == [1, 2, 4, 1]
    assert [exponential_offset(t, 2) for t in range(3)] == [1, 1, 1]
    for t in range(4):
        matrix = schedule.matrix(t, [0, 1, 2, 3, 4, 5, 6, 7], 8)
        check_column_stochastic(matrix)
        assert sorted(matrix.sum(axis=1)) == [1.0] * 8  # a permutation
        s = exponential_offset(t, 8)
        assert all(matrix[(k + s) % 8, k] == 1.0 for k in range(8))
    uneven = parse_schedule_spec("exponential_uneven").matrix(0, [0, 2, 3], 4)
    check_column_stochastic(uneven)
    assert not np.allclose(uneven.sum(axis=1), 1.0)  # not row-stochastic


def test_graph_file_is_validated(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[[[0.5, 0.5], [0.4, 0.5]]]")
    with pytest.raises(ValueError, match="not column-stochastic"):
        parse_schedule_spec(f"file:{bad}")
    with pytest.raises(ValueError, match="unknown graph"):
        parse_schedule_spec("ring-of-fire")


def test_macro_accuracy_is_mean_per_class_recall() -> None:
    targets = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    predictions = np.array([0, 0, 0, 1, 1, 0, 2, 2])
    scores = scores_from_confusion(confusion_matrix(predictions, targets, 4))
    assert scores.accuracy == pytest.approx(6 / 8)
    assert scores.macro_accuracy == pytest.approx((3 / 4 + 1 / 2 + 1) / 3)
    assert scores.per_class_recall[3] is None  # absent class left out of the mean


def test_config_defaults_are_the_papers_histopathology_setting() -> None:
    config = TrainConfig()
    assert (config.rounds, config.local_epochs, config.batch_size, config.lr) == (30, 1, 32, 1e-3)
    assert (config.sigma, config.clip, config.delta) == (1.4, 0.7, 1e-5)
    assert (config.dml_alpha, config.dml_beta) == (0.3, 0.3)
    assert config.proxy_model == "resnet18_gn" and config.private_model == ["resnet18_gn"]
    assert config.graph == "exponential" and config.input_size is None


def test_devices_and_seeds() -> None:
    assert choose_device("cpu", 3) == torch.device("cpu")
    if not torch.cuda.is_available():
        assert choose_device("auto", 1) == torch.device("cpu")
        with pytest.raises(DeviceError, match="no CUDA GPU"):
            choose_device("cuda", 0)
    else:
        count = torch.cuda.device_count()
        assert choose_device("auto", count + 1) == torch.device("cuda", (count + 1) % count)
    assert derived_seed(0, "noise", 1) != derived_seed(0, "noise", 2)
    assert derived_seed(0, "noise", 1) == derived_seed(0, "noise", 1)
    # Keys are taken modulo 2**32 and the seed fits torch's 64-bit signed range.
    assert derived_seed(0, "a", -1) == derived_seed(0, "a", 2**32 - 1)
    assert 0 <= derived_seed(0, "a", -1) < 2**63 and derived_seed(0, "a", -1) != derived_seed(
        0, "a"
    )


def test_flat_buffer_round_trip() -> None:
    model = build_model("cnn1", n_classes=3, input_size=16)
    flat = flatten_parameters(model)
    assert flat.dtype == np.float32 and flat.flags.c_contiguous
    assert flat.size == count_parameters(model)
    other = build_model("cnn1", n_classes=3, input_size=16)
    assign_flat_parameters(other, flat)
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="values"):
        assign_flat_parameters(other, flat[:-1])


def test_flat_buffers_share_no_memory_with_the_model() -> None:
    """The MPI buffers are copies both ways: changing one never changes the other."""
    model = build_model("cnn1", n_classes=2, input_size=16)
    flat = flatten_parameters(model)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert not np.array_equal(flatten_parameters(model), flat)

    received = flat.astype(np.float64) * 2  # any float array: set as the parameters' float32
    assign_flat_parameters(model, received)
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters())
    np.testing.assert_array_equal(flatten_parameters(model), received.astype(np.float32))
    received[:] = 0.0  # the caller reuses its buffer
    np.testing.assert_array_equal(flatten_parameters(model), flat * 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)  # still trainable parameters
    model(torch.zeros(2, 3, 16, 16)).sum().backward()
    optimizer.step()
    assert not np.array_equal(flatten_parameters(model), flat * 2)


def test_private_learning_rate_defaults_to_the_papers_single_rate() -> None:
    assert TrainConfig(lr=0.01).private_learning_rate == 0.01
    assert TrainConfig(lr=0.01, private_lr=0.001).private_learning_rate == 0.001
    with pytest.raises(ValidationError, match="private_lr"):
        TrainConfig(private_lr=0)
