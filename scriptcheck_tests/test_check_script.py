"""`mgpu check-script` on bad input and faults: one line and exit 2 for what the user must fix, the world,
the rank and the last lines of the error for a crash, a bounded hang, a short script, an unseeded one.

    pytest scriptcheck_tests/test_check_script.py

Each script here is a few lines of DDP on a tiny MLP, written into tmp_path; each check runs in this
process (the fork server that forks the ranks is started once), 1 vs 2 ranks, 1 to 4 steps.
The loops people write, correct and with planted defects, are examples/test_loops.py's.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
import torch

from mgpu.errors import EXIT_FAILED, EXIT_NOT_VERIFIED, NotVerifiedError, ParityError
from mgpu.scriptcheck import check_script, main, run_check_script
from mgpu.check.script.launch import ScriptCheckError, expand_args
from mgpu.check.script.inrank.recorder import strip_wrappers

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
    """NOT VERIFIED exits 3 (not 0: a CI job must not go green having verified nothing, issue 46), with
    --strict too; --accept-not-verified is the one way to exit 0 on it."""
    path = script(tmp_path, shuffle="random.shuffle(order)")  # Python's random: seeded from the OS
    json_path = tmp_path / "report.json"
    assert main(["--ranks", "1,2", "--steps", "2", "--strict", "--json", str(json_path), path]) == EXIT_NOT_VERIFIED
    out = capsys.readouterr().out
    assert "NOT VERIFIED: two world-1 runs of the script differ (at step 1" in out, out
    assert "torch.manual_seed(0)" in out and "random.seed" in out, out
    record = json.loads(json_path.read_text())
    assert record["verdict"] == "not verified" and record["verified"] is False
    assert record["exit_code"] == EXIT_NOT_VERIFIED, record["exit_code"]
    assert record["unreproducible"]["kind"] == "data" and record["comparisons"][0]["status"] == "not-compared"
    assert main(["--ranks", "1,2", "--steps", "2", "--accept-not-verified", path]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("NOT VERIFIED:"), "accepted, still said"


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_random_numbers_drawn_in_forward_are_a_finding_not_a_failure(tmp_path):
    report = run_check_script(script(tmp_path, in_forward="h = h + 0.1 * torch.randn_like(h)"), ranks=(1, 2), steps=2)
    assert report.verdict == "not verified", report.text()
    codes = {(strict, accept): report.exit_code(strict=strict, accept_not_verified=accept)
             for strict in (False, True) for accept in (False, True)}
    assert codes == {(False, False): EXIT_NOT_VERIFIED, (True, False): EXIT_NOT_VERIFIED, (False, True): 0,
                     (True, True): EXIT_FAILED}, f"(strict, accept) -> exit code: {codes}"
    finding = next(f for f in report.findings if f["name"] == "randomness")
    assert "torch.randn_like" in finding["text"] and "first in the model (Net)" in finding["text"], finding
    assert report.comparisons[0].status == "finding" and "randomness finding" in report.comparisons[0].first.diagnosis


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_gradients_that_are_all_zero_are_not_verified_never_passed(tmp_path):
    """A loss that cannot move the weights (pytorch/examples' DDP tutorial: cross-entropy over one output)
    agrees at any world size, so the comparison proves nothing: NOT VERIFIED, saying why, exit 3 from the
    command (a real process, as CI runs it), NotVerifiedError from check_script(); accepting it is explicit,
    and --strict still fails the finding then."""
    path = script(tmp_path, before_step="[p.grad.zero_() for p in model.parameters()]")
    json_path = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "mgpu", "check-script", "--ranks", "1,2", "--steps", "2",
                           "--json", str(json_path), path], capture_output=True, text=True, timeout=240)
    assert proc.returncode == EXIT_NOT_VERIFIED, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    verdict = proc.stdout.strip().splitlines()[-1]
    assert verdict.startswith("NOT VERIFIED: every gradient world 1 recorded is zero (finding zero-gradients)"), \
        proc.stdout
    assert "give the check a loss that depends on the weights" in verdict and "PASSED" not in proc.stdout, proc.stdout
    record = json.loads(json_path.read_text())
    assert (record["verdict"], record["verified"], record["exit_code"]) == ("not verified", False, EXIT_NOT_VERIFIED), \
        {k: record[k] for k in ("verdict", "verified", "exit_code", "summary")}

    with pytest.raises(NotVerifiedError, match="every gradient world 1 recorded is zero") as raised:
        check_script(path, ranks=(1, 2), steps=2)
    report = raised.value.report
    finding = next((f for f in report.findings if f["name"] == "zero-gradients"), None)
    assert finding is not None and "2 step(s), 4 parameter(s)" in finding["text"], report.text()
    assert report.comparisons[0].status == "pass", "the comparison itself agreed: only the verdict refuses it"
    assert report.exit_code(accept_not_verified=True) == 0
    assert report.raise_unless_accepted(accept_not_verified=True) is report  # check_script(accept_not_verified=True)
    with pytest.raises(ParityError, match="finding zero-gradients") as strict:
        report.raise_unless_accepted(strict=True, accept_not_verified=True)
    assert not isinstance(strict.value, NotVerifiedError), "accepted NOT VERIFIED; --strict fails the finding"
    healthy = run_check_script(script(tmp_path, name="healthy.py"), ranks=(1,), steps=2)
    assert not any(f["name"] == "zero-gradients" for f in healthy.findings), healthy.findings
    assert healthy.verdict == "passed" and healthy.exit_code() == 0, healthy.text()


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


# -- causes that fit the evidence (docs/guide/check-script.md, "Causes and the evidence they need") ---------

@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_weights_holding_uninitialised_memory_are_named_not_called_unseeded(tmp_path):
    """A weight left as torch.empty / to_empty() made it (here: random bits, what such memory may hold)
    differs between the two seeded world-1 runs: the cause is the memory, not a missing seed."""
    garbage = ("with torch.no_grad(): model.module.fc1.weight.copy_(torch.frombuffer(bytearray(os.urandom(512)), "
               "dtype=torch.float32).view(16, 8))")
    report = run_check_script(script(tmp_path, shuffle=garbage), ranks=(1, 2), steps=1)
    d = report.unreproducible
    assert report.verdict == "not verified" and d is not None, report.text()
    assert d.diagnosis.startswith("uninitialised memory: parameter fc1.weight holds "), d.diagnosis
    assert "reset_parameters" in d.diagnosis and "not seeded" not in d.diagnosis, d.diagnosis
    assert "uninitialised memory" in report.summary() and "not seeded" not in report.summary(), report.summary()
    assert "Seed it" not in report.text(), report.text()
    assert any(f.name == "uninitialised-memory" for f in report.findings), report.findings


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_no_process_group_at_world_n_is_named_not_a_missing_sampler(tmp_path):
    """A wrapper that picked one device under torchrun: no process group, every rank trains its own copy
    on the same data. The cause is the missing process group, not the DataLoader."""
    path = tmp_path / "single.py"
    path.write_text(textwrap.dedent("""
        import torch, torch.nn.functional as F
        from torch import nn
        torch.manual_seed(0)
        model = nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g)
        for step in range(4):
            opt.zero_grad()
            F.cross_entropy(model(x[step * 8:(step + 1) * 8]), y[step * 8:(step + 1) * 8]).backward()
            opt.step()
    """))
    report = run_check_script(str(path), ranks=(1, 2), steps=2)
    c = report.comparisons[0]
    assert c.status == "fail" and c.first is not None, report.text()
    assert c.first.diagnosis.startswith("no process group at world 2: torch.distributed was never initialised"), \
        c.first.describe()
    assert "DistributedSampler" not in c.first.diagnosis, c.first.describe()


def test_the_batch_hint_names_the_scripts_own_batch_option_or_says_to_add_one(tmp_path):
    from mgpu.check.script.plan import batch_hint

    argparse_script = tmp_path / "argp.py"
    argparse_script.write_text("import argparse\np = argparse.ArgumentParser()\n"
                               "p.add_argument('--eval-batch', type=int, default=64)\n"
                               "p.add_argument('--per-gpu-batch', '-b', type=int, default=32)\n")
    hint = batch_hint([], str(argparse_script))
    assert hint.startswith('--per-gpu-batch "{32 // world_size}"'), hint
    given = batch_hint(["--per-gpu-batch", "16"], str(argparse_script))
    assert given.startswith('--per-gpu-batch "{16 // world_size}"'), given
    bare = tmp_path / "bare.py"
    bare.write_text("import torch\nBATCH = 32\n")
    hint = batch_hint([], str(bare))
    assert "--batch-size" not in hint and "takes no batch-size argument" in hint and "add one" in hint, hint
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "train.yaml").write_text("data:\n  batch_size: 48\n  eval_batch_size: 96\nlr: 0.1\n")
    hydra_script = tmp_path / "hyd.py"
    hydra_script.write_text("import hydra\n@hydra.main(config_path='conf', config_name='train', version_base=None)\n"
                            "def main(cfg):\n    pass\n")
    hint = batch_hint([], str(hydra_script))
    assert hint.startswith('"data.batch_size={48 // world_size}"'), hint


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_hydra_style_batch_override_is_written_back_as_key_equals_expression(tmp_path):
    path = tmp_path / "hydra_style.py"
    source = textwrap.dedent(LOOP).format(before_step="pass", in_forward="pass", seed="torch.manual_seed(0)",
                                          shuffle="pass", steps=4)
    path.write_text(source.replace("int(sys.argv[1]) if len(sys.argv) > 1", "int(sys.argv[1].split('=')[1]) if "
                                                                           "len(sys.argv) > 1"))
    report = run_check_script(str(path), args=["data.batch_size=8"], ranks=(1, 2), steps=1)
    d = report.comparisons[0].first
    assert d is not None and d.kind == "data" and "global batch changed size" in d.diagnosis, report.text()
    assert '"data.batch_size={8 // world_size}"' in d.diagnosis and "data.batch_size {" not in d.diagnosis, d.diagnosis


# A contrastive loop: two views of each rank's examples, the second views of every rank gathered as negatives.
CONTRASTIVE = """
import torch, torch.distributed as dist, torch.nn.functional as F
import torch.distributed.nn.functional as dnn
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

