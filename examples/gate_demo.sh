#!/usr/bin/env bash
# The gate on a repository that is not mgpu (docs/guide/gate.md): a small model at two commits, the second
# with a slower forward, in REPO (default /tmp/mgpu-gate-demo). Then, with mgpu installed:
#     cd REPO && pytest --ab-baseline HEAD~1          # slower, exit 1
#     cd REPO && pytest --ab-baseline HEAD            # both arms the same commit: no `slower`, exit 0
#     cd REPO && python -m mgpu gate model.py:spec --baseline HEAD~1 --strategies single,ddp --devices 1,2
#     cd REPO && python -m mgpu bench model.py:spec --batch 128
set -euo pipefail
REPO=${1:-/tmp/mgpu-gate-demo}
rm -rf "$REPO" && mkdir -p "$REPO" && cd "$REPO" && git init -q
cat > model.py <<'PY'
"""A small MLP classifier (the user's model), in mgpu's model contract."""
import torch
from torch import nn

from mgpu.spec import ModelSpec

EXTRA_LAYERS = 0  # hidden layers applied again in forward


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.hidden, self.out = nn.Linear(128, 512), nn.Linear(512, 512), nn.Linear(512, 10)

    def forward(self, x):  # (B, 128) -> (B, 10)
        h = torch.relu(self.inp(x))
        for _ in range(1 + EXTRA_LAYERS):
            h = torch.relu(self.hidden(h))
        return self.out(h)


def draw(n, g):
    return torch.randn(n, 128, generator=g), torch.randint(0, 10, (n,), generator=g)


def spec():
    return ModelSpec(build=MLP, draw=draw, name="mlp")
PY
cat > test_speed.py <<'PY'
import pytest


@pytest.mark.mgpu_gate(model="model.py:spec", strategy="single", devices=1, batch=128)
def test_single_step(mgpu_workload):
    mgpu_workload.op()


@pytest.mark.mgpu_gate(model="model.py:spec", strategy="ddp", devices=2, batch=128)
def test_ddp_step(mgpu_workload):
    mgpu_workload.op()


def test_the_model_maps_a_batch_to_class_scores():
    import torch

    from model import spec
    inputs, _ = spec().draw(4, torch.Generator())
    assert spec().build()(inputs).shape == (4, 10)
PY
git add . && git -c user.name=demo -c user.email=demo@example.com commit -qm "mlp"
sed -i 's/^EXTRA_LAYERS = 0/EXTRA_LAYERS = 1/' model.py
git -c user.name=demo -c user.email=demo@example.com commit -qam "forward: the hidden layer once more (slower)"
git log --oneline
