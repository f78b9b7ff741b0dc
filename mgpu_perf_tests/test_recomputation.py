"""The counted step sees recomputation (issue 47, item 0): activation checkpointing
(`torch.utils.checkpoint`, non-reentrant and reentrant) runs a region's forward again in the
backward, and that second forward runs with the dispatch modes on, so the step counter and
FlopCounterMode count its ops, FLOPs and bytes (mgpu_perf/counts/step.py).

What torch.profiler shows beside: non-reentrant checkpointing stops recomputing as soon as the last
tensor the backward needs is saved again (its early stop, `_StopRecomputationError`), and a tensor an
op saves for its backward is saved before the op's kernel runs. A region of one convolution is then
stopped inside that convolution's call: the profiler records an `aten::convolution` (3 against 2 in
a two-convolution step) whose kernel (`aten::_convolution`) never runs, and the step does no more
work than without the checkpoint. The counter counts what runs: the kernels' count.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint
from torch import nn

from mgpu_perf.counts.judge import SLOWER_COUNTED, compare_counts
from mgpu_perf.counts.step import StepCounts, count_step
from mgpu_perf.gate.counted import judge_counts

REGIONS = ("none", "non-reentrant", "reentrant", "one-convolution")


def _two_convolution_step(region: str):
    """One SGD step of conv -> relu -> conv -> relu -> pool -> linear; `region` says what of the
    second convolution is checkpointed: conv2 and its relu (non-reentrant or reentrant), conv2 alone
    (non-reentrant), or nothing."""
    torch.manual_seed(0)
    conv1, conv2, head = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1), nn.Linear(8, 10)
    params = [*conv1.parameters(), *conv2.parameters(), *head.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.01)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))

    def block(h):
        return torch.relu(conv2(h))

    def step():
        h = torch.relu(conv1(x))
        if region == "none":
            h = block(h)
        elif region == "one-convolution":
            h = torch.relu(torch.utils.checkpoint.checkpoint(conv2, h, use_reentrant=False))
        else:
            h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=region == "reentrant")
        loss = nn.functional.cross_entropy(head(h.mean(dim=(2, 3))), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step()  # warm
    return step


def _counted(region: str) -> dict:
    return count_step(_two_convolution_step(region)).to_dict()


def _verdict(base: dict, cand: dict):
    return judge_counts({"baseline": [{"counts": [base]}], "candidate": [{"counts": [cand]}]})


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_checkpointed_region_recomputed_in_the_backward_is_slower_counted(reentrant):
    base, planted = _counted("none"), _counted("reentrant" if reentrant else "non-reentrant")
    counted = _verdict(base, planted)
    assert counted.verdict == SLOWER_COUNTED, f"checkpointing conv2+relu: {counted.verdict}: {counted.changes}"
    assert "aten::convolution 2 → 3" in counted.changes, f"the recomputed convolution is not counted: {counted.changes}"
    flops = [c for c in compare_counts(StepCounts.from_dict(base), StepCounts.from_dict(planted)) if c.what == "flops"]
    assert flops and flops[0].slower, f"the recomputation's FLOPs are not counted: {counted.changes}"
    assert planted["allocated_bytes"] > base["allocated_bytes"], "the recomputed outputs' bytes are not counted"


@pytest.mark.parametrize("region", REGIONS)
def test_the_counter_counts_every_convolution_kernel_the_profiler_sees_run(region):
    """Beside torch.profiler: the counter's convolutions are the kernels that ran (`aten::_convolution`),
    recomputed ones included; the profiler's `aten::convolution` also holds a call checkpoint's early
    stop ended before its kernel (a region of one convolution), which did no work."""
    step = _two_convolution_step(region)
    counted = count_step(step).ops.get("aten.convolution", 0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        step()
    names = [e.name for e in profile.events()]
    kernels, calls = names.count("aten::_convolution"), names.count("aten::convolution")
    assert counted == kernels, f"{region}: counted {counted} convolutions, the profiler saw {kernels} run"
    expected_calls = {"none": 2, "non-reentrant": 3, "reentrant": 3, "one-convolution": 3}[region]
    assert calls == expected_calls, f"{region}: the profiler recorded {calls} aten::convolution calls"
    if region == "one-convolution":
        assert kernels == 2, f"one checkpointed convolution: {kernels} kernels ran (the early stop did not stop it)"


def test_the_validate_counts_checkpointing_plant_is_slower_counted_on_the_resnet(tmp_path):
    """validate-counts' `activation-checkpointing` plant (mgpu/models.py): the first stage's four
    convolutions recomputed; built here at width 4 and counted against the unplanted model."""
    import importlib.util
    from pathlib import Path

    from mgpu import models
    from mgpu_perf.lab.validate_counts import PLANTS, plant

    (tmp_path / "mgpu").mkdir()
    (tmp_path / "mgpu" / "models.py").write_text((Path(__file__).resolve().parents[1] / "mgpu" / "models.py").read_text())
    plant(tmp_path, PLANTS["activation-checkpointing"])
    spec = importlib.util.spec_from_file_location("planted_checkpointing", tmp_path / "mgpu" / "models.py")
    planted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(planted)
    counts = []
    for module in (models, planted):
        torch.manual_seed(0)
        model = module.resnet18(width=4)
        x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
        counts.append(count_step(lambda: nn.functional.cross_entropy(model(x), y).backward()).to_dict())
    counted = _verdict(*counts)
    assert counted.verdict == SLOWER_COUNTED, f"{counted.verdict}: {counted.changes}"
    assert "aten::convolution 20 → 24" in counted.changes and any(c.startswith("FLOPs +") for c in counted.guarded), \
        counted.changes
