"""`mgpu check-script --whole-run`: the evaluation a script runs and the figures it reports, at world 1 and world N:
which examples each evaluation pass covered, the figures rank 0 printed lined up with the evidence of a cause
where one differs, and the checkpoints each rank wrote.

    pytest scriptcheck_tests/test_evaluation_whole_run.py -m "not slow"    # four whole runs, ~40 s on 2 cores

In `make test`, one whole run a family of examples/loops/: a padded evaluation (coverage), a mean of per-rank
means (figures), an exact evaluation (passes; the three-epoch time), every rank saving one path (checkpoints).
The other loops and flags are `slow`. The rules (figures read from lines, coverage counted, a figure's
evidence, the checkpoint causes, what a rank records) are tested on their pure functions here too, without a run.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time

import pytest

from mgpu.check.script.causes.checkpoints import optimizer_unsaved, shared_paths
from mgpu.check.script.evaluation import coverage_of, figure_evidence
from mgpu.check.script.figures import figures_of, line_up, unmeasured
from mgpu.check.script.inrank.records import CollectiveSeen, EpochPass, PrintedLine, RankRecord, SaveCall
from mgpu.check.script.launch import WorldRun
from mgpu.errors import EXIT_FAILED
from mgpu.scriptcheck import WholeRun, run_check_script

pytestmark = [pytest.mark.reliability]

LOOPS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "loops")
GLOBAL_16 = ("--batch-size", "{16 // world_size}")


def whole_run(name: str, *flags: str):
    return run_check_script(os.path.join(LOOPS, name), [*GLOBAL_16, *flags], ranks=(1, 2), steps=WholeRun())


def problems(report, name: str) -> list[str]:
    return [p.text for p in report.problems if p.name == name]


# -- figures read from rank 0's lines (no run) -------------------------------------------------------------

def _lines(*texts):
    return [PrintedLine(i + 1, "stdout", t) for i, t in enumerate(texts)]


def test_figures_are_labelled_by_the_words_before_them_and_a_bar_gives_its_postfix():
    figs = figures_of(_lines("epoch 0: val accuracy 0.4074 over 54 examples", " * Acc@1 71.250 Acc@5 90.100",
                             "Epoch 1: 100%|####| 4/4 [00:01<00:00, 2.5it/s, loss=0.123]"))
    said = {(f.label, f.text) for f in figs}
    for pair in (("val accuracy", "0.4074"), ("over examples", "54"), ("* Acc@1", "71.250"), ("Acc@5", "90.100"),
                 ("loss", "0.123")):
        assert pair in said, f"{pair} among the figures read: {sorted(said)}"
    assert not any(f.text in ("00", "01", "2.5", "100") for f in figs), f"a bar's time, rate and percent: {said}"


def test_time_speed_memory_progress_dates_and_world_size_figures_are_not_compared():
    figs = figures_of(_lines("took 3.2 s, 120.5 samples/s, lr 0.1, max mem 1.2 GB",
                             "2026-11-28 10:15:22,123 step 40 [640/60000 (1%)] accuracy 0.5",
                             "world size 2, rank 0: 27 examples evaluated",
                             "UserWarning: OMP_NUM_THREADS unset, we set it at 2"))
    kept = [f.label for f in figs if not unmeasured(f.label, f.unit)]
    assert kept == ["accuracy"], f"only the accuracy is a figure to compare: {[(f.label, f.unit) for f in figs]}"


def test_lines_line_up_by_template_and_occurrence():
    a = figures_of(_lines("epoch 0: acc 0.5", "epoch 1: acc 0.6"))
    n = figures_of(_lines("epoch 0: acc 0.5", "epoch 1: acc 0.7"))
    rows = [r for r in line_up(a, a, n) if r.label == "acc"]
    assert [(r.world_1.text, r.world_n.text) for r in rows] == [("0.5", "0.5"), ("0.6", "0.7")], rows


# -- coverage (no run) -----------------------------------------------------------------------------------------

def _eval(indices, made_at="val.py:30", number=1, started=1, ended=2, gathered=0, size=None):
    return EpochPass(loader=1, made_at=made_at, sampler="DistributedSampler", shuffles=False, number=number,
                     batches=max(1, len(indices) // 8), indices=list(indices), exhausted=True, started=started,
                     ended=ended, gathered=gathered, dataset_size=size)


def _world(world, passes_per_rank, collectives=None, printed=(), saves=None, state=()):
    ranks = [RankRecord(passes=p, rank=r, world=world, collectives_seen=(collectives or {}).get(r, []),
                        switches=sorted((q.started, i) for i, q in enumerate(p)),
                        printed=list(printed) if r == 0 else [], saves=(saves or {}).get(r, []),
                        optimizer_state=list(state)) for r, p in enumerate(passes_per_rank)]
    return WorldRun(world, "A" if world == 1 else "", "cpu", [], ranks=ranks)


def test_a_padded_split_repeats_and_a_dropped_tail_leaves_out_against_world_1():
    world_1 = _world(1, [[_eval(range(53), size=53)]])
    padded = coverage_of(_world(2, [[_eval(range(0, 53, 2), size=53)], [_eval([*range(1, 53, 2), 0], size=53)]]),
                         world_1)[0]
    assert (padded.seen, padded.duplicates, padded.missing, padded.problem) == (54, 1, 0, True), padded
    dropped = coverage_of(_world(2, [[_eval(range(0, 32, 2))], [_eval(range(1, 32, 2))]]),
                          _world(1, [[_eval(range(48))]]))[0]
    assert (dropped.duplicates, dropped.missing, dropped.problem) == (0, 16, True), dropped


def test_an_unpadded_split_rank_0_alone_and_gather_for_metrics_are_no_coverage_problem():
    world_1 = _world(1, [[_eval(range(53))]])
    exact = coverage_of(_world(2, [[_eval(range(0, 53, 2))], [_eval(range(1, 53, 2))]]), world_1)[0]
    assert not exact.problem and exact.shards == (27, 26), exact
    alone = coverage_of(_world(2, [[_eval(range(53))], []]), world_1)[0]
    assert alone.whole_on_a_rank and not alone.problem, alone
    gathered = coverage_of(_world(2, [[_eval(range(0, 53, 2), gathered=7)], [_eval([*range(1, 53, 2), 0])]]),
                           world_1)[0]
    assert gathered.duplicates == 1 and not gathered.problem, "gather_for_metrics drops the padding's repeats"


def test_a_main_pass_without_its_tail_and_the_tail_on_every_rank_make_one_evaluation_that_covers_all():
    """pytorch/examples imagenet's validate: a DistributedSampler(drop_last=True) pass, its sums reduced, then the
    tail (a Subset past the shards) evaluated on every rank alike: one evaluation, every example once."""
    world_1 = _world(1, [[_eval(range(53))]])
    tail = [_eval([52], made_at="val.py:40", started=5, ended=5)]
    run = _world(2, [[_eval(range(0, 52, 2)), *tail], [_eval(range(1, 52, 2)), *tail]])
    counted = coverage_of(run, world_1)
    assert len(counted) == 1 and not counted[0].problem and counted[0].seen == 53, counted
    main_only = _world(2, [[_eval(range(0, 52, 2))], [_eval(range(1, 52, 2))]])
    assert coverage_of(main_only, world_1)[0].missing == 1, "without the tail, one example left out"


def test_random_evaluation_batches_drawn_per_rank_are_counted_but_not_judged():
    sample = EpochPass(loader=1, made_at="val.py:30", sampler="RandomSampler", shuffles=True, number=1, batches=2,
                       indices=[5, 9, 2, 40], exhausted=True, started=1, ended=2, dataset_size=53)
    other = EpochPass(loader=1, made_at="val.py:30", sampler="RandomSampler", shuffles=True, number=1, batches=2,
                      indices=[7, 9, 31, 11], exhausted=True, started=1, ended=2, dataset_size=53)
    counted = coverage_of(_world(2, [[sample], [other]]), _world(1, [[sample]]))[0]
    assert counted.sampled and counted.duplicates == 1 and not counted.problem, counted


# -- a figure's evidence (no run) ------------------------------------------------------------------------------

def _row(world_1_line, world_n_line, label, seq=10):
    a = figures_of([PrintedLine(seq, "stdout", world_1_line)])
    n = figures_of([PrintedLine(seq, "stdout", world_n_line)])
    return next(r for r in line_up(a, a, n) if r.label == label)


def _reduced(rank, before, after, reduce="SUM", tensor=7, number=1, seq=5):
    return CollectiveSeen(seq, number, "all_reduce", reduce, "val.py:50", tensor + rank, len(before), tuple(before),
                          tuple(after))


def test_a_mean_of_per_rank_means_over_unequal_shards_is_named_with_the_weighted_mean():
    world_1 = _world(1, [[_eval(range(53))]])
    means = (11 / 27, 10 / 26)
    run = _world(2, [[_eval(range(0, 53, 2))], [_eval(range(1, 53, 2))]],
                 collectives={r: [_reduced(r, [means[r]], [sum(means)])] for r in (0, 1)})
    row = _row("acc 0.3962", f"acc {sum(means) / 2:.4f}", "acc")
    cause, facts = figure_evidence(row, run, world_1, {})
    assert cause == "mean-of-means" and facts["sizes"] == [27, 26], (cause, facts)
    assert abs(facts["weighted"] - 21 / 53) < 1e-12, facts


def test_an_accumulator_reduced_twice_and_rank_0s_shard_are_named():
    world_1 = _world(1, [[_eval(range(53))]])
    shards = [[_eval(range(0, 53, 2))], [_eval(range(1, 53, 2))]]
    twice = _world(2, shards, collectives={r: [_reduced(0, [21.0], [21.0], number=1, seq=4),
                                               _reduced(0, [21.0], [42.0], number=2, seq=5)] for r in (0, 1)})
    assert figure_evidence(_row("correct 21", "correct 42", "correct"), twice, world_1, {})[0] == "reduced-twice"
    alone = _world(2, shards)
    cause, facts = figure_evidence(_row("acc 0.3962", "acc 0.4074", "acc"), alone, world_1, {})
    assert cause == "rank-0-shard" and (facts["shard"], facts["whole"]) == (27, 53), (cause, facts)


def test_a_figure_printed_after_training_batches_is_no_evaluations_figure():
    train = EpochPass(loader=0, made_at="t.py:9", sampler="RandomSampler", shuffles=True, number=1, epoch=1,
                      batches=4, started=1, ended=3)
    run = _world(2, [[train], [train]])
    assert figure_evidence(_row("loss 0.5", "loss 0.6", "loss"), run, _world(1, [[train]]), {})[0] == "training"


# -- checkpoints (no run) ---------------------------------------------------------------------------------

def _save(path, optimizer=True, weights=True, how="torch.save"):
    return SaveCall(1, how, path, "train.py:60", optimizer, weights)


def test_ranks_writing_one_path_are_named_and_dcp_shards_buffers_and_rank_files_are_not():
    run = _world(2, [[], []], saves={r: [_save("/tmp/mgpu-script-x/w2N-cpu-cwd/ckpt/last.pt"),
                                         _save("/tmp/mgpu-script-x/w2N-cpu-cwd/dcp", how="dcp"), _save(""),
                                         _save(f"/runs/rank{r}.pt")] for r in (0, 1)})
    said = shared_paths(run)
    assert len(said) == 1 and "ranks 0 and 1 each torch.save to ckpt/last.pt" in said[0], said
    assert "train.py:60" in said[0] and "rank 0 alone" in said[0], said[0]


def test_a_model_saved_without_the_optimizers_state_is_a_finding_unless_saved_apart():
    only_model = _world(1, [[]], saves={0: [_save("/x/model.pt", optimizer=False)]}, state=["SGD"])
    assert "SGD" in (optimizer_unsaved(only_model) or ""), optimizer_unsaved(only_model)
    apart = _world(1, [[]], saves={0: [_save("/x/model.pt", optimizer=False), _save("/x/opt.pt", weights=False)]},
                   state=["SGD"])
    assert optimizer_unsaved(apart) is None, "a model exported beside a separate optimizer file"
    stateless = _world(1, [[]], saves={0: [_save("/x/model.pt", optimizer=False)]})
    assert optimizer_unsaved(stateless) is None, "plain SGD holds no state to lose"


# -- what a rank records (no run) --------------------------------------------------------------------------

def test_a_rank_records_its_saves_lines_and_optimizer_state_and_puts_everything_back(tmp_path):
    import torch

    from mgpu.check.script.inrank.evaluation import EvalWatch

    save, stdout = torch.save, sys.stdout
    watch = EvalWatch(rank=0)
    watch.install()
    try:
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        print("val accuracy 0.5")
        torch.save(model.state_dict(), str(tmp_path / "model.pt"))
        torch.save({"optimizer": opt.state_dict()}, io.BytesIO())
    finally:
        watch.uninstall()
    record = RankRecord()
    watch.into(record)
    assert torch.save is save and sys.stdout is stdout, "torch.save and sys.stdout put back"
    assert [p.text for p in record.printed] == ["val accuracy 0.5"], record.printed
    assert [(s.path.endswith("model.pt"), s.weights, s.optimizer) for s in record.saves] == \
        [(True, True, False), (False, False, True)], record.saves
    assert record.optimizer_state == ["SGD"], "momentum is state a resume needs"


def test_tensorboards_add_scalar_is_read_as_a_line_of_rank_0(tmp_path):
    pytest.importorskip("tensorboard", reason="pip install tensorboard")
    from mgpu.check.script.inrank.evaluation import EvalWatch

    watch = EvalWatch(rank=0)
    watch.install()
    try:
        from torch.utils.tensorboard import SummaryWriter

        watch.tick()   # the clock looks for what the script imported since
        writer = SummaryWriter(str(tmp_path))
        writer.add_scalar("val/accuracy", 0.5, 1)
        writer.close()
    finally:
        watch.uninstall()
    record = RankRecord()
    watch.into(record)
    assert [(p.stream, p.text) for p in record.printed] == [("tensorboard", "val/accuracy: 0.5")], record.printed


# -- whole runs of examples/loops/: one a family ---------------------------------------------------------------

@pytest.mark.timeout(180)
def test_an_evaluation_padded_by_distributed_sampler_fails_naming_the_loader_the_repeat_and_the_figure():
    report = whole_run("eval_padded.py")
    assert report.exit_code() == EXIT_FAILED, report.text()
    coverage = problems(report, "coverage")
    assert len(coverage) == 1 and "eval_padded.py:" in coverage[0], report.text()
    assert "54 example(s) at world 2" in coverage[0] and "1 example(s) evaluated more than once" in coverage[0], \
        coverage[0]
    assert "gather_for_metrics" in coverage[0] and "all_reduce" in coverage[0], f"what to do: {coverage[0]}"
    figure = problems(report, "figure")
    assert any("'val accuracy'" in t and "(coverage)" in t for t in figure), figure
    assert report.problems[0].name == "coverage", "the cause first, then the figures it moved"


@pytest.mark.timeout(180)
def test_a_mean_of_per_rank_means_fails_naming_the_figure_both_values_and_the_shard_sizes():
    report = whole_run("eval_mean_of_means.py")
    assert report.exit_code() == EXIT_FAILED and not problems(report, "coverage"), report.text()
    figure = problems(report, "figure")
    assert figure and "'val accuracy'" in figure[0] and "mean of per-rank means" in figure[0], report.text()
    assert "27, 26 example(s)" in figure[0] and "eval_mean_of_means.py:" in figure[0], figure[0]


@pytest.mark.timeout(180)
def test_an_exact_evaluation_passes_with_every_figure_alike_within_60_seconds():
    """Three epochs with an evaluation each (every example once, sums and counts reduced): PASSED, within 60 s
    on 2 cores; the JSON holds the coverage and the figures."""
    started = time.time()
    report = whole_run("eval_exact.py")
    seconds = time.time() - started
    assert report.exit_code() == 0 and not report.problems, report.text()
    evaluation = json.loads(json.dumps(report.to_json()))["whole_run"]["evaluation"]
    assert len(evaluation["coverage"]) == 3 and not any(c["problem"] for c in evaluation["coverage"]), evaluation
    compared = [f for f in evaluation["figures"] if not f["status"].startswith("not compared")]
    assert len(compared) == 12 and all(f["status"] == "alike" for f in compared), evaluation["figures"]
    assert seconds < 60, f"a three-epoch whole run with an evaluation each epoch took {seconds:.1f} s"


@pytest.mark.timeout(180)
def test_every_rank_saving_one_path_fails_naming_the_path_and_the_ranks():
    report = whole_run("save_every_rank.py")
    said = problems(report, "checkpoint-path")
    assert report.exit_code() == EXIT_FAILED and len(said) == 1, report.text()
    assert "ranks 0 and 1 each torch.save to checkpoint.pt" in said[0] and "save_every_rank.py:" in said[0], said[0]


# -- slow: the other loops and flags ----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(180)
def test_padding_gathered_and_cut_to_the_datasets_length_passes_with_the_repeat_in_a_note():
    report = whole_run("eval_padded.py", "--truncate")
    assert report.exit_code() == 0 and not report.problems, report.text()
    assert any("1 example(s) evaluated more than once" in n and "Not failed" in n for n in report.notes), report.notes


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_drop_last_evaluation_fails_naming_the_examples_left_out():
    report = whole_run("eval_drop_last.py")
    coverage = problems(report, "coverage")
    assert coverage and "16 of world 1's example(s) evaluated by no rank" in coverage[0], report.text()
    assert "drop_last=False" in coverage[0], coverage[0]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_rank_0s_shard_reported_as_the_whole_fails():
    figure = problems(whole_run("eval_rank0_shard.py"), "figure")
    assert figure and "its own shard (27 of world 1's 53" in figure[0] and "no collective" in figure[0], figure


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_sum_of_means_and_an_accumulator_reduced_twice_fail_naming_their_cause():
    summed = problems(whole_run("eval_mean_of_means.py", "--sum"), "figure")
    assert summed and "a sum of means" in summed[0], summed
    gathered = problems(whole_run("eval_mean_of_means.py", "--gather-object"), "figure")
    assert gathered and "mean of per-rank means" in gathered[0] and "all_gather_object" in gathered[0], gathered
    twice = problems(whole_run("eval_exact.py", "--reduce-twice"), "figure")
    assert twice and "reduced 2 times" in twice[0] and "eval_exact.py:" in twice[0], twice


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_noise_drawn_per_rank_in_the_step_says_the_figures_were_not_compared():
    report = whole_run("eval_exact.py", "--noise")
    assert not problems(report, "figure"), report.text()
    assert any("figures rank 0 reported were not compared" in n and "per rank" in n for n in report.notes), \
        report.notes


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_an_evaluation_on_rank_0_alone_passes():
    report = whole_run("eval_rank0_alone.py")
    assert report.exit_code() == 0 and not report.problems, report.text()
    coverage = report.to_json()["whole_run"]["evaluation"]["coverage"]
    assert len(coverage) == 4 and all(c["whole_on_a_rank"] for c in coverage), coverage


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_gather_for_metrics_passes_and_a_plain_gather_of_the_padded_loader_fails():
    pytest.importorskip("accelerate", reason="pip install accelerate")
    report = whole_run("eval_gather_for_metrics.py")
    assert report.exit_code() == 0 and not report.problems, report.text()
    assert "gather_for_metrics drops the repeats" in report.text(), report.text()
    plain = whole_run("eval_gather_for_metrics.py", "--gather")
    assert problems(plain, "coverage") and problems(plain, "figure"), plain.text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_saving_on_rank_0_to_a_buffer_or_beside_the_optimizer_passes_and_the_model_alone_is_a_finding():
    for flag in ("--rank0", "--separate", "--buffer"):
        report = whole_run("save_every_rank.py", flag)
        assert report.exit_code() == 0 and not report.problems and not report.findings, f"{flag}: {report.text()}"
    model_only = whole_run("save_every_rank.py", "--model-only")
    assert [f.name for f in model_only.findings] == ["checkpoint-optimizer"], model_only.text()
    assert "SGD" in model_only.findings[0].text and "model.pt" in model_only.findings[0].text, model_only.findings
