"""The chapter's networks: sizes, shapes, initialisation."""

import pytest
import torch
from torch import nn

from mgpu.config import MODEL_NAMES
from mgpu.errors import ConfigError
from mgpu.models import build_model, lenet, resnet18


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_resnet18_has_the_chapters_parameter_count():
    assert n_params(resnet18(num_classes=10, in_channels=1, width=64)) == 11_175_818


def test_resnet18_is_the_small_image_variant():
    net = resnet18(width=8)
    stem = net[0]
    assert isinstance(stem, nn.Conv2d) and stem.kernel_size == (3, 3) and stem.stride == (1, 1) and stem.padding == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in net.modules()), "the variant has no max-pool"
    widths = [m.out_channels for m in net.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1)]
    assert widths == [16, 32, 64], f"stage projections should widen 8 -> 16 -> 32 -> 64, got {widths}"


@pytest.mark.parametrize("side", [28, 32, 96])
def test_resnet18_output_shape(side):
    out = resnet18(num_classes=7, width=4)(torch.zeros(3, 1, side, side))
    assert out.shape == (3, 7), f"{side}x{side} input gave {tuple(out.shape)}"


def test_resnet18_takes_other_channel_counts():
    assert resnet18(in_channels=3, width=4)(torch.zeros(2, 3, 28, 28)).shape == (2, 10)


def test_lenet_output_shape_and_layers():
    net = lenet()
    assert net(torch.zeros(5, 1, 28, 28)).shape == (5, 10)
    convs = [(m.in_channels, m.out_channels, m.kernel_size) for m in net.modules() if isinstance(m, nn.Conv2d)]
    linears = [(m.in_features, m.out_features) for m in net.modules() if isinstance(m, nn.Linear)]
    assert convs == [(1, 20, (3, 3)), (20, 50, (5, 5))] and linears == [(800, 128), (128, 10)]


def test_resnet18_gets_the_chapters_initialisation():
    net = build_model("resnet18", width=16, seed=0)
    weights = torch.cat([m.weight.flatten() for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))])
    assert abs(weights.std().item() - 0.01) < 0.001, f"weights std {weights.std().item():.4f}, expected N(0, 0.01^2)"


def test_build_model_is_seeded():
    a, b = build_model("lenet", seed=3).state_dict(), build_model("lenet", seed=3).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a), "same seed must give the same initial weights"


@pytest.mark.parametrize("kwargs, match", [
    ({"width": 0}, "width must be a positive integer"),
    ({"num_classes": -1}, "num_classes must be a positive integer"),
    ({"in_channels": 1.5}, "in_channels must be a positive integer"),
])
def test_resnet18_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        resnet18(**kwargs)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_build_model_builds_every_model_a_config_may_name(name):
    assert build_model(name, width=4, seed=0)(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_build_model_rejects_unknown_names():
    with pytest.raises(ConfigError, match="unknown model 'vgg': choose one of resnet18, lenet"):
        build_model("vgg")
