"""`mgpu check-script --whole-run`: the script run to its own end at world 1 and world N, each training epoch
cut after --epoch-steps optimizer steps, every recorded step compared per epoch; runs kept apart; the order
of the data across epochs; a decision taken on one rank named instead of a hang; torch's own exit.

    pytest scriptcheck_tests/test_whole_run.py -m "not slow"     # six checks of examples/loops/, ~1 min on 2 cores

One check-script run per family in `make test` (examples/loops/: a checkpoint resumed, set_epoch missing and
called, an early stop on rank 0 and reduced, a schedule sized per rank); the other variants are `slow`. The
rules the runs rest on (the cut, the meeting, the folders, the epoch causes) are tested on their pure
functions here too, without a run.
"""

from __future__ import annotations

import json
import os
import textwrap
import time

import pytest

from mgpu.check.script.apart import linked_args, run_folder
from mgpu.check.script.causes.epochs import same_order, shards_apart
from mgpu.check.script.causes.parted import parted_text
from mgpu.check.script.inrank.epochs import EpochWatch
from mgpu.check.script.inrank.meeting import DDP_ALL_REDUCE, parted
from mgpu.check.script.inrank.records import EpochPass, RankRecord
from mgpu.check.script.launch import WorldRun
from mgpu.check.script.plan import ScriptCheckError, ScriptCheckOptions
from mgpu.errors import EXIT_FAILED
from mgpu.scriptcheck import WholeRun, main, run_check_script

pytestmark = [pytest.mark.reliability]

LOOPS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "loops")
GLOBAL_16 = ("--batch-size", "{16 // world_size}")


def whole_run(name: str, args=GLOBAL_16):
    return run_check_script(os.path.join(LOOPS, name), list(args), ranks=(1, 2), steps=WholeRun())


# -- options: --whole-run, --epoch-steps ----------------------------------------------------------------

def test_epoch_steps_defaults_to_4_under_whole_run_and_is_an_error_without_it():
    assert ScriptCheckOptions(whole_run=True).validate().epoch_steps == 4, "--whole-run's default --epoch-steps"
    assert ScriptCheckOptions.of((1, 2), WholeRun(), None).epoch_steps == 4, "the API's steps=WholeRun()"
    with pytest.raises(ScriptCheckError, match="--epoch-steps needs --whole-run"):
        ScriptCheckOptions(epoch_steps=3).validate()
    with pytest.raises(ScriptCheckError, match="--epoch-steps must be a positive integer"):
        run_check_script(os.path.join(LOOPS, "epochs_set_epoch.py"), steps=WholeRun(epoch_steps=0))


