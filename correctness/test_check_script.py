"""`mgpu check-script` on bad input and faults: one line and exit 2 for what the user must fix, the world,
the rank and the last lines of the error for a crash, a bounded hang, a short script, an unseeded one.

    pytest correctness/test_check_script.py

Each script here is a few lines of DDP on a tiny MLP, written into tmp_path; each check runs in this
process (the fork server that forks the ranks is started once), 1 vs 2 ranks, 1 to 4 steps.
The loops people write, correct and with planted defects, are examples/test_loops.py's.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
import textwrap
import time

import pytest
import torch

from mgpu.scriptcheck import main, run_check_script
from mgpu.scriptcheck.launch import ScriptCheckError, expand_args
from mgpu.scriptcheck.recorder import strip_wrappers

pytestmark = [pytest.mark.reliability]

# A correct DDP loop; {before_step} and {in_forward} are where each test plants its fault.
LOOP = """
import os, sys, time, random
import torch, torch.distributed as dist, torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 2)
    def forward(self, x):
        h = torch.relu(self.fc1(x))
        {in_forward}
        return self.fc2(h)

def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    {seed}
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g)
    order = list(range(64))
    {shuffle}
    per = int(sys.argv[1]) if len(sys.argv) > 1 else 8 // world
    for step in range({steps}):
        idx = order[(step * world + rank) * per:(step * world + rank + 1) * per]
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        {before_step}
        opt.step()
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def script(tmp_path, name="train.py", before_step="pass", in_forward="pass", seed="torch.manual_seed(0)",
           shuffle="pass", steps=20) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(LOOP).format(before_step=before_step, in_forward=in_forward, seed=seed,
                                                 shuffle=shuffle, steps=steps))
    return str(path)


def one_error_line(capsys) -> str:
    """The one error line on stderr (after the progress lines, `mgpu check-script: world 1: ...`)."""
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("mgpu check-script:")]
    assert len(err) == 1 and err[0].startswith("mgpu: error: "), err
    return err[0]


# -- bad input: one line, exit 2 -------------------------------------------------------------------------

def test_a_missing_script_is_one_line_and_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "nope.py")]) == 2
    assert "nope.py not found" in one_error_line(capsys)


def test_bad_options_and_expressions_are_one_line_and_exit_2(tmp_path, capsys):
    path = script(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["--ranks", "1,two", path])
    assert e.value.code == 2 and "--ranks" in one_error_line(capsys)
    with pytest.raises(SystemExit) as e:
        main(["--steps", "0", path])
    assert e.value.code == 2 and "--steps" in one_error_line(capsys)
    assert main([path, "{64 // world_size(}"]) == 2
    assert "cannot evaluate" in one_error_line(capsys)
    assert main(["-m", "no_such_module_here"]) == 2
    assert "no_such_module_here" in one_error_line(capsys)


def test_world_size_expressions_are_evaluated_per_run_and_other_braces_kept():
    args = ["--batch-size", "{64 // world_size}", "--lr={0.1 * world_size}", '{"a": 1}', "{{literal}}", "{x}"]
    assert expand_args(args, 2) == ["--batch-size", "32", "--lr=0.2", '{"a": 1}', "{literal}", "{x}"]
    assert expand_args(["--n={max(1, 8 // world_size)}"], 16) == ["--n=1"]
    with pytest.raises(ScriptCheckError, match="cannot evaluate"):
        expand_args(["{__import__('os') or world_size}"], 2)


def test_an_args_expression_is_evaluated_at_every_world_size_asked_before_anything_runs(tmp_path):
    """At --ranks 1,4, an expression that fails at 4 ranks only is refused up front, not lost in a run."""
    with pytest.raises(ScriptCheckError, match="at world size 4"):
        run_check_script(script(tmp_path), args=["{8 // (world_size - 4)}"], ranks=(1, 4), steps=1)


