"""The lab (mgpu_perf/lab/: the tools that measure the gate) stays apart from the gate a user's run
goes through: the gate never imports it, at any depth, lazily or not. The lab may import the gate.
(correctness/test_layout.py holds the rules of both packages: no circles, parameters, lines.)"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import requires_gpus

PACKAGE = Path(__file__).resolve().parent.parent / "mgpu_perf"


def _imports() -> dict[str, set[str]]:
    """Every mgpu_perf module and the mgpu_perf names it imports, anywhere in it (a `from a import b`
    gives both a and a.b: b may be a module)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(("mgpu_perf", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.update([node.module, *(f"{node.module}.{a.name}" for a in node.names)])
        graph[name] = {t for t in found if t.startswith("mgpu_perf")}
    return graph


def test_the_gate_never_imports_the_lab():
    graph = _imports()
    reached, todo = set(), [name for name in graph if name.startswith("mgpu_perf.gate")]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(t for t in graph.get(name, ()) if t in graph)
    lab = sorted(name for name in reached if name.startswith("mgpu_perf.lab"))
    assert not lab, f"the gate reaches the lab: {lab}"


# -- validate-gate counts a wrong `unchanged` apart from `undecidable` ------------------------------

def _experiment(plant: float, set_big: str | None = None):
    from mgpu_perf.gate.settings import Settings
    from mgpu_perf.lab.validate_gate import Experiment

    big = f"{plant * 100:g}% slower"
    return Experiment("test_train_step[single]", {}, 7, runs=3, set_runs=2, settings=Settings(threshold=0.10),
                      big=big, set_big=set_big or big, plant=plant, set_slowed_only=True)


def _set_run(**verdicts) -> dict:
    return {"exit": 1, "seconds": 200.0, "verdicts": {f"test_train_step[{k}]": v for k, v in verdicts.items()}
            | {"test_matmul_one_device[synchronised]": "unchanged"}}


def test_validate_gate_counts_a_planted_slowdown_judged_unchanged_apart_from_undecidable():
    from mgpu_perf.lab.validate_gate import summarise, verdict_counts, wrong_unchanged

    e = _experiment(0.15)
    decisions = {"same tree": [{"verdict": "unchanged", "seconds": 10, "rounds": 10}],
                 e.big: [{"verdict": v, "seconds": 30, "rounds": 40} for v in ("slower", "unchanged", "undecidable")]}
    sets = {"same tree": [], e.big: [_set_run(single="unchanged", ddp="undecidable"),
                                     _set_run(single="slower", ddp="slower")]}
    wrong = wrong_unchanged(e, decisions, sets)
    assert wrong["single"] == 1, f"one of three single-step runs of a 15 % plant said unchanged: {wrong}"
    assert wrong["set"] == {"test_train_step[single]": 1, "test_train_step[ddp]": 0}, \
        f"the kernel is not counted, undecidable is not a wrong unchanged: {wrong}"
    assert wrong["set_total"] == 1 and wrong["set_training_verdicts"] == 4, wrong
    counts = verdict_counts(sets[e.big])
    assert counts["test_train_step[ddp]"] == {"undecidable": 1, "slower": 1}, counts
    summary = summarise(e, decisions, sets, total=500.0)
    assert summary["met"]["no_wrong_unchanged"] is False and summary["wrong_unchanged"] == wrong, summary["met"]
    assert summary["set_verdicts"][e.big]["test_train_step[single]"] == {"unchanged": 1, "slower": 1}


def test_validate_gate_says_how_many_whole_set_runs_were_as_required(tmp_path, capsys):
    from dataclasses import replace

    from mgpu_perf.lab.validate_gate import print_summary, summarise

    e = replace(_experiment(0.15), runs=0)  # the whole set only, as the done-when's validation runs it
    sets = {"same tree": [], e.big: [_set_run(single="slower", ddp="undecidable"), _set_run(single="slower", ddp="slower")]}
    print_summary(summarise(e, {"same tree": [], e.big: []}, sets, total=400.0), e, tmp_path / "v.json")
    out = capsys.readouterr().out
    assert "NOT as required (runs as required: 15% slower 1/2;" in out, \
        f"one slowed run had an undecidable, the other was all slower: the summary should say 1 of 2\n{out}"
    assert "judged `unchanged`): whole set 0 of 4 training verdicts" in out and "false slower" not in out, \
        f"--runs 0: no single-step figures\n{out}"


def test_validate_gate_summarises_a_run_stopped_before_its_whole_set_runs(tmp_path, capsys):
    """--stop-starting-after-min can come before the first whole-set run (the H100 run of 2026-11-28
    then ended in a ValueError instead of its summary)."""
    from mgpu_perf.lab.validate_gate import print_summary, summarise

    e = _experiment(0.10)
    decisions = {"same tree": [{"verdict": "unchanged", "rounds": 40, "seconds": 40.0}],
                 e.big: [{"verdict": "slower", "rounds": 40, "seconds": 39.0}]}
    print_summary(summarise(e, decisions, {"same tree": [], e.big: []}, total=80.0), e, tmp_path / "v.json")
    assert "whole gated set: no run (--stop-starting-after-min" in capsys.readouterr().out


def test_an_unchanged_below_the_threshold_or_for_a_slower_forward_is_not_counted_wrong():
    from mgpu_perf.lab.validate_gate import wrong_unchanged

    small = _experiment(0.05)  # a 5 % plant under a 10 % threshold: `unchanged` is a right answer
    sets = {small.big: [_set_run(single="unchanged")]}
    assert wrong_unchanged(small, {small.big: [{"verdict": "unchanged"}]}, sets)["single"] is None
    forward = _experiment(0.15, set_big="forward 20% slower")  # the step slowed by less than its forward
    counted = wrong_unchanged(forward, {forward.big: []}, {"forward 20% slower": [_set_run(single="unchanged")]})
    assert counted["set_total"] == 0 and counted["set_training_verdicts"] == 0, counted


def _planted_resnet18(tmp_path, fraction: float):
    """ResNet-18 as a copy of mgpu/models.py with the GPU plant appended builds it (imported from that file)."""
    import importlib.util

    from mgpu_perf.lab.plants import PLANTED_GPU

    source = Path(__file__).resolve().parent.parent / "mgpu" / "models.py"
    planted = tmp_path / "planted_models.py"
    planted.write_text(source.read_text() + PLANTED_GPU.format(fraction=fraction))
    spec = importlib.util.spec_from_file_location("planted_models", planted)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.resnet18


def test_the_gpu_plant_leaves_a_cpu_step_as_it_was(tmp_path):
    """--plant-on gpu plants a kernel: on a CPU the planted model computes bit for bit what mgpu's does."""
    import torch

    from mgpu.models import resnet18

    planted = _planted_resnet18(tmp_path, 0.5)
    losses = []
    for build in (resnet18, planted):
        torch.manual_seed(0)
        model = build(width=4)
        x = torch.randn(4, 1, 16, 16)
        loss = model(x).square().mean()
        loss.backward()
        losses.append((loss.detach(), model[0].weight.grad.clone()))
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=0,
                               msg="the GPU plant changed a CPU forward or backward")


def test_validate_gate_refuses_the_gpu_plant_without_cuda(capsys):
    import pytest
    import torch

    from mgpu_perf.lab.validate_gate import main

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the refusal is for machines without one")
    with pytest.raises(SystemExit) as stop:
        main(["--quick", "--plant-on", "gpu"])
    assert stop.value.code == 2
    assert "--plant-on gpu: no CUDA device" in capsys.readouterr().err


@requires_gpus(1)
def test_a_cuda_graph_replay_runs_the_gpu_plant(tmp_path):
    """On a GPU: the plant's spin kernel is captured with the step, so a replay of the planted step
    takes longer than a replay of the plain one, by about the plant's share (timed with CUDA events)."""
    import torch

    from mgpu.models import resnet18

    def replay_ms(build) -> float:
        torch.manual_seed(0)
        model = build(width=64).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(128, 1, 28, 28, device="cuda"), torch.randint(0, 10, (128,), device="cuda")

        def step():
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # as harness/graphs.py: eager warm-up steps, then the capture
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 20

    plain, planted = replay_ms(resnet18), replay_ms(_planted_resnet18(tmp_path, 0.5))
    assert planted > 1.3 * plain, (f"a replay of the step with a 50 % GPU plant took {planted:.3f} ms against "
                                   f"{plain:.3f} ms plain: the replay did not run the plant")


# -- validate-gate's and validate-counts' options, declared once (mgpu/options.py) --------------------

def test_validate_gate_options_resolve_their_defaults_from_quick_and_threshold():
    from mgpu_perf.lab.validate_gate import ValidateGateOptions, build_parser

    def read(*argv):
        return ValidateGateOptions.from_args(build_parser().parse_args(list(argv)))

    full, quick = read(), read("--quick")
    assert (full.runs, full.set_runs, full.plant, full.plant_on, full.out, full.tree) == (20, 3, 10.0, "host",
                                                                                          "perf-results", ".")
    assert (quick.runs, quick.set_runs) == (5, 1)
    asked = read("--quick", "--runs", "0", "--threshold", "5", "--plant", "15", "--set-forward", "50", "--workers", "2")
    assert (asked.runs, asked.set_runs, asked.plant, asked.set_forward) == (0, 1, 15.0, 50.0)
    assert (asked.settings.threshold, asked.settings.workers) == (0.05, 2)


def test_validate_tools_refuse_bad_options_in_one_line(capsys):
    import pytest

    from mgpu_perf.lab import validate_counts, validate_gate

    cases = [(validate_gate, ["--runs", "x"], "--runs must be an integer >= 0, got 'x'"),
             (validate_gate, ["--runs", "0", "--set-runs", "0"], "--runs and --set-runs must be at least 0"),
             (validate_gate, ["--plant", "150"], "--plant must be a percentage in (0, 100)"),
             (validate_gate, ["--plant-on", "gpu", "--set-forward", "50"], "one plant at a time"),
             (validate_gate, ["--threshold", "0"], "--threshold must be a percentage in (0, 100)"),
             (validate_counts, ["--aa-runs", "-1"], "--aa-runs must be an integer >= 0, got -1"),
             (validate_counts, ["--runs", "0", "--aa-runs", "0"], "--runs, --aa-runs and --overhead must be at least 0"),
             (validate_counts, ["--threshold", "200"], "--threshold must be a percentage in (0, 100)")]
    for tool, argv, message in cases:
        with pytest.raises(SystemExit) as stop:
            tool.main(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and message in err and err.count("\n") == 1, (argv, err)
