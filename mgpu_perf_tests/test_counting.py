"""The counted step (mgpu_perf/counts/step.py, compared by counts/judge.py): the same step counts the
same every time, and each kind of structural regression shows as a guarded increase (`slower
(counted)`), named."""

from __future__ import annotations

import dataclasses
import io
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from conftest import requires_gpus
from mgpu_perf.counts.judge import compare_counts
from mgpu_perf.counts.step import CompileWatch, StepCounts, count_step


def _step(change: str | None = None, ddp: bool = False, compiled: bool = False):
    """A small training step (an MLP, SGD), with one structural change planted."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    net = nn.parallel.DistributedDataParallel(model) if ddp else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))

    def forward(x):
        h = net[0](x) if not ddp else None
        if ddp:
            return net(x)
        if change == "copy":
            h = h.t().contiguous().t()  # a copy that was not there
        if change == "float64":
            h = h.double().float()      # a layer in float64
        if change == "graph-break":
            print(end="")                # a graph break under torch.compile
        return net[2](net[1](h))

    run = torch.compile(forward, backend="eager") if compiled else forward

    def step():
        loss = nn.functional.cross_entropy(run(x), y)
        loss.backward()
        if change == "all-reduce":
            dist.all_reduce(model[0].weight.grad)  # an extra collective
        opt.step()
        opt.zero_grad(set_to_none=change != "zeroed-grads")  # zeroed-grads: zeros written into every gradient
        if change == "host-read":
            float(loss.detach())  # a host read each step
        if change == "checkpoint":
            torch.save(model.state_dict(), io.BytesIO())  # a checkpoint every step: no aten op on a CPU
    return step


def _counts(step, watch=None) -> StepCounts:
    step()  # warm-up: compilation, optimizer state
    return count_step(step, watch)


def test_the_same_step_counts_the_same_every_time():
    first, second = _counts(_step()), _counts(_step())
    assert compare_counts(first, second) == [], compare_counts(first, second)
    assert first.flops > 0 and first.allocated_bytes > 0 and first.host_reads == 0 and first.collectives == {}
    assert first.ops["aten.mm"] >= 2, first.ops


@pytest.mark.parametrize("change, expected", [
    ("copy", "bytes allocated by the step's ops"),
    ("float64", "bytes allocated by the step's ops"),
    ("host-read", "host reads 0 → 1 a step"),
    ("zeroed-grads", "bytes written in place by the step's ops"),
    ("checkpoint", "tensor storages taken by Python (torch.save, pickling) 0 → 4 a step"),
])
def test_a_structural_change_is_a_guarded_increase(change, expected):
    changes = compare_counts(_counts(_step()), _counts(_step(change)))
    slower = [c.text for c in changes if c.slower]
    assert any(expected in text for text in slower), f"{change}: {[c.text for c in changes]}"


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_collectives_are_counted_by_kind_and_bytes_ddps_reducer_included(world_of_one):
    base = _counts(_step(ddp=True))
    params = sum(p.numel() for p in nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 4)).parameters())
    assert base.collectives["allreduce_"] == {"count": 1, "bytes": 4 * params}, base.collectives  # one bucket
    changes = compare_counts(base, _counts(_step("all-reduce", ddp=True)))
    slower = [c.text for c in changes if c.slower]
    assert any(text.startswith("+1 allreduce a step (+2.05 kB)") for text in slower), [c.text for c in changes]


@pytest.mark.parametrize("read, reads", [
    ("loss.tolist()", 1),        # on a CPU tensor it dispatches no aten op: seen where Python calls it
    ("print(loss)", 1),          # one read, whatever ops the printing dispatches
    ("loss.item()", 1),          # one read, not one for item and one for the op it dispatches
    ("if loss > 0: pass", 1),
    ("[float(v) for v in loss.reshape(1)]", 1),
    ("loss.numpy()", 1),
    ("np.asarray(loss)", 1),     # numpy's way in: Tensor.__array__
    ("0.5 in loss.reshape(1)", 1),
    ("torch.equal(loss, loss)", 1),  # a Python bool out of an op
    ("torch.allclose(loss, loss)", 1),
    # An output whose size comes from the values: on a GPU the host waits for the count.
    ("v[v > 0]", 1),
    ("v[v > 0] = 0", 1),
    ("v.nonzero()", 1),
    ("torch.unique(v)", 1),
    ("torch.repeat_interleave(v, torch.tensor([1, 2]))", 1),
    ("torch.repeat_interleave(v, torch.tensor([1, 2]), output_size=3)", 0),  # sized by the caller: no read
    ("v[torch.tensor([0, 1])]", 0),  # integer indices: the output's size is theirs
    ("v.masked_fill(v > 0, 0)", 0),  # the same shape out: no read
])
def test_each_way_python_reads_a_tensor_is_one_host_read(read, reads, capsys):
    loss, v = torch.tensor(0.5), torch.tensor([0.5, -1.0])

    def step():
        exec(read, {"loss": loss, "v": v.clone(), "torch": torch, "np": np})

    counted = count_step(step).host_reads
    assert counted == reads, f"{read}: host reads {counted}, not {reads}"


def test_a_graph_break_under_compile_is_named():
    torch._dynamo.reset()
    watch = CompileWatch()
    base = _counts(_step(compiled=True), watch)
    torch._dynamo.reset()
    watch = CompileWatch()
    broken = _counts(_step("graph-break", compiled=True), watch)
    assert base.graph_breaks == 0 and broken.graph_breaks >= 1, (base.compile, broken.compile)
    text = next(c.text for c in compare_counts(base, broken) if c.what == "graph_breaks")
    assert text.startswith(f"graph breaks 0 → {broken.graph_breaks}") and "print" in text, text
    assert broken.recompiles == 0, "a warm step compiles nothing"


def test_op_count_changes_alone_are_reported_not_failed():
    base = _counts(_step())
    cand = StepCounts(**{**base.to_dict(), "ops": {**base.ops, "aten.view": base.ops.get("aten.view", 0) + 3}})
    changes = compare_counts(base, cand)
    assert [c.what for c in changes] == ["op:aten.view"] and not changes[0].slower, changes
    assert StepCounts.from_dict(base.to_dict()) == base


# -- the gate: one step counted in both arms, real workers over two trees ---------------------------

TINY = '''
import torch
from torch import nn
from mgpu.spec import ModelSpec


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        {change}
        return self.fc2(h)


def draw(n, g):
    return torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def spec():
    return ModelSpec(build=Net, draw=draw)
'''

CHANGES = {
    "none": "pass",
    "host-read": "assert float(h.sum()) == float(h.sum())  # two host reads in every forward (the harness reads 1)",
    "copy": "h = h.t().contiguous().t()",
    "float64": "h = h.double().float()",
    "all-reduce": "if torch.distributed.is_initialized(): torch.distributed.all_reduce(h.detach().clone())",
}


@pytest.fixture(scope="module")
def gate_workers(tmp_path_factory):
    """One worker for each of two trees, started once for the tests below, as the gate sends one pair of
    workers benchmark after benchmark (starting a worker imports torch: seconds). Each tree holds
    tiny_<change>.py for every change of CHANGES: the baseline's unchanged, the candidate's with the change."""
    from mgpu_perf.gate.arm import start_workers

    root = tmp_path_factory.mktemp("gate_counts")
    trees = {}
    for label in ("baseline", "candidate"):
        trees[label] = root / label
        trees[label].mkdir()
        for change, plant in CHANGES.items():
            code = plant if label == "candidate" else CHANGES["none"]
            (trees[label] / f"tiny_{change.replace('-', '_')}.py").write_text(TINY.replace("{change}", code))
    pools = start_workers({label: (tree, sys.executable) for label, tree in trees.items()}, 1, root / "work")
    yield pools
    for arm in (arm for pool in pools.values() for arm in pool):
        arm.close()


def _gate_counts(pools, change: str, strategy: str = "single", devices: int = 1, counts: str = "gate"):
    """A smoke run of the gate on tiny_<change>.py in both workers (the unchanged and the changed tree)."""
    from mgpu_perf.gate.compare import compare
    from mgpu_perf.gate.settings import Settings

    spec = {"kind": "model-step", "model": f"tiny_{change.replace('-', '_')}.py:spec", "strategy": strategy,
            "devices": devices, "batch": 4}
    return compare(f"tiny[{change}]", spec, pools, Settings(smoke=True, max_rounds=3, workers=1, counts=counts))


# A copy and a float64 layer are counted in test_a_structural_change_is_a_guarded_increase; here, through real
# workers over two trees, the unchanged tree and a host read.
@pytest.mark.parametrize("change, expected", [("none", None), ("host-read", "host reads 1 → 3 a step")])
def test_the_gate_counts_a_step_in_both_arms(gate_workers, change, expected):
    from mgpu_perf.gate.report import format_table, gate_exit_status
    from mgpu_perf.gate.settings import Settings

    result = _gate_counts(gate_workers, change)
    counted = result.counted
    if expected is None:
        assert counted.verdict == "same" and counted.changes == [], counted
    else:
        assert counted.verdict == "slower (counted)", counted
        assert any(expected in line for line in counted.guarded), counted.guarded
    table = "\n".join(format_table([result], Settings(smoke=True)))
    assert f"counted: {counted.verdict}" in table or "counted: the same step in both arms" in table, table
    result = dataclasses.replace(result, verdict="unchanged")
    failing = gate_exit_status([result], Settings(counts="gate"))
    assert failing == (0 if expected is None else 1), "a guarded increase fails the run whatever the timing says"
    assert gate_exit_status([result], Settings(counts="report")) == 0, "--ab-counts report: shown, never failed"


def test_ab_counts_off_counts_nothing_and_says_so(gate_workers):
    from mgpu_perf.gate.report import format_table
    from mgpu_perf.gate.settings import Settings

    result = _gate_counts(gate_workers, "host-read", counts="off")
    assert result.counted.verdict == "not counted" and result.counted.counts == {}, result.counted
    assert "counted: not counted (--ab-counts off)" in "\n".join(format_table([result], Settings(smoke=True)))


@pytest.mark.multiprocess
def test_an_extra_all_reduce_under_ddp_is_counted_in_each_rank(gate_workers):
    result = _gate_counts(gate_workers, "all-reduce", strategy="ddp", devices=2)
    assert result.counted.verdict == "slower (counted)", result.counted
    assert any(line.startswith("rank 0: +1 allreduce a step") for line in result.counted.guarded), result.counted.guarded
    assert len(result.counted.counts["baseline"]) == 2, "each rank counts its own step"


def test_bench_prints_what_each_step_does(tmp_path, monkeypatch):
    """`mgpu bench`: FLOPs, achieved FLOP/s, collectives, bytes communicated and host reads per strategy,
    and the model-FLOPs utilisation where the GPU's peak is known."""
    from mgpu_perf import bench

    (tmp_path / "tiny.py").write_text(TINY.replace("{change}", "pass"))
    monkeypatch.chdir(tmp_path)
    result = bench.run_bench("tiny.py:spec", bench.BenchOptions(strategies=("single",), devices=(1,), batch=4,
                                                                 rounds=2, warmup=1))
    row = result["rows"][0]
    # 2 FLOPs a multiply-add, batch 4: forward both layers; backward fc2's weight and input grads, fc1's weight grad
    # only (the input needs none).
    assert row["flops"] == 2 * 4 * ((16 * 32 + 32 * 4) + (2 * 32 * 4 + 16 * 32)), row["flops"]
    assert row["collectives"] == 0 and row["bytes_communicated"] == 0 and row["host_reads"] == 1, row
    assert row["achieved_flops_per_s"] == pytest.approx(row["flops"] / row["step_s_median"])
    assert (row["mfu"] is None) == (not torch.cuda.is_available()), row["mfu"]  # an H100's peak is known
    table = "\n".join(bench.format_table(result))
    assert "GFLOP/s" in table and "syncs" in table, table
    monkeypatch.setattr(bench, "peak_flops", lambda amp, gpus: 1e9)
    fields = bench._count_fields(row["counts"] * 2, 0.5, "off", 2)
    assert fields["flops"] == 2 * row["flops"] and fields["mfu"] == pytest.approx(2 * row["flops"] / 0.5 / 2e9)


