"""Where a divergence enters the model (mgpu/check/script/locate.py, tracer.py): at the step that failed,
each module's output per example and the gradient at the model's output, world N against world 1;
and a check that passes runs nothing more.

    pytest scriptcheck_tests/test_locate.py

The tracer is tested in this process on a small model; the rest runs `check-script` on scripts
written into tmp_path (and examples/loops/world_size_factor.py), 1 vs 2 ranks.
"""

from __future__ import annotations

import os
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mgpu.scriptcheck import run_check_script
from mgpu.check.script.inrank.tracer import Tracer
from scriptcheck_tests.shared import WORLD_SIZE_FACTOR, shared_report

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

LOOPS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "loops")

# A DDP loop over a small model; {norm} is the module between the two linear layers, {between} code of
# the model's own forward after it.
LOOP = """
import torch, torch.distributed as dist, torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

class LocalNorm(nn.Module):
    '''Normalises each feature over the batch it is given: at N ranks, over the rank's shard.'''
    def forward(self, h):
        return (h - h.mean(0)) / (h.std(0) + 1e-5)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(8, 16), {norm}, nn.Linear(16, 2)
    def forward(self, x):
        h = self.norm(torch.tanh(self.fc1(x)))
        {between}
        return self.fc2(h)

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(0)
x, y = torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g)
per = 16 // world
for step in range(4):
    idx = slice((step * world + rank) * per, (step * world + rank + 1) * per)
    opt.zero_grad()
    F.cross_entropy(model(x[idx]), y[idx]).backward()
    opt.step()
dist.destroy_process_group()
"""


def loop(tmp_path, norm: str = "nn.Identity()", between: str = "pass") -> str:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(LOOP).format(norm=norm, between=between))
    return str(path)


def failed_at_step_1(report):
    (c,) = report.comparisons
    assert c.status == "fail" and c.first.step == 1 and c.first.kind == "gradient", report.text()
    assert c.entered is not None and c.entered["step"] == 1, report.text()
    assert f"where it enters (step 1): {c.entered['sentence']}" in report.text(), report.text()
    assert report.to_json()["comparisons"][0]["entered"] == c.entered
    assert report.timings["locate"] > 0, report.timings
    return c.entered


# -- the tracer, in this process -------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block, self.out = Block(), nn.Linear(4, 3)

    def forward(self, x):
        return self.out(self.block(self.block(x)))  # the block twice: `block` and `block#2`


def test_the_tracer_keeps_each_module_of_the_traced_step_in_order_and_the_gradient_at_the_output():
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = [torch.randn(5, 4) for _ in range(3)]
    tracer = Tracer(2)
    tracer.install()
    try:
        for step, x in enumerate(xs):
            with torch.no_grad():
                model(x)  # under no_grad: no training forward
            opt.zero_grad()
            out = model(x)
            out.retain_grad()
            F.mse_loss(out, torch.zeros_like(out)).backward()
            if step == 1:
                expected_out, expected_grad = out.detach().clone(), out.grad.clone()
            opt.step()
    finally:
        tracer.uninstall()
    trace = tracer.trace
    assert trace.complete and not trace.truncated and len(trace.forwards) == 1, trace
    f = trace.forwards[0]
    torch.testing.assert_close(f.data.tensors["arg0"], xs[1], msg="the traced forward is not step 2's")
    events = [(e.label, e.kind) for e in f.events]
    assert events == [("", "input"), ("block", "input"), ("block.fc", "input"), ("block.fc", "output"),
                      ("block", "output"), ("block#2", "input"), ("block.fc#2", "input"), ("block.fc#2", "output"),
                      ("block#2", "output"), ("out", "input"), ("out", "output"), ("", "output")], events
    assert f.parents["block.fc#2"] == "block#2" and f.parents["out"] == "" and f.types["block#2"] == "Block", f.parents
    torch.testing.assert_close(f.events[-1].tensor, expected_out, msg="the model's output as traced")
    torch.testing.assert_close(f.output_grad, expected_grad, msg="the gradient that reached the model's output")


# -- where it enters, at 2 ranks ---------------------------------------------------------------------------

def test_a_loss_divided_by_the_world_size_once_more_enters_in_the_loss_every_module_agreeing():
    # examples/test_loops.py's planted defect `world_size_factor` makes the same check (4 steps): one run, shared
    report = shared_report(*WORLD_SIZE_FACTOR)
    entered = failed_at_step_1(report)
    sentence = entered["sentence"]
    assert entered["where"] == "loss" and entered["modules_compared"] == 4, entered
    assert sentence.startswith("every module's output agrees per example"), sentence
    assert "the gradient at the output is world 1's per example" in sentence, sentence
    assert "averaged over the 2 ranks" in sentence and "0.500 x world 1's: the loss's reduction" in sentence, sentence
    assert entered["output_gradient_factor"] == 1.0 and abs(entered["gradient_factor"] - 0.5) < 1e-3, entered


def test_a_module_that_normalises_over_the_ranks_shard_is_named(tmp_path):
    report = run_check_script(loop(tmp_path, norm="LocalNorm()"), ranks=(1, 2), steps=1)
    entered = failed_at_step_1(report)
    assert (entered["where"], entered["module"], entered["module_type"]) == ("module-output", "norm", "LocalNorm"), \
        entered
    assert entered["sentence"].startswith("the first module whose output differs: `norm` (LocalNorm), its input "
                                          "agreeing"), entered["sentence"]
    assert entered["error"] > 100 * entered["allowed"], entered


def test_per_rank_code_between_modules_is_placed_in_the_forward_that_runs_it(tmp_path):
    report = run_check_script(loop(tmp_path, between="h = h - h.mean(0)"), ranks=(1, 2), steps=1)
    entered = failed_at_step_1(report)
    assert (entered["where"], entered["module"]) == ("module-input", "fc2"), entered
    assert "the first module whose input differs: `fc2` (Linear)" in entered["sentence"], entered["sentence"]
    assert "it enters in the forward of the model (Net)" in entered["sentence"], entered["sentence"]


def test_a_check_that_passes_runs_no_traced_pass(tmp_path):
    report = run_check_script(loop(tmp_path), ranks=(1, 2), steps=2)
    assert report.verdict == "passed", report.text()
    assert all(c.entered is None for c in report.comparisons), report.text()
    assert "locate" not in report.timings and "locating" not in report.text(), report.timings
    assert all(r.trace is None for run in report.runs for r in run.ranks), "a rank traced a passing check"


def test_an_output_gradient_missing_for_the_traces_size_says_so_not_that_there_was_none():
    """A model whose outputs fill the trace's budget (build-nanogpt's logits: 25.8 M elements a rank)
    has no output gradient kept: that is the budget, not an output without a gradient."""
    from mgpu.check.script.causes.entry import output_gradient

    where, words, _ = output_gradient(None, 0.5, 2, "gradient", truncated=True)
    assert where == "unknown" and "TRACE_NUMEL" in words and "no floating output" not in words, words
    where, words, _ = output_gradient(None, 0.5, 2, "gradient")
    assert "no floating output that needs one" in words, words