def test_bad_epoch_steps_on_the_command_line_is_one_line_and_exit_2(capsys):
    script = os.path.join(LOOPS, "epochs_set_epoch.py")
    for argv, said in ((["--whole-run", "--epoch-steps", "0", script], "--epoch-steps must be a positive integer"),
                       (["--epoch-steps", "2", script], "--epoch-steps needs --whole-run")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2, f"{argv}: exit {e.value.code}"
        assert said in err and len(err.splitlines()) == 1, f"{argv}: one line naming the option, got {err!r}"


# -- the cut and the epochs, in a rank (no run) -----------------------------------------------------------

def _epoch_loop(watch: EpochWatch, loader, epochs: int, per_epoch_steps: list):
    import torch

    for _ in range(epochs):
        steps = 0
        for _batch in loader:
            with torch.no_grad():
                for _ in iter(loader):    # an evaluation between two steps: a full pass, never cut
                    pass
            watch.stepped()
            steps += 1
        per_epoch_steps.append(steps)


def test_a_training_pass_is_cut_after_k_steps_and_an_evaluation_pass_between_steps_is_not():
    import torch
    from torch.utils.data import DataLoader, RandomSampler, TensorDataset

    watch = EpochWatch(epoch_steps=3, batches=[])
    watch.install()
    try:
        loader = DataLoader(TensorDataset(torch.arange(40.0)), batch_size=4, sampler=RandomSampler(range(40)))
        made = []
        _epoch_loop(watch, loader, 2, made)
    finally:
        watch.uninstall()
    training = [p for p in watch.passes if p.epoch is not None]
    evaluation = [p for p in watch.passes if p.epoch is None]
    assert made == [3, 3], f"each epoch's loop ends after --epoch-steps 3 steps, made {made}"
    assert [p.epoch for p in training] == [1, 2] and all(p.cut and p.steps == 3 for p in training), training
    assert evaluation and all(p.exhausted and not p.cut and p.batches == 10 for p in evaluation), \
        "an evaluation pass (no step between its batches) runs to its end"
    assert "test_whole_run.py:" in training[0].made_at, f"the loader's line: {training[0].made_at}"


def test_a_step_based_loop_taking_batches_with_next_is_not_cut():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    watch = EpochWatch(epoch_steps=2, batches=[])
    watch.install()
    try:
        it = iter(DataLoader(TensorDataset(torch.arange(12.0)), batch_size=2))
        taken = 0
        for _ in range(6):
            next(it)   # the script's own next(): a step-based loop runs to its own step count
            watch.stepped()
            taken += 1
    finally:
        watch.uninstall()
    assert taken == 6 and not watch.passes[0].cut, "next(it) in the script is never cut"


# -- the meeting's rule (no run) ------------------------------------------------------------------------

def _state(seq, inside=None, ended=False, epoch=1, step=4):
    return {"seq": seq, "in": inside, "ended": ended, "epoch": epoch, "step": step, "step_at": "train.py:40"}


def _in(op, seq, where="train.py:50", shape=None):
    return {"op": op, "where": where, "seq": seq, "shape": shape, "epoch": 2, "step": 4}


def test_a_rank_that_ended_before_the_collective_another_waits_in_has_left_it():
    states = [_state(4, ended=True), _state(5, _in(DDP_ALL_REDUCE, 5), epoch=2)]
    assert parted(states, 1) == {"left": 0, "how": "ended", "waiting": 1}, "rank 0 ended after 4, rank 1 waits in 5"
    text = parted_text(parted(states, 1), states)
    assert "rank 0 left the others" in text and "DDP's gradient all-reduce" in text and "broadcast" in text, text


def test_no_evidence_while_a_rank_works_alone_or_has_passed_the_collective():
    evaluating = [_state(4), _state(5, _in("barrier", 5))]   # rank 0 evaluates alone: not in a collective
    assert parted(evaluating, 1) is None, "rank 0 evaluating alone while rank 1 waits in a barrier is correct"
    passed = [_state(5, ended=True), _state(5, _in("barrier", 5))]  # rank 0 ended after joining number 5
    assert parted(passed, 1) is None, "rank 1 has not yet said it left the barrier rank 0 passed"
    alike = [_state(5, _in("all_reduce", 5, shape=[1])), _state(5, _in("all_reduce", 5, "b.py:3", [1]))]
    assert parted(alike, 0) is None, "the same collective, entered from other lines, meets"


def test_two_ranks_in_other_collectives_at_one_count_have_parted_and_the_one_behind_left():
    states = [_state(5, _in("barrier", 5), epoch=1), _state(5, _in(DDP_ALL_REDUCE, 5), epoch=2)]
    assert parted(states, 1) == {"left": 0, "how": "other", "waiting": 1}, parted(states, 1)
    tie = [_state(5, _in("barrier", 5)), _state(5, _in(DDP_ALL_REDUCE, 5))]   # a break mid-epoch: steps alike
    assert parted(tie, 0) == parted(tie, 1) == {"left": 0, "how": "other", "waiting": 1}, \
        f"the rank out of DDP's all-reduce left, whichever rank looks: {parted(tie, 0)}, {parted(tie, 1)}"
    shapes = [_state(3, _in("all_reduce", 3, shape=[1])), _state(3, _in("all_reduce", 3, shape=[4]))]
    assert parted(shapes, 0) is not None, "one all_reduce of 1 element against one of 4: not one collective"


# -- runs kept apart (no run) ---------------------------------------------------------------------------

def test_a_run_folder_links_what_args_name_and_nothing_else(tmp_path):
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "conf.yaml").write_text("a: 1")
    (tmp_path / "ckpt.pt").write_text("the user's own checkpoint")
    args = ("--data", "data/train", "--config=conf.yaml", "--out", "runs/x", "lr=0.1", "../up")
    assert sorted(linked_args(args, str(tmp_path))) == ["conf.yaml", "data/train"], linked_args(args, str(tmp_path))
    workdir, env = run_folder(str(tmp_path / "check"), "w1A-cpu", str(tmp_path), args)
    assert os.path.islink(os.path.join(workdir, "data", "train")), "data/train read through a link"
    assert not os.path.exists(os.path.join(workdir, "ckpt.pt")), "a file ARGS do not name is not there"
    assert dict(env)["WANDB_MODE"] == "disabled" and dict(env)["TMPDIR"].startswith(workdir), env


