"""Shapes of public training scripts that check-script once got wrong (docs/notes/public-scripts.md,
2026-11-28): timm's task calls `trainable_module = DDP(model)` inside a container and passes the labels
(a 1-D integer tensor) to its forward; Lightning's `training_step` takes them too; an unseeded script
under torchrun starts each rank from its own random torch seed (torch 2.14), not from one shared seed.

    pytest scriptcheck_tests/test_public_shapes.py
"""

from __future__ import annotations

import multiprocessing
import textwrap

import pytest
import torch
from torch import nn
from torch.nn.parallel import DataParallel

from mgpu.check.script.inrank.inputs import tensor_digest
from mgpu.check.script.inrank.names import strip_wrappers, wrapper_paths
from mgpu.scriptcheck import run_check_script

pytestmark = [pytest.mark.reliability]

# timm's shape: a task module holding DDP(model) at N ranks (the plain model at 1), called with the labels.
TASK_WITH_DDP_INSIDE = """
import os, torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler

class Task(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.trainable_module = model
    def forward(self, x, y):  # y: the labels, a 1-D integer tensor
        return F.cross_entropy(self.trainable_module(x), y)

world = int(os.environ.get("WORLD_SIZE", 1))
if world > 1:
    dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
sampler = DistributedSampler(data, shuffle=False) if world > 1 else None
loader = DataLoader(data, batch_size=16 // world, sampler=sampler)
task = Task(nn.Linear(8, 3))
if world > 1:
    task.trainable_module = DDP(task.trainable_module)
optimizer = torch.optim.SGD(task.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    task(x, y).backward()
    optimizer.step()
"""

# An unseeded DDP loop: each rank of a fresh `torchrun` starts from its own torch seed.
UNSEEDED = """
import os, torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
world = int(os.environ.get("WORLD_SIZE", 1))
if world > 1:
    dist.init_process_group("gloo")
g = torch.Generator().manual_seed(0)
x, y = torch.randn(16, 8, generator=g), torch.randn(16, 3, generator=g)
net = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.1), nn.Linear(16, 3))
model = DDP(net) if world > 1 else net
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
rank = int(os.environ.get("RANK", 0))
for step in range(3):
    optimizer.zero_grad()
    F.mse_loss(model(x[rank::world]), y[rank::world]).backward()
    optimizer.step()
"""


def test_a_ddp_inside_a_task_called_with_its_labels_passes(tmp_path):
    path = tmp_path / "task.py"
    path.write_text(textwrap.dedent(TASK_WITH_DDP_INSIDE))
    report = run_check_script(str(path), ranks=(1, 2), steps=2)
    assert report.verdict == "passed", report.text()


def test_an_unseeded_script_is_not_verified_and_its_ranks_are_not_said_to_draw_alike(tmp_path):
    path = tmp_path / "unseeded.py"
    path.write_text(textwrap.dedent(UNSEEDED))
    report = run_check_script(str(path), ranks=(1, 2), steps=2)
    assert report.verdict == "not verified" and "not seeded" in report.summary(), report.text()
    assert "same-random-numbers" not in {f.name for f in report.findings}, report.text()


def test_a_wrappers_module_segment_is_stripped_wherever_the_wrapper_sits():
    task = nn.Module()
    task.trainable_module = DataParallel(nn.Linear(2, 2))  # DDP needs a process group; the rule is the same
    wrapped = wrapper_paths(task)
    assert wrapped == (("trainable_module", "module"),), wrapped
    names = sorted(strip_wrappers(n, wrapped) for n, _ in task.named_parameters())
    assert names == ["trainable_module.bias", "trainable_module.weight"], names
    assert strip_wrappers("module._orig_mod.fc1.weight") == "fc1.weight"
    assert strip_wrappers("net.module.fc.weight") == "net.module.fc.weight", "a layer a user named `module` stays"


def test_a_zero_dimensional_tensor_has_a_digest():
    assert tensor_digest(torch.tensor(3)) != tensor_digest(torch.tensor(4))
    assert tensor_digest(torch.tensor(3)) == tensor_digest(torch.tensor([3]).reshape(()))


def _fresh_seed(queue):
    from mgpu.check.script.inrank import rank
    from mgpu.check.script.plan import ScriptRankJob

    rank._fresh_process_state(ScriptRankJob(None, "m", ".", (), 1, ".", "t"))
    queue.put(torch.initial_seed())


def test_forked_ranks_start_from_the_seeds_fresh_processes_of_this_torch_would_have():
    fixed = torch.initial_seed() == 67280421310721  # a torch that seeds every process alike
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    workers = [context.Process(target=_fresh_seed, args=(queue,)) for _ in range(2)]
    for w in workers:
        w.start()
    seeds = [queue.get(timeout=60) for _ in workers]
    for w in workers:
        w.join()
    assert (seeds[0] == seeds[1]) is fixed, f"two forked ranks started from seeds {seeds} (this torch: fixed={fixed})"
