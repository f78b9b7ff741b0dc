"""Defects in the check itself that would hide a broken strategy, each caught through the public path.

* Rank runs leave out of the gather what a rank's state digest shows to be rank 0's
  (mgpu/check/model/ranks.py, `_send_only_differences`). Were a rank's digest compared with the wrong
  one, ranks that drifted apart would be sent as equal and look identical: a ddp run whose ranks
  drift must fail `replicas`, naming the rank.
* The judge caches a run's comparison by the recording's digest (mgpu/check/model/judge.py,
  `References.compared`). Were the digest left out of the key, a later strategy whose plan and shard
  count match an earlier one's would get the earlier verdict: in a check over two strategies of one
  shape, the broken one fails and the correct one passes, in either order.

The models are here, loaded by path (`correctness/test_check_defects.py:drifting_ranks`) in the
ranks too: this module imports nothing of the suite at its top.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from mgpu.errors import ParityError
from mgpu.parity import check_data_parallel, run_check
from mgpu.spec import ModelSpec, image_spec, load_spec

HERE = "correctness/test_check_defects.py"


class DriftingMLP(nn.Module):
    """An MLP with a spare parameter its forward never uses, nudged by every forward on ranks > 0:
    the ranks drift apart where no gradient, loss or rank 0 weight shows it, only the ranks
    compared with each other. Outside a process group (the check's probes and references) nothing moves."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 16), nn.Linear(16, 4)
        self.spare = nn.Parameter(torch.zeros(3))

    def forward(self, x):
        if dist.is_available() and dist.is_initialized() and dist.get_rank() > 0:
            with torch.no_grad():
                self.spare.add_(1.0)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def drifting_ranks() -> ModelSpec:
    return image_spec(DriftingMLP, (1, 8, 8), 4, name="drifting_ranks")


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_ddp_ranks_that_drift_apart_fail_replicas_naming_the_rank():
    from correctness.helpers import COMPARISON_KIND

    with pytest.raises(ParityError) as raised:
        check_data_parallel(f"{HERE}:drifting_ranks", strategies=("ddp",), devices=(2,), steps=2, step_timeout=30,
                            device=COMPARISON_KIND)
    failures = raised.value.report.failures
    assert [(r.name, r.strategy, r.devices) for r in failures] == [("replicas", "ddp", 2)], \
        [(r.name, r.strategy, r.first_divergence) for r in failures]
    div = failures[0].first_divergence
    assert (div.tensor, div.step, div.replica) == ("weight spare", 1, 1), div
    assert "on rank 1" in str(raised.value), str(raised.value)


@pytest.mark.parametrize("strategies", [("manual", "dataparallel"), ("dataparallel", "manual")],
                         ids=["broken-first", "broken-second"])
def test_of_two_strategies_of_one_shape_only_the_broken_one_fails(monkeypatch, strategies):
    """manual and dataparallel on 2 devices of a model that mixes nothing: the same plans, and each
    compared with the one unsharded reference. manual's gradients are made twice what they should be."""
    from correctness.helpers import COMPARISON_KIND
    from mgpu.config import CheckOptions
    from mgpu.strategies import Manual

    sync_gradients = Manual.sync_gradients
    monkeypatch.setattr(Manual, "sync_gradients", lambda self, global_batch: sync_gradients(self, global_batch / 2))
    options = CheckOptions(strategies=strategies, devices=(2,), steps=2, step_timeout=30, device=COMPARISON_KIND)
    report = run_check(load_spec("correctness/check_models.py:mlp"), options)
    verdicts = {(r.strategy, r.name): r.status for r in report.results if r.strategy is not None}
    for check in ("gradients", "weights", "uneven", "accumulate"):
        assert verdicts[("manual", check)] == "fail", (check, verdicts)
        assert verdicts[("dataparallel", check)] == "pass", (check, verdicts)
    assert {s for (s, _), status in verdicts.items() if status == "fail"} == {"manual"}, verdicts