# -- the epoch causes (no run) --------------------------------------------------------------------------

def _run(world, passes_per_rank):
    return WorldRun(world, "" if world > 1 else "A", "cpu", [],
                    ranks=[RankRecord(passes=passes, rank=r) for r, passes in enumerate(passes_per_rank)])


def _pass(epoch, indices, sampler="DistributedSampler", shuffles=True):
    return EpochPass(loader=0, made_at="train.py:30", sampler=sampler, shuffles=shuffles, number=epoch, epoch=epoch,
                     steps=2, batches=2, indices=list(indices), cut=True)


def test_a_shuffling_sampler_repeating_epoch_1s_order_is_named_and_a_sequential_one_is_not():
    same = _run(1, [[_pass(1, [3, 1, 2, 0]), _pass(2, [3, 1, 2, 0])]])
    problems = same_order([same])
    assert len(problems) == 1 and "train.py:30" in problems[0].text and "set_epoch" in problems[0].text, problems
    moved = _run(1, [[_pass(1, [3, 1, 2, 0]), _pass(2, [0, 2, 1, 3])]])
    assert same_order([moved]) == [], "epoch 2 in its own order"
    sequential = _run(1, [[_pass(1, [0, 1, 2, 3], "SequentialSampler", False), _pass(2, [0, 1, 2, 3],
                                                                                   "SequentialSampler", False)]])
    assert same_order([sequential]) == [], "a sampler that does not shuffle keeps its order by design"


def test_ranks_whose_shards_overlap_are_counted_against_world_1():
    world_1 = _run(1, [[_pass(1, [0, 1, 2, 3, 4, 5, 6, 7])]])
    overlapping = _run(2, [[_pass(1, [0, 1, 2, 3])], [_pass(1, [2, 3, 4, 5])]])
    problems = shards_apart(overlapping, world_1)
    assert len(problems) == 1 and "2 example(s) trained on by more than one rank" in problems[0].text, problems
    assert "2 of world 1's not trained on" in problems[0].text, problems[0].text
    disjoint = _run(2, [[_pass(1, [0, 2, 4, 6])], [_pass(1, [1, 3, 5, 7])]])
    assert shards_apart(disjoint, world_1) == [], "a DistributedSampler's disjoint shards"
    # num_replicas=2 x the world size: each rank a quarter of world 1's examples, no overlap, half missing
    quarter = _run(2, [[_pass(1, [0, 4])], [_pass(1, [1, 5])]])
    problems = shards_apart(quarter, _run(1, [[_pass(1, [0, 2, 4, 6])]]))
    assert len(problems) == 1 and "miss examples" in problems[0].text, problems
    assert "2 of world 1's 4 example(s) not trained on by any rank" in problems[0].text, problems[0].text


# -- torch's own exit (no run) ----------------------------------------------------------------------------

def test_a_rank_that_dies_after_every_rank_saved_its_record_is_judged_on_the_records(tmp_path):
    from mgpu.check.script.launch import RankFailure, _whole_run_failure
    from mgpu.errors import LaunchError

    for r in range(2):
        (tmp_path / f"w2N-cpu-rank{r}.pt").write_bytes(b"saved")
    out = WorldRun(2, "", "cpu", [])
    out.failure = RankFailure(2, 1, "crash", "killed by SIGABRT")
    error = LaunchError("rank 1 failed: killed by SIGABRT", rank=1, kind="signal", message="killed by SIGABRT")
    assert _whole_run_failure(out, error, str(tmp_path), "w2N-cpu") is None, "both scripts ended: no failure"
    assert any("SIGABRT" in e and "terminate called" in e for e in out.exits), out.exits
    os.remove(tmp_path / "w2N-cpu-rank1.pt")
    assert _whole_run_failure(out, error, str(tmp_path), "w2N-cpu") is out.failure, "rank 1 never ended: a crash"


