"""The chapter's networks: a ResNet-18 for small images, and the from-scratch notebook's LeNet.

    >>> net = resnet18(num_classes=10, in_channels=1, width=64)   # 11,175,818 parameters
    >>> net(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from mgpu.config import MODEL_NAMES
from mgpu.errors import ConfigError, ShapeError
from mgpu.validators import positive_int

__all__ = ["Residual", "resnet18", "lenet", "init_chapter_weights", "build_model", "check_takes_images"]


class Residual(nn.Module):
    """Two 3x3 conv-BN layers plus a shortcut; a 1x1 conv on the shortcut when the shape changes."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, stride=stride)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1)
        self.bn2 = nn.BatchNorm2d(out_channels)
        needs_projection = stride != 1 or in_channels != out_channels
        self.shortcut = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride) if needs_projection else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C_in, H, W) -> (B, C_out, H/stride, W/stride)
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.shortcut is not None:
            x = self.shortcut(x)
        return F.relu(y + x)


def _stage(in_channels: int, out_channels: int, first: bool) -> nn.Sequential:
    # The first stage keeps the stem's resolution; each later one halves it and doubles channels.
    stride = 1 if first else 2
    return nn.Sequential(Residual(in_channels, out_channels, stride), Residual(out_channels, out_channels))


def resnet18(num_classes: int = 10, in_channels: int = 1, width: int = 64) -> nn.Sequential:
    """d2l's ResNet-18 variant: 3x3 stride-1 stem and no max-pool, since the images are tiny."""
    for name, value in (("num_classes", num_classes), ("in_channels", in_channels), ("width", width)):
        positive_int(value, f"resnet18 {name}")
    return _resnet18(num_classes, in_channels, width)


def _resnet18(num_classes: int, in_channels: int, width: int) -> nn.Sequential:
    """`resnet18` with its arguments taken as given (checked by the caller)."""
    w = width
    return nn.Sequential(
        nn.Conv2d(in_channels, w, kernel_size=3, stride=1, padding=1),  # (B, w, H, W)
        nn.BatchNorm2d(w),
        nn.ReLU(),
        _stage(w, w, first=True),          # (B, w, H, W)
        _stage(w, 2 * w, first=False),     # (B, 2w, H/2, W/2)
        _stage(2 * w, 4 * w, first=False), # (B, 4w, H/4, W/4)
        _stage(4 * w, 8 * w, first=False), # (B, 8w, H/8, W/8)
        nn.AdaptiveAvgPool2d((1, 1)),      # (B, 8w, 1, 1)
        nn.Flatten(),                      # (B, 8w)
        nn.Linear(8 * w, num_classes),     # (B, num_classes)
    )


def lenet(num_classes: int = 10) -> nn.Sequential:
    """The from-scratch notebook's LeNet for 1x28x28 inputs (no BatchNorm)."""
    return nn.Sequential(
        nn.Conv2d(1, 20, kernel_size=3), nn.ReLU(),   # (B, 20, 26, 26)
        nn.AvgPool2d(kernel_size=2, stride=2),        # (B, 20, 13, 13)
        nn.Conv2d(20, 50, kernel_size=5), nn.ReLU(),  # (B, 50, 9, 9)
        nn.AvgPool2d(kernel_size=2, stride=2),        # (B, 50, 4, 4)
        nn.Flatten(),                                 # (B, 800)
        nn.Linear(800, 128), nn.ReLU(),
        nn.Linear(128, num_classes),
    )


def init_chapter_weights(model: nn.Module, std: float = 0.01) -> nn.Module:
    """The chapter's initialisation: N(0, std^2) weights for every Conv2d and Linear."""
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.normal_(m.weight, std=std)
    return model


def build_model(name: str, width: int = 64, num_classes: int = 10, seed: int | None = None) -> nn.Module:
    """A model by name, initialised as a training run does (seeded, on the CPU).

    ResNet-18 gets the chapter's N(0, 0.01^2) initialisation; LeNet keeps PyTorch's default,
    since with std 0.01 it barely moves in a short run.
    """
    if seed is not None:
        torch.manual_seed(seed)
    if name == "resnet18":
        return init_chapter_weights(resnet18(num_classes=num_classes, width=width))
    if name == "lenet":
        return lenet(num_classes=num_classes)
    raise ConfigError(f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)}")


def check_takes_images(name: str, width: int, resize: int | None) -> None:
    """ShapeError when the named model cannot take a run's images (e.g. LeNet and --resize 32).

    Runs the model once on a blank image on the CPU (a fraction of a second for ResNet-18 at
    28x28), leaving the caller's RNG state as it was. The arguments come checked by
    TrainConfig.validate, so the model is built unchecked (and without the chapter's initialisation:
    only its shapes matter).
    """
    side = resize or 28
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            net = _resnet18(10, 1, width) if name == "resnet18" else lenet()
            out = net.eval()(torch.zeros(1, 1, side, side))
    except (RuntimeError, ValueError) as e:
        how = f"--resize {resize}" if resize else "the data"
        raise ShapeError(f"model {name} cannot take 1x{side}x{side} images (from {how}): "
                         f"{str(e).strip().splitlines()[0]}") from None
    if tuple(out.shape) != (1, 10):
        raise ShapeError(f"model {name} gives outputs of shape {tuple(out.shape[1:])} for 1x{side}x{side} "
                         "images, not 10 class scores")