@requires_gpus(1)
def test_on_a_gpu_kernels_and_peak_memory_are_counted_and_repeat():
    """A GPU step: kernel launches and its peak memory, the same in two counts of the same step; a host
    read there is a sync, counted as one."""
    def on_gpu(change=None):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(32, 64, device="cuda"), torch.randint(0, 8, (32,), device="cuda")

        def step():
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if change == "host-read":
                loss.item()
        return step

    first, second = _counts(on_gpu()), _counts(on_gpu())
    assert first.cuda["kernels"] > 0 and first.cuda["peak_bytes"] > 0, first.cuda
    assert compare_counts(first, second) == [], compare_counts(first, second)
    changes = compare_counts(first, _counts(on_gpu("host-read")))
    assert any(c.slower and c.text == "host reads 0 → 1 a step" for c in changes), [c.text for c in changes]


# -- a worker's state from one workload to the next ---------------------------------------------------

@pytest.mark.parametrize("order", [("matmul", "model"), ("model", "matmul")])
def test_a_workload_does_not_inherit_the_thread_count_the_one_before_set(tmp_path, monkeypatch, order):
    """A gate worker runs the benchmarks one after another. The matmul kernel sets one torch thread;
    the training step after it in the same worker ran on that one thread. Each setup now starts from
    the worker's own count, in either order."""
    from mgpu_perf.gate import worker
    from mgpu_perf.harness import workloads

    (tmp_path / "tiny.py").write_text(TINY.replace("{change}", "pass"))
    monkeypatch.chdir(tmp_path)
    specs = {"matmul": {"kind": "matmul", "size": 64, "products": 2, "threads": 1, "device": "cpu"},
             "model": {"kind": "model-step", "model": "tiny.py:spec", "strategy": "single", "devices": 1, "batch": 4}}
    start = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        seen = []
        for name in order:
            workload, answer = worker._setup(workloads, specs[name], str(tmp_path), (), threads=2)
            seen.append((name, torch.get_num_threads()))
            workload.op()
            workload.close()
        assert dict(seen)["model"] == 2, f"the training step inherited {dict(seen)['model']} thread(s): {seen}"
        assert dict(seen)["matmul"] == 1, seen
    finally:
        torch.set_num_threads(start)