# -- whole runs of examples/loops/: one a family ----------------------------------------------------------

@pytest.mark.timeout(180)
def test_a_checkpoint_resumed_when_present_passes_each_run_in_its_own_folder(tmp_path, monkeypatch):
    """resume_checkpoint.py writes checkpoints/last.pt relative to its working folder each epoch and resumes
    from it when there: were the runs not kept apart, world 1's rerun would resume after epoch 3 of run A.
    Also: set_epoch called (PASSED), rank 0 evaluating alone while rank 1 waits in a barrier, the JSON."""
    monkeypatch.chdir(tmp_path)
    started = time.time()
    report = whole_run("resume_checkpoint.py")
    seconds = time.time() - started
    assert report.exit_code() == 0, report.text()
    assert os.listdir(tmp_path) == [], f"nothing written into the folder check-script ran from: {os.listdir(tmp_path)}"
    record = json.loads(json.dumps(report.to_json()))
    runs = record["whole_run"]["runs"]
    assert [len(r["epochs"]) for r in runs] == [3, 3, 3], f"three epochs in every run: {runs}"
    assert all(e["steps"] == 4 and e["ended"].startswith("cut") for r in runs for e in r["epochs"]), runs
    assert all(r["evaluation_passes"] == 3 for r in runs if r["world"] == 1), "rank 0's evaluation each epoch, not cut"
    epochs = record["comparisons"][0]["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3] and all(
        "gradients against world 1" in e["compared"] for e in epochs), f"every epoch's gradients compared: {epochs}"
    assert seconds < 60, f"a three-epoch whole run with K = 4 took {seconds:.1f} s"


@pytest.mark.timeout(180)
def test_set_epoch_never_called_fails_naming_the_loader_and_its_line():
    report = whole_run("epochs_no_set_epoch.py")
    assert report.exit_code() == EXIT_FAILED, report.text()
    problem = report.problems[0]
    assert problem.name == "epoch-order", report.text()
    assert "epochs_no_set_epoch.py:" in problem.text and "set_epoch" in problem.text and "worlds 1, 2" in problem.text, \
        f"the loader's line, the fix, both worlds: {problem.text}"


@pytest.mark.timeout(180)
def test_an_early_stop_on_rank_0s_own_accuracy_fails_within_seconds_naming_the_rank_that_left():
    report = whole_run("early_stop_rank0.py")
    failure = report.failures[0] if report.failures else None
    assert failure is not None and failure.kind == "parted" and failure.rank == 0, report.text()
    assert "early_stop_rank0.py:" in failure.message and "dist.barrier" in failure.message, failure.message
    assert "broadcast" in failure.message, f"says to reduce the decision across ranks: {failure.message}"
    world_2 = next(r for r in report.runs if r.world == 2)
    assert world_2.seconds < 30, f"ended within seconds of rank 0 leaving, not at --timeout: {world_2.seconds:.1f} s"


@pytest.mark.timeout(180)
def test_the_same_early_stop_broadcast_to_every_rank_passes():
    report = whole_run("early_stop_reduced.py")
    assert report.exit_code() == 0, report.text()


@pytest.mark.timeout(180)
def test_a_schedule_sized_per_rank_fails_at_step_2_over_the_whole_run():
    report = whole_run("schedule_per_rank.py")
    c = report.comparisons[0]
    assert c.status == "fail" and c.first.step == 2 and "lr" in c.first.tensor, report.text()
    assert "in epoch 1" in report.text(), "the failing step's epoch"


@pytest.mark.timeout(180)
def test_set_epoch_called_passes():
    report = whole_run("epochs_set_epoch.py")
    assert report.exit_code() == 0 and not report.problems, report.text()


