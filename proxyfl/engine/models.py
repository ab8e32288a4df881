"""Model registry: GroupNorm ResNet-18 and the paper's benchmark models, by name.

* ``resnet18_gn``: torchvision's ResNet-18 (``ResNet(BasicBlock, [2, 2, 2, 2])``), random
  init, every BatchNorm replaced by ``GroupNorm(min(32, C), C)`` (the convention of
  Opacus' ``ModuleValidator.fix`` and of Wu & He's paper; all ResNet-18 widths are ≥ 64,
  so 32 groups everywhere), output layer sized to the number of classes. The adaptive
  average pool makes it work at any input size ≥ 16 px. Its blocks add the shortcut out of
  place (``out + identity``) and its ReLUs are not in-place: the per-sample-gradient
  hooks of Opacus cannot see through in-place updates of hooked module outputs.
* ``mlp``, ``cnn1``, ``cnn2``, ``lenet5``: appendix A.1 of the ProxyFL paper (after Shen et
  al. 2020), with the first fully connected layer sized for the actual input:
  MLP = fc(200)-ReLU-fc(200)-ReLU-fc(n); CNN1 = conv3x3(6)-ReLU-pool2-conv3x3(16)-ReLU-
  pool2-fc(64)-ReLU-fc(n); CNN2 = conv3x3(128)-ReLU-pool2-conv3x3(128)-ReLU-pool2-fc(n);
  LeNet-5 = conv5x5(6)-ReLU-pool2-conv5x5(16)-ReLU-pool2-fc(120)-ReLU-fc(84)-ReLU-fc(n).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from proxyfl.names import MODEL_NAMES


class ModelInputError(ValueError):
    """A model cannot take inputs of the requested size."""


def group_norm(channels: int) -> nn.GroupNorm:
    """``GroupNorm(min(32, C), C)``: per-sample statistics, so DP-SGD's analysis holds."""
    return nn.GroupNorm(min(32, channels), channels)


@functools.cache
def _out_of_place_basic_block() -> type[nn.Module]:
    """torchvision's BasicBlock, with the residual sum written out of place. Made on first
    use: importing torchvision costs a rank ~1 s of start-up (bench/bench_startup.py), and
    only ResNet-18 needs it."""
    from torchvision.models.resnet import BasicBlock

    class _OutOfPlaceBasicBlock(BasicBlock):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    return _OutOfPlaceBasicBlock


def resnet18_gn(n_classes: int, input_size: int, in_channels: int = 3) -> nn.Module:
    """GroupNorm ResNet-18 with ``n_classes`` outputs."""
    from torchvision.models.resnet import ResNet

    if input_size < 16:
        raise ModelInputError(f"resnet18_gn needs inputs of at least 16 px, got {input_size}")
    model = ResNet(
        _out_of_place_basic_block(), [2, 2, 2, 2], num_classes=n_classes, norm_layer=group_norm
    )
    if in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    for module in model.modules():
        if isinstance(module, nn.ReLU):
            module.inplace = False
    return model


def _after_conv_pool(size: int, kernel: int) -> int:
    """Side length after a valid ``kernel``×``kernel`` convolution and a 2×2 max pool."""
    return (size - kernel + 1) // 2


