"""`python -m mgpu check` and `check_data_parallel`: the right verdict for each pitfall, a failure
with the first divergence for each planted defect, one line and exit 2 for bad input.

The models are in correctness/check_models.py, one pitfall each. Most checks here run the manual
strategy on 2 emulated devices (a second each); DDP runs are few, since each starts processes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import pytest
import torch

from conftest import requires_gpus
from correctness.helpers import COMPARISON_KIND
from correctness.processes import run_to_end
from mgpu.cli import main
from mgpu.config import CheckOptions
from mgpu.errors import EXIT_FAILED, EXIT_NOT_VERIFIED, CheckTimeout, NotVerifiedError, ParityError, SpecError
from mgpu.parity import check_data_parallel, run_check
from mgpu.check.model.report import table
from mgpu.spec import builtin_spec, load_spec
from mgpu.strategies import Manual
from mgpu.strategies.base import micro_batches

MODELS = "correctness/check_models.py"
MANUAL_2 = CheckOptions(strategies=("manual",), devices=(2,), step_timeout=30, device=COMPARISON_KIND)


def check(name: str, options: CheckOptions = MANUAL_2):
    return run_check(load_spec(f"{MODELS}:{name}"), options)


def statuses(report) -> dict:
    return {(r.name, r.strategy, r.devices): r for r in report.results}


def outcome(report) -> list:
    """Each comparison's status, and for one that failed its first divergence (a failure's reason is empty)."""
    return [(r.name, r.status, r.first_divergence.describe() if r.first_divergence else r.reason) for r in report.results]


def by_name(report, name: str):
    found = [r for r in report.results if r.name == name]
    assert found, f"no check named {name!r} in {[r.name for r in report.results]}"
    return found[0]


# -- verdicts on models with one pitfall each ---------------------------------------------------------

@pytest.mark.parametrize("model, finding", [
    ("unused_branch", "unused-parameters"),
    ("dropout", "random-layers"),
    ("zero_head_dropout", "random-layers"),
    ("batch_centred", "batch-mixing"),
    ("batchnorm", "batch-mixing"),
])
def test_a_pitfall_of_the_model_is_a_finding_and_parity_still_holds(model, finding):
    report = check(model)
    assert by_name(report, finding).status == "finding", by_name(report, finding)
    assert not report.failures, [r.first_divergence.describe() for r in report.failures]
    assert report.exit_code() == 0 and report.exit_code(strict=True) == 1
    assert by_name(report, "weights").status == "pass" and by_name(report, "accumulate").status == "pass"


def test_batch_mixing_names_the_layer_and_the_size_of_the_difference():
    result = by_name(check("batchnorm"), "batch-mixing")
    assert "1 (BatchNorm2d)" in result.reason, result.reason
    assert result.errors["max_abs"] > 1e-4, "sharded BatchNorm must differ visibly from the unsharded run"


def test_randomness_outside_dropout_skips_the_exact_checks_with_the_reason(tmp_path, capsys):
    report = check("noisy")
    assert by_name(report, "randomness").status == "finding"
    for name in ("gradients", "weights", "accumulate"):
        result = by_name(report, name)
        assert result.status == "skipped" and "random" in result.reason, result
    assert by_name(report, "replicas").status == "pass", "replicas must still agree with each other"
    # A check that compared almost nothing does not pass: the summary says so first, it exits 3 (the
    # code check-script gives NOT VERIFIED too), --strict included; accepting it is explicit.
    assert not report.verified and report.verdict == "not verified", table(report)
    codes = {(strict, accept): report.exit_code(strict=strict, accept_not_verified=accept)
             for strict in (False, True) for accept in (False, True)}
    assert codes == {(False, False): EXIT_NOT_VERIFIED, (True, False): EXIT_NOT_VERIFIED, (False, True): 0,
                     (True, True): EXIT_FAILED}, f"(strict, accept) -> exit code: {codes}"
    out = tmp_path / "check.json"
    noisy = ["check", f"{MODELS}:noisy", "--strategies", "manual", "--devices", "2"]
    assert main([*noisy, "--json", str(out)]) == EXIT_NOT_VERIFIED
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("NOT VERIFIED: 7 of 9 comparisons"), lines[:4]
    assert "--accept-not-verified accepts it" in lines[2], lines[2]
    assert main([*noisy, "--strict"]) == EXIT_NOT_VERIFIED
    assert main([*noisy, "--accept-not-verified"]) == 0
    data = json.loads(out.read_text())
    assert data["verified"] is False and data["enough_compared"] is False and data["comparisons"]["skipped"] == 7, data["comparisons"]
    assert (data["verdict"], data["exit_code"]) == ("not verified", EXIT_NOT_VERIFIED), data["exit_code"]
    with pytest.raises(NotVerifiedError, match="NOT VERIFIED: 7 of 9 comparisons") as raised:
        check_data_parallel(f"{MODELS}:noisy", strategies=("manual",), devices=(2,))
    assert isinstance(raised.value, ParityError) and raised.value.report.verdict == "not verified"
    accepted = check_data_parallel(f"{MODELS}:noisy", accept_not_verified=True, strategies=("manual",), devices=(2,))
    assert accepted.verdict == "not verified", "accepted, the report still says what it is"
    with pytest.raises(ParityError, match="check 'randomness' is a finding") as strict:
        check_data_parallel(f"{MODELS}:noisy", strict=True, accept_not_verified=True, strategies=("manual",),
                            devices=(2,))
    assert not isinstance(strict.value, NotVerifiedError), "accepted NOT VERIFIED; --strict fails the finding"


@pytest.mark.timeout(120)
def test_gradients_that_are_all_zero_are_not_verified(tmp_path):
    """A loss that cannot move the weights (cross-entropy over a single class) agrees under every strategy:
    every comparison passes and proves nothing, so the check is NOT VERIFIED, exit 3 from the command (a
    real process, as CI runs it), NotVerifiedError from check_data_parallel."""
    report = check("zero_gradients")
    assert by_name(report, "zero-gradients").status == "finding", [(r.name, r.status) for r in report.results]
    assert not report.failures and by_name(report, "gradients").status == "pass", table(report)
    assert report.verdict == "not verified" and not report.verified, table(report)
    assert table(report).splitlines()[2].startswith("NOT VERIFIED: every gradient of the single-device steps is "
                                                    "zero"), table(report)
    assert report.exit_code() == EXIT_NOT_VERIFIED and report.exit_code(accept_not_verified=True) == 0
    out = tmp_path / "check.json"
    proc = run_to_end([sys.executable, "-m", "mgpu", "check", f"{MODELS}:zero_gradients", "--strategies",
                       "manual", "--devices", "2", "--json", str(out)])
    assert proc.returncode == EXIT_NOT_VERIFIED, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert json.loads(out.read_text())["exit_code"] == EXIT_NOT_VERIFIED
    with pytest.raises(NotVerifiedError, match="every gradient of the single-device steps is zero"):
        check_data_parallel(f"{MODELS}:zero_gradients", strategies=("manual",), devices=(2,))


def test_a_check_that_compared_everything_is_verified():
    report = check("mlp")
    assert report.verified and report.to_json()["verified"] is True
    assert "NOT VERIFIED" not in table(report)
    assert not report.findings, [(r.name, r.reason) for r in report.findings]  # no zero-gradients on a live loss


# -- what models people train do (transformers, timm and user code; examples/ has the real ones) -------

def test_dropout_that_forward_calls_through_torchs_functions_is_switched_off_and_named():
    """transformers' and timm's attention pass their dropout module's p to scaled_dot_product_attention
    and F.dropout and never call the module: evaluating the modules would leave that on."""
    report = check("functional_dropout")
    assert not [r for r in report.results if r.name == "randomness"], "dropout mistaken for other randomness"
    assert not report.failures and report.verified, outcome(report)
    reason = by_name(report, "random-layers").reason
    assert "2 call(s) to scaled_dot_product_attention(dropout_p=0.1) in each forward" in reason, reason
    assert "2 call(s) to dropout(p=0.2) in each forward" in reason, reason
    assert "4 dropout module(s)" in reason, reason


def test_stochastic_depth_is_switched_off_and_named_not_taken_for_randomness():
    """timm's ViT with drop_path_rate=0.1 (its training recipes' setting) was `randomness`, 56 of 72
    comparisons skipped, NOT VERIFIED: DropPath draws a per-example keep mask, a sibling of dropout.
    Now it is switched off like dropout and named in random-layers; every comparison runs."""
    timm = pytest.importorskip("timm", reason="needs timm: pip install 'mgpu[models]'")
    from mgpu.spec import image_spec

    def vit():
        return timm.models.vision_transformer.VisionTransformer(
            img_size=8, patch_size=4, in_chans=1, num_classes=4, embed_dim=16, depth=2, num_heads=2,
            drop_path_rate=0.1)

    report = run_check(image_spec(vit, (1, 8, 8), 4, name="vit_drop_path"), MANUAL_2)
    assert not [r for r in report.results if r.name == "randomness"], "stochastic depth taken for randomness"
    assert not report.failures and report.verified, outcome(report)
    reason = by_name(report, "random-layers").reason
    assert reason.startswith("dropout and stochastic depth switched off for every check") and "drop_path" in reason, \
        reason


@pytest.mark.parametrize("model", ["record_output", "named_output"])
def test_a_dict_output_is_scored_on_its_logits_or_the_field_the_spec_names(model):
    report = check(model)
    assert not report.failures and report.verified, outcome(report)


def test_lazy_modules_are_materialised_before_anything_is_copied():
    spec = load_spec(f"{MODELS}:lazy")
    built = spec.build_seeded(3)
    assert built.fc1.weight.shape == (16, 64) and torch.equal(built.fc1.weight, spec.build_seeded(3).fc1.weight)
    report = check("lazy")
    assert not report.failures and report.verified, outcome(report)


def test_batch_mixing_through_a_buffer_read_in_the_same_forward_names_the_buffer():
    report = check("buffer_read_in_forward")
    reason = by_name(report, "batch-mixing").reason
    assert "the model as a whole, through buffer scale, which forward writes from the batch" in reason, reason


def test_a_per_micro_step_mean_under_accumulation_is_caught(monkeypatch):
    """Each micro-step's loss weighted as its own mean over the number of micro-steps: right when the
    micro-steps are of one size, wrong otherwise (transformers' Trainer fixed this in 2024). The
    accumulation check's batch gives every device count micro-steps of different sizes."""
    from mgpu.strategies import single as single_module

    def per_micro_step_mean(self, X, y, global_batch_size, micro_steps=1):
        pieces = list(micro_batches(X, y, micro_steps))
        stats = torch.zeros(2, device=self.devices[0])
        for k, (X_piece, y_piece) in enumerate(pieces):
            scale = self.loss_scale(global_batch_size) * len(y) / (len(pieces) * len(y_piece))
            loss, piece_stats = self.objective.loss_and_stats(self.net(*self.inputs(X_piece, self.devices[0])),
                                                              y_piece.to(self.devices[0]), scale)
            loss.backward()
            stats += piece_stats
        return stats

    monkeypatch.setattr(single_module.SingleDevice, "forward_backward", per_micro_step_mean)
    options = CheckOptions(strategies=("dataparallel",), devices=(2,), step_timeout=30, device=COMPARISON_KIND)
    report = check("mlp", options)
    failed = by_name(report, "accumulate")
    assert failed.status == "fail" and failed.first_divergence.step == 1, failed
    assert by_name(report, "weights").status == "pass", "micro-steps of one size hide it: only accumulation shows"


def test_a_mean_loss_fails_with_the_cause():
    report = check("mean_loss")
    assert by_name(report, "loss-not-a-sum").status == "finding"
    failed = by_name(report, "gradients")
    assert failed.status == "fail" and "not a sum" in failed.reason, failed
    assert report.exit_code() == 1


def test_tied_weights_stay_tied_and_token_models_pass():
    report = check("tied_lm")
    assert by_name(report, "ties").status == "pass" and not report.failures


# -- planted defects in mgpu itself: each is a failure with its first divergence -----------------------

def _first(report, name):
    result = by_name(report, name)
    assert result.status == "fail", f"{name} should fail: {result}"
    assert result.first_divergence is not None and result.reproduce.startswith("python -m mgpu check")
    return result.first_divergence


def test_a_replica_that_skips_the_optimizer_step_is_named(monkeypatch):
    def skipping_step(self):
        for i, opt in enumerate(self.opts):
            if i != 1:
                opt.step()
            opt.zero_grad(set_to_none=True)
        self._broadcast_buffers()

    monkeypatch.setattr(Manual, "optimizer_step", skipping_step)
    div = _first(check("mlp"), "replicas")
    assert (div.step, div.replica) == (1, 1) and div.tensor.startswith("weight "), div


def test_a_loss_averaged_per_shard_by_the_strategy_is_caught(monkeypatch):
    from mgpu.comm import split_batch

    def per_shard_mean(self, X, y, global_batch_size, micro_steps=1):
        stats = torch.zeros(2)
        for replica, device, X_shard, y_shard in zip(self.replicas, self.devices, *split_batch(X, y, self.devices)):
            loss, s = self.objective.loss_and_stats(replica(*self.inputs(X_shard, device)), y_shard,
                                                    1.0 / y_shard.shape[0])  # each shard's mean ...
            loss.backward()
            stats += s
        self.sync_gradients(len(self.devices))  # ... averaged over the devices: wrong when shards are uneven
        return stats

    monkeypatch.setattr(Manual, "forward_backward", per_shard_mean)
    div = _first(check("mlp"), "uneven")  # 13 examples: shards of 7 and 6
    assert div.step == 1 and div.tensor.startswith("gradient "), div


def test_accumulation_that_syncs_every_micro_step_without_dividing_is_caught(monkeypatch):
    def sync_each_micro_step(self, X, y, global_batch_size, micro_steps=1):
        from mgpu.comm import split_batch

        Xs, ys = split_batch(X, y, self.devices)
        pieces = [list(micro_batches(a, b, micro_steps)) for a, b in zip(Xs, ys)]
        stats = torch.zeros(2)
        for k in range(micro_steps):
            for replica, device, shard in zip(self.replicas, self.devices, pieces):
                loss, s = self.objective.loss_and_stats(replica(*self.inputs(shard[k][0], device)), shard[k][1], 1.0)
                loss.backward()
                stats += s
            self.sync_gradients(global_batch_size // micro_steps)  # every micro-step, loss not divided by K
        return stats

    monkeypatch.setattr(Manual, "forward_backward", sync_each_micro_step)
    report = check("mlp")
    assert by_name(report, "weights").status == "pass", "without accumulation the plant does nothing"
    div = _first(report, "accumulate")
    assert div.step == 1, div


def test_a_step_that_reports_each_shards_mean_correctness_is_caught(monkeypatch):
    from mgpu import spec as specmod

    monkeypatch.setattr(specmod.Objective, "loss_and_stats", _mean_correct_stats)
    div = _first(check("mlp"), "statistics")
    assert div.tensor == "reported correct count", div


def _mean_correct_stats(self, output, target, scale):
    loss_sum = self.loss(output, target)
    correct = self.correct(output, target).detach() / target.shape[0]
    return loss_sum * scale, torch.stack([loss_sum.detach().float(), correct.float()])


# -- DDP: ranks that start apart, a reassigned buffer ---------------------------------------------------

@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_ddp_ranks_seeded_apart_start_equal_and_a_buffer_computed_from_the_batch_fails(tmp_path, capsys):
    """One DDP spawn: ranks build the model from different seeds (a random non-persistent buffer
    included) and must start equal; a buffer reassigned in forward from the batch fails for manual
    and ddp, naming the buffer, the step, and the cause."""
    out = tmp_path / "check.json"
    code = main(["check", f"{MODELS}:reassigned_buffer", "--strategies", "manual,ddp", "--devices", "2",
                 "--steps", "2", "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 1, captured.out + captured.err
    assert "starting 2 ranks" in captured.err and "ddp on 2 ranks: start: pass" in captured.err, captured.err
    checks = {(c["name"], c["strategy"]): c for c in json.loads(out.read_text())["checks"]}
    for strategy in ("manual", "ddp"):
        assert checks[("start", strategy)]["status"] == "pass", checks[("start", strategy)]
        assert checks[("replicas", strategy)]["status"] == "pass", "mgpu copies rank 0's buffers every step"
        failed = checks[("buffers", strategy)]
        assert failed["status"] == "fail", failed
        div = failed["first_divergence"]
        assert (div["tensor"], div["step"], div["replica"]) == ("buffer seen_scale", 1, 0), div
        assert "computed from the batch" in failed["reason"] and "reassigned" in failed["reason"], failed["reason"]
    assert checks[("forward-buffers", None)]["status"] == "finding"


# -- the command: table, JSON, exit codes ----------------------------------------------------------------

def test_cli_table_json_and_exit_codes(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["check", f"{MODELS}:mean_loss", "--strategies", "manual,dataparallel", "--devices", "2",
                 "--json", str(out)]) == 1
    captured = capsys.readouterr()
    assert "FAILED" in captured.out and "reproduce: python -m mgpu check" in captured.out, captured.out
    data = json.loads(out.read_text())
    record = data["checks"][0]
    assert set(record) == {"name", "strategy", "devices", "status", "reason", "errors", "first_divergence", "reproduce"}
    failed = [c for c in data["checks"] if c["status"] == "fail"]
    assert failed and set(failed[0]["first_divergence"]) >= {"step", "tensor", "replica", "max_abs", "max_rel"}
    assert main(["check", f"{MODELS}:dropout", "--strategies", "manual", "--devices", "2"]) == 0
    assert main(["check", f"{MODELS}:dropout", "--strategies", "manual", "--devices", "2", "--strict"]) == 1


def test_a_bare_module_with_input_shape_reads_the_classes_off_its_output(capsys):
    assert main(["check", f"{MODELS}:plain_module", "--input-shape", "1,8,8", "--strategies", "manual",
                 "--devices", "3", "--batch-size", "7", "--accumulate", "2"]) == 0, capsys.readouterr().err


def test_check_data_parallel_raises_an_assertion_with_the_first_divergence():
    with pytest.raises(ParityError) as info:
        check_data_parallel(f"{MODELS}:mean_loss", strategies=("manual",), devices=(2,))
    assert isinstance(info.value, AssertionError)
    message = str(info.value)
    assert "differs" in message and "reproduce:" in message and "not a sum" in message, message
    assert check_data_parallel(f"{MODELS}:mlp", strategies=("manual",), devices=(2, 3)).exit_code() == 0


def test_the_reproducer_keeps_the_device_kind():
    with pytest.raises(ParityError) as info:
        check_data_parallel(f"{MODELS}:mean_loss", strategies=("manual",), devices=(2,), device="cpu")
    assert "--devices 2" in str(info.value) and "--device cpu" in str(info.value), str(info.value)


# -- bad input: one line, exit 2 ---------------------------------------------------------------------------

BAD = [
    (["nosuchmodule_xyz:f"], "cannot import nosuchmodule_xyz: ModuleNotFoundError"),
    ([f"{MODELS}:nothing_here"], "has no function 'nothing_here'"),
    ([f"{MODELS}:raises"], "raised ValueError: width must be even"),
    ([f"{MODELS}:returns_int"], "returned int"),
    ([f"{MODELS}:wrong_classes"], "does not fit the loss"),
    ([f"{MODELS}:plain_module", "--input-shape", "3,8,8"], "do not fit the model"),
    ([f"{MODELS}:no_parameters", "--input-shape", "1,8,8", "--classes", "4"], "no parameters"),
    ([f"{MODELS}:plain_module", "--input-shape", "1,8"], "input shape must be C,H,W"),
    ([f"{MODELS}:plain_module", "--input-shape", "1,8,-8"], "input shape must be C,H,W"),
    ([f"{MODELS}:plain_module"], "give the shape of one input image with --input-shape"),
    ([f"{MODELS}:mlp", "--accumulate", "0"], "accumulate must be a positive integer"),
    ([f"{MODELS}:mlp", "--batch-size", "2", "--devices", "3"], "smaller than 3 devices"),
    ([f"{MODELS}:mlp", "--strategies", "zero3"], "unknown strategy 'zero3'"),
    ([f"{MODELS}:mlp", "--devices", "two"], "devices must be comma-separated integers"),
    (["nocolon"], "model must be MODULE:FUNCTION"),
    ([f"{MODELS}:hangs", "--strategies", "manual", "--devices", "2", "--step-timeout", "0.25"],
     "did not finish within 1 s"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        code = main(["check", *args])
        raise SystemExit(code)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2, err
    assert err and err[-1].startswith("mgpu: error: ") and message in err[-1], err


def test_a_hanging_model_names_the_strategy_and_step():
    options = CheckOptions(strategies=("manual",), devices=(2,), step_timeout=0.5)
    spec = load_spec(f"{MODELS}:mlp")
    calls = {"n": 0}
    original = Manual.optimizer_step

    def hang_in_step_two(self):
        calls["n"] += 1
        if calls["n"] == 2:
            import time
            time.sleep(60)
        original(self)

    mp = pytest.MonkeyPatch()
    mp.setattr(Manual, "optimizer_step", hang_in_step_two)
    try:
        with pytest.raises(CheckTimeout, match=r"manual on 2 devices: step 2 did not finish"):
            run_check(spec, options)
    finally:
        mp.undo()


def test_the_step_timeout_does_not_count_torch_compile_compiling():
    """A --compile run's first step compiles, for minutes with a cold compiler cache beside other
    work (a brand-new CI runner): that is no hang. The timer stops while torch._dynamo's compile
    callbacks say a compile runs (driven here by torch's own handler, as a real compile drives it),
    and time outside the compile still counts."""
    import time

    import torch._dynamo.callback as compiling
    from mgpu.check.model.timeout import step_timeout

    compile_s, timeout_s = 0.6, 0.3
    began = time.perf_counter()
    with step_timeout(timeout_s, "compiled step 1"):
        for trigger in (compiling.CallbackTrigger.DYNAMO, compiling.CallbackTrigger.LAZY_BACKWARD):
            with compiling.callback_handler.install_callbacks(trigger, "0/0"):
                time.sleep(compile_s / 2)
        time.sleep(timeout_s / 3)
    assert time.perf_counter() - began >= compile_s, "the block did not run whole"
    assert not compiling.callback_handler.start_callbacks, "the pause's callbacks outlived the step"
    with pytest.raises(CheckTimeout, match=r"compiled step 2 did not finish within 0.3 s.*compiling is not counted"):
        with step_timeout(timeout_s, "compiled step 2"):
            with compiling.callback_handler.install_callbacks(compiling.CallbackTrigger.DYNAMO, "1/0"):
                time.sleep(0.05)
            time.sleep(5)  # past the time left after the compile: a hang
    assert not compiling.callback_handler.end_callbacks, "the pause's callbacks outlived the timed-out step"


def test_a_step_timeout_puts_back_the_timer_it_found():
    """pytest-timeout's backstop (pytest.ini's timeout) is a SIGALRM timer too: a check run in a test's
    own process leaves it running, with its handler and the time it had left, so that a hang later in
    the same test still ends; one that came due during the step fires when the step ends."""
    import signal
    import time

    from mgpu.check.model.timeout import step_timeout

    fired = []
    handler = lambda signum, frame: fired.append(time.monotonic())  # noqa: E731
    old_handler = signal.signal(signal.SIGALRM, handler)
    old_left, old_interval = signal.setitimer(signal.ITIMER_REAL, 30)
    try:
        with step_timeout(5, "step 1"):
            time.sleep(0.1)
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert signal.getsignal(signal.SIGALRM) is handler, "the caller's SIGALRM handler was not put back"
        assert 29.0 < left < 29.95, f"the caller's timer has {left:.2f} s left after a 0.1-s step, not about 29.9"
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with step_timeout(5, "step 2"):
            time.sleep(0.5)  # the caller's timer comes due here
        ended = time.monotonic()
        while not fired and time.monotonic() < ended + 2:
            time.sleep(0.01)
        assert fired and fired[0] - ended < 1, f"the caller's timer, due during the step, did not fire when it ended: {fired}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, old_left, old_interval)
        signal.signal(signal.SIGALRM, old_handler)


def test_a_ranks_step_timeout_leaves_out_what_the_other_ranks_compiled(tmp_path):
    """Under --compile a rank waits at a collective for a rank that compiles again (its pieces of the
    batch have another shape). The ranks write their compile seconds to a folder they share; a step's
    timer leaves out what the others compiled while it ran, and a wait with nothing compiling beside
    it still times out. This rank's own compiles are written for the others."""
    import time

    import torch._dynamo.callback as compiling
    from mgpu.check.model.timeout import step_timeout

    peer = tmp_path / "rank-999999"  # another rank's file, as its RankCompiles writes it
    began = time.time()
    peer.write_text(f"0.0 {began!r}")  # compiling from now on
    with step_timeout(0.3, "ddp on 2 ranks (rank 1): step 1", peers=str(tmp_path)):
        time.sleep(0.7)  # at the all-reduce, waiting for the compiling rank
        peer.write_text(f"{time.time() - began!r} ")  # its compile ends; it joins
        with compiling.callback_handler.install_callbacks(compiling.CallbackTrigger.DYNAMO, "0/0"):
            time.sleep(0.1)  # this rank compiles too
    mine = tmp_path / f"rank-{os.getpid()}"
    total, in_progress = mine.read_text().split(" ")
    assert float(total) >= 0.1 and not in_progress, f"this rank's compile seconds were not written: {mine.read_text()!r}"
    with pytest.raises(CheckTimeout, match=r"rank 1\): step 2 did not finish within 0.3 s"):
        with step_timeout(0.3, "ddp on 2 ranks (rank 1): step 2", peers=str(tmp_path)):
            time.sleep(5)  # nobody compiles: a hang


def test_a_real_process_prints_one_line_leaves_nothing_behind(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = run_to_end([sys.executable, "-m", "mgpu", "check", f"{MODELS}:hangs", "--strategies", "ddp",
                       "--devices", "2", "--step-timeout", "0.25"], env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("mgpu: error: "), proc.stderr
    assert list(tmp_path.iterdir()) == [], "a temporary file or folder was left behind"


def test_spec_errors_from_the_api_are_spec_errors():
    with pytest.raises(SpecError, match="returned int"):
        load_spec(f"{MODELS}:returns_int")


# -- pytest correctness --model: the parity properties on a user's model ---------------------------------

@pytest.mark.timeout(180)
def test_pytest_model_option_runs_the_parity_properties_and_fails_a_planted_defect_with_its_first_divergence(
        pytester, monkeypatch):
    """`pytest correctness --model ...` deselects the rest of the suite and fails the defect's
    property with the check's message (the buffer, the step, the command that reproduces it).
    In this process (pytester): a fresh pytest session, without a second interpreter and torch import."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.chdir(root)  # where a user types it; pytester had moved into its own folder
    result = pytester.runpytest_inprocess(
        "correctness", "--rootdir", root, "-c", os.path.join(root, "pytest.ini"),
        "--model", "examples/planted_defect.py:defect", "--input-shape", "3,8,8", "--classes", "4",
        "--parity-examples", "2", "-k", "in_process", "-p", "no:cacheprovider", "-q")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 1, f"exit {result.ret}:\n{out[-3000:]}"
    assert "1 failed" in out and "deselected" in out and " passed" not in out, out[-3000:]
    assert "buffer batch_scale differs after step" in out and "python -m mgpu check examples/planted_defect.py:defect" in out, out[-3000:]


@requires_gpus(1)
def test_a_correct_model_passes_on_one_gpu_against_a_float32_reference_on_that_gpu():
    # On an H200 the GPU's float32 gradients of LeNet were 3.4 times past an allowance sized by the
    # CPU's float32 run: the float32 reference must run where the checked run did.
    options = CheckOptions(strategies=("manual", "ddp"), devices=(1,), step_timeout=60)
    report = run_check(builtin_spec("lenet"), options)
    assert not report.failures, "\n".join(f"{r.strategy} x{r.devices} {r.name}: {r.first_divergence.describe()}"
                                            for r in report.failures if r.first_divergence)


def test_the_float32_reference_runs_on_the_checked_runs_first_device(monkeypatch):
    """The float32 step that sizes the allowance runs on the checked run's first device: cuda:0 when
    there is a GPU for every device of the run, else the CPU (emulated devices); the CPU under
    --device cpu. On this machine as it is, and on one with 2 GPUs."""
    from mgpu import devices as devmod
    from mgpu.check.model.plans import run_device

    for n in (2, 3):
        first = "cuda:0" if devmod.comparison_kind(n, devmod.gpu_count()) == "cuda" else "cpu"
        assert run_device(n) == torch.device(first), (n, devmod.gpu_count())
        assert run_device(n, "cpu") == torch.device("cpu")
    monkeypatch.setattr(devmod, "gpu_count", lambda: 2)
    assert run_device(2) == torch.device("cuda:0") and run_device(2, "cpu") == torch.device("cpu")
    assert run_device(3) == torch.device("cpu"), "3 devices on 2 GPUs: emulated on the CPU"


def test_a_dict_output_without_logits_or_a_named_field_is_one_line_naming_its_fields(capsys):
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(["check", f"{MODELS}:unnamed_output", "--strategies", "manual", "--devices", "2"]))
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and err[-1].startswith("mgpu: error: "), err
    assert "OutputRecord with hidden, scores and no 'logits'" in err[-1] and "ModelSpec(output=...)" in err[-1], err


def test_a_lazy_model_whose_first_forward_fails_is_one_line(capsys):
    code = main(["check", f"{MODELS}:lazy_unbuildable", "--input-shape", "1,8,8", "--classes", "4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("mgpu: error: "), err
    assert "could not be materialised" in err[-1] or "do not fit the model" in err[-1], err


def test_check_amp_bf16_passes_a_correct_model_and_fails_a_planted_defect():
    """--amp bf16: every run's forward under bfloat16 autocast, the allowance sized by the
    single-device bf16 step's distance from the float64 step (far wider than float32's)."""
    import dataclasses

    options = dataclasses.replace(MANUAL_2, amp="bf16")
    report = check("batchnorm", options)
    assert not report.failures and report.verified, [(r.name, r.status, r.first_divergence) for r in report.results]
    widest = max(r.errors.get("max_rel", 0.0) for r in report.results if r.name == "weights")
    assert widest > 1e-4, f"bf16 runs as close as float32 ones ({widest:.2e}): did autocast run at all?"
    defect = run_check(load_spec("examples/planted_defect.py:defect", input_shape="3,8,8", classes=4), options)
    failed = by_name(defect, "buffers")
    assert failed.status == "fail" and failed.first_divergence.tensor == "buffer batch_scale", failed
    assert "--amp bf16" in failed.reproduce, failed.reproduce


@pytest.mark.parametrize("model", ["own_loss_lm", "own_loss_classifier"])
def test_a_model_that_computes_its_own_loss_from_labels_passes(model):
    """ModelSpec(labels="labels"): the target goes in as labels=, the model's own loss is made a sum
    (times the examples for a mean over them; num_items_in_batch=1 for a mean over counted tokens)."""
    report = check(model, dataclasses.replace(MANUAL_2, strategies=("manual", "dataparallel")))
    assert not report.failures and report.verified and not report.findings, \
        [(r.strategy, r.name, r.status, r.reason) for r in report.results if r.status != "pass"]


def test_a_padded_lms_own_loss_taken_as_a_mean_per_shard_fails_uneven_and_accumulation():
    """A mean over each shard's tokens weighs the tokens of shards with fewer of them more: the
    finding names the cause, and the first divergence is at step 1."""
    report = check("own_loss_lm_as_a_mean")
    assert by_name(report, "loss-not-a-sum").status == "finding", report.findings
    assert "num_items_in_batch" in by_name(report, "loss-not-a-sum").reason
    failed = by_name(report, "gradients")
    assert failed.status == "fail" and failed.first_divergence.step == 1 and "not a sum" in failed.reason, failed


def test_a_crash_of_one_rank_strategy_fails_that_strategy_alone():
    """ddp and fsdp share one spawn of the ranks; when it fails, each is run alone again, so the crash
    is told to the strategy that made it and the other one is still checked."""
    report = check("crashes_sharded", CheckOptions(strategies=("ddp", "fsdp"), devices=(2,), steps=1, step_timeout=30,
                                                   device=COMPARISON_KIND))
    fsdp = [r for r in report.results if r.strategy == "fsdp"]
    assert [(r.name, r.status) for r in fsdp] == [("all", "fail")], fsdp
    assert "the run crashed" in fsdp[0].reason and "cannot be sharded" in fsdp[0].reason, fsdp[0].reason
    ddp = {r.name: r.status for r in report.results if r.strategy == "ddp"}
    assert ddp and set(ddp.values()) <= {"pass", "skipped"} and ddp["gradients"] == "pass", ddp


def test_the_json_report_writes_an_infinite_relative_error_as_null(tmp_path):
    """A weight whose float64 reference is zero (timm zero-initialises some BatchNorm weights) has an
    infinite relative error; JSON has no infinity, and the report must still be written."""
    from mgpu.check.model.report import CheckResult, Report
    from mgpu.check.model.report import write_json

    report = Report("zeros", MANUAL_2, [CheckResult("weights", "manual", 2, "pass",
                                                    errors={"max_abs": 1e-9, "max_rel": float("inf")})])
    write_json(report, tmp_path / "check.json")
    record = json.loads((tmp_path / "check.json").read_text())["checks"][0]
    assert record["errors"] == {"max_abs": 1e-9, "max_rel": None}, record