# -- slow variants -----------------------------------------------------------------------------------------

TAIL = """
import os, threading, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=0)
loader = DataLoader(data, batch_size=8 // world, sampler=sampler)
model = DDP(nn.Linear(6, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
    {after_epoch}
{at_end}
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_rank_aborting_after_the_scripts_end_is_judged_on_its_record(tmp_path):
    """torch's gloo can end a correct rank with 'terminate called without an active exception' at exit: here
    rank 1 aborts itself after its script returned; the run is judged on the records, the exits say so."""
    path = tmp_path / "abort_at_exit.py"
    path.write_text(textwrap.dedent(TAIL).format(after_epoch="pass", at_end=(
        "dist.destroy_process_group()\nif rank == 1:\n    threading.Timer(1.0, os.abort).start()")))
    report = run_check_script(str(path), ranks=(1, 2), steps=WholeRun())
    assert report.exit_code() == 0, report.text()
    world_2 = next(r for r in report.runs if r.world == 2)
    assert any("SIGABRT" in e for e in world_2.exits), world_2.exits


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_rank_that_dies_in_epoch_2_still_fails_naming_it():
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "dies.py")
        with open(path, "w") as f:
            f.write(textwrap.dedent(TAIL).format(after_epoch=(
                "if rank == 1 and epoch == 1:\n        raise RuntimeError('rank 1 gives up')"), at_end=""))
        report = run_check_script(path, ranks=(1, 2), steps=WholeRun())
    assert report.failures and report.failures[0].rank == 1 and report.failures[0].kind == "crash", report.text()
    assert "rank 1 gives up" in report.failures[0].message, report.failures[0].message


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_epoch_steps_2_cuts_each_epoch_after_two_steps_from_the_command_line(tmp_path):
    out = tmp_path / "r.json"
    code = main(["--whole-run", "--epoch-steps", "2", "--json", str(out), os.path.join(LOOPS, "epochs_set_epoch.py"),
                 "--batch-size", "{16 // world_size}"])
    record = json.loads(out.read_text())
    assert code == 0, record["summary"]
    assert all(e["steps"] == 2 for r in record["whole_run"]["runs"] for e in r["epochs"]), record["whole_run"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_past_the_memory_bound_steps_keep_their_data_and_settings_and_say_what_was_not_compared(monkeypatch):
    """MGPU_WHOLE_RUN_KEEP_NUMEL 5000: the 515-parameter MLP keeps 4 steps' gradients and weights (1030
    elements a step), the same steps at every world size; the later steps compare their data and settings."""
    monkeypatch.setenv("MGPU_WHOLE_RUN_KEEP_NUMEL", "5000")
    report = whole_run("epochs_set_epoch.py")
    assert report.exit_code() == 0, report.text()
    epochs = report.comparisons[0].epochs
    assert "gradients against world 1" in epochs[0]["compared"], epochs[0]
    assert "gradients against world 1" not in epochs[1]["compared"] and \
        "the data against world 1" in epochs[1]["compared"], f"epoch 2 past the bound: {epochs[1]}"
    assert any("not kept" in n for n in report.comparisons[0].not_compared), report.comparisons[0].not_compared



@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_break_mid_epoch_on_rank_0_names_rank_0_in_its_barrier_and_rank_1_in_ddps_all_reduce(tmp_path):
    with open(os.path.join(LOOPS, "epochs_set_epoch.py")) as f:
        source = f.read()
    planted = source.replace("        for x, y in loader:\n", "        for step, (x, y) in enumerate(loader):\n"
                             "            if rank == 0 and step == 2:  # rank 0 alone leaves mid-epoch\n"
                             "                break\n")
    assert planted != source, "the loop line of epochs_set_epoch.py moved: plant the break again"
    path = tmp_path / "mid_epoch_break.py"
    path.write_text(planted)
    report = run_check_script(str(path), list(GLOBAL_16), ranks=(1, 2), steps=WholeRun())
    failure = report.failures[0] if report.failures else None
    assert failure is not None and failure.kind == "parted" and failure.rank == 0, report.text()
    assert "dist.barrier" in failure.message and DDP_ALL_REDUCE in failure.message, failure.message