def test_wrapper_prefixes_are_stripped_from_parameter_names():
    assert strip_wrappers("module.fc1.weight") == "fc1.weight"
    assert strip_wrappers("_orig_mod.module.layers.0._fsdp_wrapped_module.weight") == "layers.0.weight"
    assert strip_wrappers("module.module.head.bias") == "head.bias"
    assert strip_wrappers("encoder._checkpoint_wrapped_module.fc.weight") == "encoder.fc.weight"


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_script_that_never_steps_a_torch_optimizer_is_told_what_the_check_needs(tmp_path, capsys):
    path = script(tmp_path, before_step="[p.data.sub_(0.1 * p.grad) for p in model.parameters()]; continue")
    assert main(["--ranks", "1,2", path]) == 2
    line = one_error_line(capsys)
    assert "made no torch.optim optimizer step at world 1" in line and "forward(s)" in line
    assert "torch.optim optimizer" in line and "at least once" in line


# -- faults --------------------------------------------------------------------------------------------

@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_crash_at_one_world_size_names_the_world_the_rank_and_its_last_lines(tmp_path, capsys):
    path = script(tmp_path, before_step="if world == 2 and rank == 1 and step == 1: "
                                        "raise RuntimeError('rank 1 lost its data')")
    assert main(["--ranks", "1,2", path]) == 1
    out = capsys.readouterr().out
    assert "world 2, rank 1: the script failed: RuntimeError: rank 1 lost its data" in out, out
    assert "| RuntimeError: rank 1 lost its data" in out and "train.py" in out, out  # the last lines
    assert out.strip().splitlines()[-1].startswith("FAILED: world 2, rank 1 crashed: RuntimeError"), out


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_hang_is_bounded_by_the_timeout_and_nothing_is_left_behind(tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    path = script(tmp_path, before_step=f"if world == 2 and rank == 1: open({str(pid_file)!r}, 'w').write("
                                        "str(os.getpid())); time.sleep(600)")
    # This run's temporary folders in a folder of its own: another check on the machine meanwhile
    # (a CI runner's other job) makes and removes its own in the system's.
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    folders = set(glob.glob(os.path.join(tempfile.gettempdir(), "mgpu-script-*")))
    started = time.time()
    report = run_check_script(path, ranks=(1, 2), steps=2, timeout=5)
    assert time.time() - started < 60
    assert report.verdict == "failed" and report.failures[0].kind == "timeout", report.text()
    assert "world 2: the script did not reach its last recorded step within the timeout" in report.text()
    pid = int(pid_file.read_text())
    for _ in range(50):  # the agent has stopped it; the fork server reaps it
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"rank 1 of world 2 (pid {pid}) is still running")
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "mgpu-script-*"))) == folders


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_script_that_ends_before_k_steps_is_compared_on_the_steps_it_made(tmp_path):
    report = run_check_script(script(tmp_path, steps=2), ranks=(1, 2), steps=4)
    assert report.verdict == "passed", report.text()
    assert report.comparisons[0].steps == 2
    assert any("made 2 optimizer step(s) at world 1" in n and "compared on the steps it made" in n
               for n in report.notes), report.notes


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_an_unseeded_script_is_not_verified_and_told_how_to_seed(tmp_path, capsys):
    path = script(tmp_path, shuffle="random.shuffle(order)")  # Python's random: seeded from the OS
    json_path = tmp_path / "report.json"
    assert main(["--ranks", "1,2", "--steps", "2", "--json", str(json_path), path]) == 0
    out = capsys.readouterr().out
    assert "NOT VERIFIED: two world-1 runs of the script differ (at step 1" in out, out
    assert "torch.manual_seed(0)" in out and "random.seed" in out, out
    record = json.loads(json_path.read_text())
    assert record["verdict"] == "not verified" and record["verified"] is False
    assert record["unreproducible"]["kind"] == "data" and record["comparisons"][0]["status"] == "not-compared"
    assert main(["--ranks", "1,2", "--steps", "2", "--strict", path]) == 1


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_random_numbers_drawn_in_forward_are_a_finding_not_a_failure(tmp_path):
    report = run_check_script(script(tmp_path, in_forward="h = h + 0.1 * torch.randn_like(h)"), ranks=(1, 2), steps=2)
    assert report.verdict == "not verified" and report.exit_code() == 0 and report.exit_code(strict=True) == 1
    finding = next(f for f in report.findings if f["name"] == "randomness")
    assert "torch.randn_like" in finding["text"] and "first in the model (Net)" in finding["text"], finding
    assert report.comparisons[0].status == "finding" and "randomness finding" in report.comparisons[0].first.diagnosis


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_gradients_that_are_all_zero_are_a_finding(tmp_path):
    """A loss that cannot move the weights (pytorch/examples' DDP tutorial: cross-entropy over one output)
    passes any comparison of gradients: the check says it checked little, and --strict fails it."""
    report = run_check_script(script(tmp_path, before_step="[p.grad.zero_() for p in model.parameters()]"),
                              ranks=(1, 2), steps=2)
    finding = next((f for f in report.findings if f["name"] == "zero-gradients"), None)
    assert finding is not None, report.text()
    assert "2 step(s), 4 parameter(s)" in finding["text"], finding
    assert report.exit_code() == 0 and report.exit_code(strict=True) == 1
    assert "finding zero-gradients" in report.text()
    healthy = run_check_script(script(tmp_path, name="healthy.py"), ranks=(1,), steps=2)
    assert not any(f["name"] == "zero-gradients" for f in healthy.findings), healthy.findings


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_the_script_runs_as_python_runs_it_and_modules_as_python_m(tmp_path, monkeypatch):
    """`__name__ == "__main__"`, the script's folder on sys.path (a helper beside it), ARGS in sys.argv;
    and -m MODULE from the current folder."""
    (tmp_path / "helper.py").write_text("PER_DEVICE = {64: 32}\n")
    path = script(tmp_path, seed="torch.manual_seed(0); import helper; assert helper.PER_DEVICE and sys.argv[1:] == [str(8 // world)]")
    report = run_check_script(path, args=["{8 // world_size}"], ranks=(1, 2), steps=2)
    assert report.verdict == "passed", report.text()
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    script(package, name="train.py")
    monkeypatch.chdir(tmp_path)
    report = run_check_script(module="pkg.train", ranks=(1, 2), steps=2)
    assert report.verdict == "passed" and report.target == "-m pkg.train", report.text()