def _planted_module(tmp_path, name: str):
    """mgpu/models.py with validate-counts' plant `name` appended, imported as a module of its own."""
    import importlib.util
    from pathlib import Path

    from mgpu_perf.lab.validate_counts import PLANTS, plant

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "mgpu").mkdir()
    (tmp_path / "mgpu" / "models.py").write_text((root / "mgpu" / "models.py").read_text())
    text = (plant(tmp_path, PLANTS[name]) / "mgpu" / "models.py").read_text()
    spec = importlib.util.spec_from_file_location(f"planted_{name.replace('-', '_')}", tmp_path / "mgpu" / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, text


def _resnet_counts(module, compiled: bool) -> StepCounts:
    """One counted step of `module`.resnet18 at width 4 (compiled with the eager backend when asked), warmed first."""
    torch.manual_seed(0)
    model = module.resnet18(width=4)
    net = torch.compile(model, backend="eager") if compiled else model
    x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))

    def step():
        nn.functional.cross_entropy(net(x), y).backward()

    return _counts(step, CompileWatch() if compiled else None)


_UNPLANTED: dict = {}  # the unplanted ResNet's counts, by `compiled`: counted once for the plants below


@pytest.mark.parametrize("name, expected", [("copy-in-forward", "bytes allocated"), ("float64-layer", "bytes allocated"),
                                            ("graph-break", "graph breaks 0 → 1"), ("mask-index", "host reads 0 → 2")])