def gather(z):
    {gather}

def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    per = 8 // world
    for step in range(4):
        batch = x[(step * world + rank) * per:(step * world + rank + 1) * per]
        a = F.normalize(model(batch), dim=1)
        b = F.normalize(model({view}), dim=1)
        labels = torch.arange(per) + rank * per
        loss = F.cross_entropy(a @ gather(b).t() / 0.1, labels, reduction="sum") / {norm}
        opt.zero_grad()
        loss.backward()
        opt.step()

if __name__ == "__main__":
    main()
"""
GATHER_WITHOUT_GRAD = """parts = [torch.zeros_like(z) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, z)
    parts[dist.get_rank()] = z
    return torch.cat(parts)"""
GATHER_WITH_GRAD = "return torch.cat(dnn.all_gather(z))"


def contrastive(tmp_path, gather: str, view: str = "batch.flip(1)", norm: str = "per", name: str = "pair.py") -> str:
    path = tmp_path / name
    path.write_text(CONTRASTIVE.format(gather=gather, view=view, norm=norm))
    return str(path)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_gather_without_autograd_on_embeddings_is_a_finding_and_the_cause(tmp_path):
    report = run_check_script(contrastive(tmp_path, GATHER_WITHOUT_GRAD), ranks=(1, 2), steps=2)
    finding = next((f for f in report.findings if f.name == "collective-without-autograd"), None)
    assert finding is not None, report.text()
    assert "dist.all_gather at " in finding.text and "pair.py:9" in finding.text, finding.text
    assert "torch.distributed.nn.functional.all_gather" in finding.text, finding.text
    d = report.comparisons[0].first
    assert report.verdict == "failed" and d is not None and d.kind == "gradient", report.text()
    assert "dist.all_gather at" in d.diagnosis and "per micro-batch" not in d.diagnosis, d.describe()
    fixed = run_check_script(contrastive(tmp_path, GATHER_WITH_GRAD, name="fixed.py"), ranks=(1, 2), steps=2)
    assert fixed.verdict == "passed", fixed.text()
    assert not any(f.name == "collective-without-autograd" for f in fixed.findings), fixed.findings


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("view", ["batch.flip(1)", "batch"], ids=["two-views", "same-examples-twice"])
def test_two_forwards_into_one_loss_are_not_micro_batches(tmp_path, view):
    """Two forwards a step into one loss (a contrastive pair), with a per-rank normaliser planted: the
    diagnosis is the normaliser, not a loss weighted per micro-batch."""
    norm = "(labels % 3 == 0).sum().clamp(min=1)"  # a count taken per rank, as num_boxes is
    report = run_check_script(contrastive(tmp_path, GATHER_WITH_GRAD, view=view, norm=norm), ranks=(1, 2), steps=1)
    d = report.comparisons[0].first
    assert report.verdict == "failed" and d is not None and d.kind == "gradient", report.text()
    assert "per micro-batch" not in d.diagnosis and "accumulated" not in d.diagnosis, d.describe()
    assert "normaliser per rank" in d.diagnosis and "not micro-batches" in d.diagnosis, d.describe()


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_an_optimizer_step_before_any_training_data_is_not_step_1(tmp_path):
    """torch.distributed.checkpoint's optimizer state dict steps once with zero gradients to build the
    optimizer's state: that step is noted, not compared as training step 1."""
    dcp = ("from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict; "
           "get_optimizer_state_dict(model, opt)")
    report = run_check_script(script(tmp_path, shuffle=dcp), ranks=(1, 2), steps=2)
    assert report.verdict == "passed" and report.comparisons[0].steps == 2, report.text()
    a = next(r for r in report.runs if r.world == 1 and r.run == "A")
    assert all(rec.forwards for rec in a.ranks[0].steps), "a recorded step without training data"
    assert a.ranks[0].setup_steps == 1, a.ranks[0].setup_steps
    assert any("before the model consumed any training data" in n for n in report.notes), report.notes