WORKERS = """
import multiprocessing, torch, torch.distributed as dist, torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

class Pairs(Dataset):  # defined in the script: workers started from anything but a fork of it would not know it
    def __len__(self):
        return 256
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(6, generator=g), i % 3

if __name__ == "__main__":
    assert multiprocessing.get_start_method() == "fork", multiprocessing.get_start_method()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = Pairs()
    loader = DataLoader(data, batch_size=16 // dist.get_world_size(), num_workers=2,
                        sampler=DistributedSampler(data, seed=0))
    model = DDP(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_dataloader_workers_are_forked_from_the_rank_as_under_torchrun(tmp_path):
    """A rank is forked from mgpu's fork server, whose multiprocessing start method is "forkserver";
    the script gets the platform's default back, as `python SCRIPT` has it."""
    path = tmp_path / "workers.py"
    path.write_text(WORKERS)
    started = time.time()
    report = run_check_script(str(path), ranks=(1, 2), steps=2)
    assert report.verdict == "passed", report.text()
    assert time.time() - started < 30


# -- stochastic depth, switched off with dropout (check and check-script) ---------------------------------

def test_stochastic_depth_is_switched_off_with_dropout():
    from mgpu.check.dropout import DropoutOff, random_layer_modules

    tv_ops = pytest.importorskip("torchvision.ops", reason="needs torchvision (an mgpu dependency)")
    x = torch.randn(6, 4, 3)
    layer = tv_ops.StochasticDepth(0.5, "row").train()
    off = DropoutOff()
    with off:
        assert torch.equal(layer(x), x)
    assert off.calls == {"torchvision stochastic_depth": 1}
    timm_layers = pytest.importorskip("timm.layers", reason="needs timm: pip install 'mgpu[models]'")
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), timm_layers.DropPath(0.3), torch.nn.Dropout(0.2)).train()
    assert random_layer_modules(model) == ["1 (DropPath)", "2 (Dropout)"]
    with DropoutOff() as off:
        a, b = model(x), model(x)
    assert torch.equal(a, b) and torch.equal(a, model.eval()(x))
    assert off.calls["timm drop_path (stochastic depth)"] == 2