class MLP(nn.Module):
    """Two hidden layers of 200 units with ReLU."""

    def __init__(self, n_classes: int, input_size: int, in_channels: int = 3) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_channels * input_size * input_size, 200),
            nn.ReLU(),
            nn.Linear(200, 200),
            nn.ReLU(),
            nn.Linear(200, n_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class _ConvNet(nn.Module):
    """Two conv-ReLU-pool stages followed by fully connected layers."""

    def __init__(
        self,
        name: str,
        n_classes: int,
        input_size: int,
        in_channels: int,
        kernel: int,
        widths: tuple[int, int],
        hidden: tuple[int, ...],
    ) -> None:
        super().__init__()
        side = _after_conv_pool(_after_conv_pool(input_size, kernel), kernel)
        if side < 1:
            smallest = next(
                s
                for s in range(1, 4096)
                if _after_conv_pool(_after_conv_pool(s, kernel), kernel) >= 1
            )
            raise ModelInputError(
                f"{name} needs inputs of at least {smallest} px, got {input_size}"
            )
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], kernel),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(widths[0], widths[1], kernel),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        layers: list[nn.Module] = []
        width = widths[1] * side * side
        for units in hidden:
            layers += [nn.Linear(width, units), nn.ReLU()]
            width = units
        layers.append(nn.Linear(width, n_classes))
        self.classifier = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return self.classifier(self.features(x))
        return self.classifier(self._features_without_gradient(x))

    def _features_without_gradient(self, x: torch.Tensor) -> torch.Tensor:
        """``self.features(x)`` to float32 rounding, in under half the time on a CPU
        (evaluation: every round's forward pass over the merged test set;
        ``bench.bench_startup`` (c)).

        * Each stage is computed as conv → max-pool → ReLU instead of conv → ReLU → max-pool:
          ReLU is monotone non-decreasing, so ``max_i relu(z_i) = relu(max_i z_i)`` exactly,
          and the ReLU runs on a quarter of the values, in place. The pool is
          :func:`max_pool_2x2`, which keeps no indices (nothing is differentiated here).
        * On a CPU the activations are channels-last (NHWC), oneDNN's native layout: the
          channels-first convolution reorders every input and output, which for cnn2's
          128 channels costs more than the arithmetic. The convolutions then sum in another
          order than training's, so logits differ from the training path's in the last
          bits (≤ 1e-6 on the demo's 45 kept models, no prediction changed); the layout is
          the only difference, and the values flattened for the classifier keep their
          (C, H, W) order.
        """
        conv_1, _, _, conv_2, _, _, flatten = self.features
        if x.device.type == "cpu":
            x = x.contiguous(memory_format=torch.channels_last)
        x = max_pool_2x2(conv_1(x)).relu_()
        x = max_pool_2x2(conv_2(x)).relu_()
        return flatten(x)


def max_pool_2x2(x: torch.Tensor) -> torch.Tensor:
    """``F.max_pool2d(x, 2)`` of an (N, C, H, W) tensor, without the indices its CPU kernel
    computes for a backward pass: the element-wise maximum of the four strided views
    ``x[..., i::2, j::2]`` (odd edges dropped, as the pool's floor does). A maximum is
    exact in any order, so the result is the same bits."""
    h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
    top = torch.maximum(x[..., 0:h:2, 0:w:2], x[..., 0:h:2, 1:w:2])
    bottom = torch.maximum(x[..., 1:h:2, 0:w:2], x[..., 1:h:2, 1:w:2])
    return torch.maximum(top, bottom, out=top)


def cnn1(n_classes: int, input_size: int, in_channels: int = 3) -> nn.Module:
    return _ConvNet("cnn1", n_classes, input_size, in_channels, 3, (6, 16), (64,))


def cnn2(n_classes: int, input_size: int, in_channels: int = 3) -> nn.Module:
    return _ConvNet("cnn2", n_classes, input_size, in_channels, 3, (128, 128), ())


def lenet5(n_classes: int, input_size: int, in_channels: int = 3) -> nn.Module:
    return _ConvNet("lenet5", n_classes, input_size, in_channels, 5, (6, 16), (120, 84))


def mlp(n_classes: int, input_size: int, in_channels: int = 3) -> nn.Module:
    return MLP(n_classes, input_size, in_channels)


_REGISTRY: dict[str, Callable[[int, int, int], nn.Module]] = {
    "resnet18_gn": resnet18_gn,
    "mlp": mlp,
    "cnn1": cnn1,
    "cnn2": cnn2,
    "lenet5": lenet5,
}
assert tuple(_REGISTRY) == MODEL_NAMES


def build_model(name: str, n_classes: int, input_size: int, in_channels: int = 3) -> nn.Module:
    """A freshly initialised model (draws from torch's global RNG: seed it first)."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    if n_classes < 2:
        raise ModelInputError(f"a classifier needs at least 2 classes, got {n_classes}")
    return _REGISTRY[name](n_classes, input_size, in_channels)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars (what crosses ranks when the model is shared)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