def test_validate_counts_model_plants_are_each_a_guarded_increase(tmp_path, name, expected):
    """`python -m mgpu_perf validate-counts` plants these in mgpu/models.py (docs/notes/gate-validation.md has
    its runs); here each, built in this process, is `slower (counted)` against the unplanted model."""
    from mgpu import models
    from mgpu_perf.lab.validate_counts import PLANTS

    planted, text = _planted_module(tmp_path, name)
    assert "planted by mgpu_perf/lab/validate_counts.py" in text
    compiled = PLANTS[name].compile
    if compiled not in _UNPLANTED:  # the unplanted model counts the same every time (the first test of this file)
        _UNPLANTED[compiled] = _resnet_counts(models, compiled)
    slower = [c.text for c in compare_counts(_UNPLANTED[compiled], _resnet_counts(planted, compiled)) if c.slower]
    assert any(expected in t for t in slower), f"{name}: {slower or 'no guarded increase'}"


def test_validate_counts_plants_parse_and_bad_input_is_one_line(capsys):
    from mgpu_perf.lab.validate_counts import PLANTS, main

    for name, p in PLANTS.items():
        compile(p.code, name, "exec")  # appended to a file of mgpu: a syntax error there would fail every run
    with pytest.raises(SystemExit) as exit_info:
        main(["--plants", "host-read,nope"])
    assert exit_info.value.code == 2 and "unknown plant 'nope'" in capsys.readouterr().err


@pytest.mark.timed  # the planted over the plain forward's measured time, > 1.3
def test_validate_gate_plants_a_slower_forward_that_computes_the_same(tmp_path):
    """`validate-gate --set-forward P`: the copy's ResNet-18 forward busy-waits P % of its own time
    (in forward hooks, so in every process that builds the model) and returns what it returned."""
    import importlib.util
    import statistics
    import time
    from pathlib import Path

    from mgpu import models
    from mgpu_perf.lab.validate_gate import PLANTED_FORWARD

    root = Path(__file__).resolve().parents[1]
    planted_file = tmp_path / "models.py"
    planted_file.write_text((root / "mgpu" / "models.py").read_text() + PLANTED_FORWARD.format(fraction=1.0))
    spec = importlib.util.spec_from_file_location("planted_forward_models", planted_file)
    planted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(planted)
    x = torch.randn(8, 1, 28, 28)
    nets = []
    for module in (models, planted):
        torch.manual_seed(0)
        nets.append(module.resnet18(width=4))
    outs = [net(x) for net in nets]  # also the warm-up
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0, msg="the planted forward computes another result")

    def seconds(net) -> float:
        began = time.perf_counter()
        net(x)
        return time.perf_counter() - began

    # Interleaved (plain, planted, planted, plain, ...): a round's ratio is taken at one moment of
    # the machine, so another job's load slows both sides of it alike.
    ratios = []
    for i in range(9):
        if i % 2 == 0:
            plain = seconds(nets[0])
            slow = seconds(nets[1])
        else:
            slow = seconds(nets[1])
            plain = seconds(nets[0])
        ratios.append(slow / plain)
    # Twice its own time, by construction; 1.3 leaves room for a machine whose speed drifts.
    assert statistics.median(ratios) > 1.3, f"planted over plain forward, round by round: {[round(r, 2) for r in ratios]}"
