"""The A/B gate (mgpu_perf/gate/): its statistics on synthetic samples, the order of
the arms, worker failures, bad input, and a smoke run of the whole gate against HEAD.

    pytest mgpu_perf_tests/test_ab.py

The smoke run of the whole gate (every gated workload set up in both arms, three rounds, the
reports written) is mgpu_perf_tests/test_workflow.py's pull request: the GPU workflow's gate step against the
previous commit, in a fresh clone, so a broken gate or workflow fails CI.
The gate's rates on real timings are measured by `python -m mgpu_perf validate-gate` (docs/notes/perf.md).
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mgpu_perf.errors import GateError
from mgpu_perf.gate import stats as abstats
from mgpu_perf.gate.arm import Arm, ArmError
from mgpu_perf.gate.baseline import check_baseline, read_trees
from mgpu_perf.gate.compare import Comparison, compare, judge
from mgpu_perf.gate.report import gate_exit_status
from mgpu_perf.gate.rounds import round_order, round_pair
from mgpu_perf.gate.run import GateRun
from mgpu_perf.gate.settings import Settings
from mgpu_perf.gated import gated_set
from mgpu_perf.sweep import make_sweep

ROOT = Path(__file__).resolve().parent.parent  # this checkout of mgpu
GATED = len(gated_set(make_sweep(None)))  # the gated set on this machine (7 on a CPU)
LEVEL = 0.05 / GATED  # the strictest Holm level of a whole run of the gated set


def paired(ratio: float, rounds: int, noise: float, drift: float = 0.0, bias: float = 0.0, seed: int = 0):
    """Synthetic per-round samples (seconds): both arms of a round share the round's machine speed
    (a drift up to `drift`, e.g. 1.0 = twice as slow), each sample has its own lognormal noise."""
    rng = np.random.default_rng(seed)
    speed = np.exp(rng.uniform(0, math.log1p(drift), rounds)) if drift else np.ones(rounds)
    base = 0.1 * speed * np.exp(rng.normal(0, noise, rounds))
    cand = 0.1 * speed * ratio * math.exp(bias) * np.exp(rng.normal(0, noise, rounds))
    return base.tolist(), cand.tolist()


# -- statistics ------------------------------------------------------------------------------------

@pytest.mark.parametrize("ratio, expected", [(1.0, "unchanged"), (1.10, "slower"), (1 / 1.10, "faster"),
                                             (1.25, "slower")])
def test_verdict_of_a_known_ratio_under_drift_that_hits_both_arms(ratio, expected):
    # The machine's speed halves and recovers from round to round; within a round it hits both arms.
    base, cand = paired(ratio, rounds=30, noise=0.04, drift=1.0, seed=3)
    assert max(base) / min(base) > 1.5, "the synthetic drift should be larger than any effect tested"
    est = abstats.estimate(base, cand, threshold=0.10)
    assert est.ratio == pytest.approx(ratio, rel=0.03), f"estimated {est.ratio:.4f} for a true {ratio}"
    low, high = est.interval(LEVEL)
    assert low < ratio < high, f"interval [{low:.3f}, {high:.3f}] misses the true ratio {ratio}"
    assert abstats.verdict(est, 0.10, LEVEL) == expected, f"ratio {ratio}: interval [{low:.3f}, {high:.3f}]"


def test_unpaired_drift_would_fool_a_median_comparison_but_not_the_paired_ratio():
    # Drift that slows the candidate's rounds more only if they were taken at other times: paired
    # rounds share it, so the ratio stays 1 even though the arms' medians differ by chance.
    base, cand = paired(1.0, rounds=20, noise=0.02, drift=1.0, seed=11)
    est = abstats.estimate(base, cand, threshold=0.10)
    assert abstats.verdict(est, 0.10, LEVEL) == "unchanged", est
    shuffled = sorted(cand)  # the same times, no longer paired with their rounds
    assert abs(math.log(np.median(shuffled) / np.median(base))) < 1.0  # (medians alone say little either way)


def test_too_few_noisy_rounds_are_inconclusive():
    base, cand = paired(1.10, rounds=4, noise=0.15, seed=5)
    est = abstats.estimate(base, cand, threshold=0.10)
    assert abstats.verdict(est, 0.10, LEVEL) == "inconclusive", est.interval(LEVEL)


def test_a_slowdown_below_half_the_threshold_is_not_called_slower():
    base, cand = paired(1.03, rounds=40, noise=0.01, seed=2)
    est = abstats.estimate(base, cand, threshold=0.10)
    assert est.interval(LEVEL)[0] > 1.0, "the 3 % is real and resolved"
    assert abstats.verdict(est, 0.10, LEVEL) == "unchanged"


def test_exact_ratio_without_noise():
    est = abstats.estimate([0.2, 0.4, 0.1], [0.24, 0.48, 0.12], threshold=0.10)
    assert est.ratio == pytest.approx(1.2) and est.se == pytest.approx(0, abs=1e-12)
    assert abstats.verdict(est, 0.10, LEVEL) == "slower" and est.p_slower == 0.0


@pytest.mark.parametrize("base, cand, message", [([0.1, 0.2], [0.1], "as many"), ([0.1, 0.0], [0.1, 0.1], "positive"),
                                                 ([0.1, math.nan], [0.1, 0.1], "positive")])
def test_estimate_rejects_unpaired_or_impossible_samples(base, cand, message):
    with pytest.raises(ValueError, match=message):
        abstats.estimate(base, cand, threshold=0.10)


@pytest.mark.parametrize("rounds", [5, 7, 10, 13, 40, 41])
def test_the_trimmed_mean_and_its_error_are_yuens_as_scipy_computes_them(rounds):
    """Against scipy's Yuen test of two samples (`ttest_ind(trim=0.2)`) with a second sample that
    has no variance: its statistic is then (trimmed mean - c) / Yuen's error of the first sample,
    and Welch's degrees of freedom are that sample's h - 1."""
    import warnings

    from scipy import stats

    logs = (np.random.default_rng(rounds).standard_t(3, rounds) * 0.05).tolist()
    mean, se, df = abstats.trimmed_mean(logs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the constant sample's zero variance
        yuen = stats.ttest_ind(logs, [0.0] * rounds, trim=0.2, equal_var=False)
    assert mean == pytest.approx(stats.trim_mean(logs, 0.2), rel=1e-12), f"{rounds} rounds"
    assert mean / se == pytest.approx(yuen.statistic, rel=1e-9), f"{rounds} rounds: t {mean / se} vs scipy {yuen.statistic}"
    assert df == yuen.df == rounds - 2 * int(0.2 * rounds) - 1, f"{rounds} rounds: df {df} vs scipy {yuen.df}"


@pytest.mark.parametrize("trim", [-0.1, 0.4, 0.5])
def test_a_trim_that_would_leave_too_few_values_is_refused(trim):
    with pytest.raises(ValueError, match="trim must be a fraction in"):
        abstats.trimmed_mean([0.1, 0.2, 0.3, 0.4, 0.5], trim)


def test_below_five_rounds_nothing_is_trimmed():
    logs = [0.1, 0.3, -0.2, 0.05]
    mean, se, df = abstats.trimmed_mean(logs)
    assert (mean, df) == (pytest.approx(np.mean(logs)), 3)
    assert se == pytest.approx(np.std(logs, ddof=1) / 2)


def test_a_few_rounds_hit_by_a_burst_do_not_hide_a_slowdown():
    """40 rounds of a 10 % slower candidate, 1 % noise, and 4 rounds whose baseline sample a burst
    of host load made 65 % longer (log ratio -0.5): the rounds' mean comes out 3.6 %, under the
    5 % that `slower` needs; the trimmed mean drops those rounds and the run is `slower`."""
    base, cand = paired(1.10, rounds=40, noise=0.01, seed=4)
    for i in (3, 12, 25, 31):
        base[i] = cand[i] * math.exp(0.5)
    est = abstats.estimate(base, cand, threshold=0.10)
    plain = statistics.fmean(math.log(c / b) for b, c in zip(base, cand))
    assert math.exp(plain) < 1.05, f"the case must be one the mean misses ({math.exp(plain):.3f})"
    assert est.ratio == pytest.approx(1.10, rel=0.01), est
    assert abstats.verdict(est, 0.10, LEVEL) == "slower", est.interval(LEVEL)


def test_one_look_says_what_the_separate_rules_say():
    """stats.look, the loop's one call a look: the estimate, its interval, verdict and settled at its level."""
    rng = np.random.default_rng(3)
    for ratio in (0.85, 1.0, 1.03, 1.2):
        base = list(0.1 * np.exp(rng.normal(0, 0.02, 30)))
        cand = [b * ratio * math.exp(rng.normal(0, 0.02)) for b in base]
        seen = abstats.look(base, cand, 0.10, 0.05 / 7)
        est = abstats.estimate(base, cand, 0.10)
        assert seen.estimate == est and seen.interval == est.interval(0.05 / 7), (ratio, seen)
        assert seen.verdict == abstats.verdict(est, 0.10, 0.05 / 7), (ratio, seen)
        assert seen.settled == abstats.settled(est, 0.10, 0.05 / 7), (ratio, seen)


def test_holm_levels_step_down_and_stop_at_the_first_acceptance():
    levels = abstats.holm_levels([0.04, 0.001, 0.5, 0.02], alpha=0.05)
    # sorted: 0.001 <= 0.05/4 rejected; 0.02 > 0.05/3 accepted: it and every later one keep 0.05/3.
    assert levels == pytest.approx([0.05 / 3, 0.05 / 4, 0.05 / 3, 0.05 / 3])
    assert abstats.holm_levels([0.001, 0.002], alpha=0.05) == pytest.approx([0.025, 0.05])


def test_a_runs_verdicts_use_holms_corrected_levels_not_the_plain_level():
    """A planted bug passed every other test: the plain level for every benchmark instead of
    Holm's (whole-run false alarms then grow with the number of gated benchmarks). A benchmark
    whose p-value lies between alpha / k and alpha is `slower` at the plain level; judged with k - 1
    unchanged ones (k: the gated set's size), as the gate judges a run, it is not, and every level is Holm's."""
    from scipy import stats

    half, se, rounds, k = math.log1p(0.10 / 2), 0.01, 20, GATED
    t = float(stats.t.isf(0.02, rounds - 1))
    borderline = abstats.Estimate(rounds, half + t * se, se, 0.02)  # p = 0.02: 0.05 / k < p < 0.05
    assert 0.05 / k < 0.02
    flat = abstats.Estimate(rounds, 0.0, se, float(stats.t.sf(-half / se, rounds - 1)))
    assert abstats.verdict(borderline, 0.10, 0.05) == "slower", "the plant's level would flag it"
    results = [Comparison(f"bench{i}", {}, estimate=e) for i, e in enumerate([borderline] + [flat] * (k - 1))]
    results = judge(results, Settings(threshold=0.10, alpha=0.05))
    assert [r.level for r in results] == pytest.approx([0.05 / k] * k), [r.level for r in results]
    assert results[0].verdict == "inconclusive", results[0].verdict
    assert all(r.verdict == "unchanged" for r in results[1:]), [r.verdict for r in results]


@pytest.mark.parametrize("tails", ["normal", "heavy"])
def test_whole_run_false_alarm_rate_and_power_under_the_measured_noise(tails):
    """Simulated whole runs of the gated set, per-round log-ratio noise 7.5 % (the probe of this
    machine, docs/notes/perf.md) and a bias of +2.6 % that identical workers showed: at most 5 % of
    unchanged runs may flag anything `slower`; a 10 % slowdown is caught in 95 % of benchmarks.
    `heavy`: the noise has the tails recorded on a noisy day (Student's t with 3 degrees of
    freedom, excess kurtosis unbounded), where a mean's interval is at its worst."""
    rng = np.random.default_rng(0)
    runs, k, rounds, sigma = 400, GATED, 40, 0.075
    false_runs = caught = 0
    for _ in range(runs):
        aa = [abstats.estimate(*_samples(rng, 0.026, sigma, rounds, tails), threshold=0.10) for _ in range(k)]
        false_runs += any(v == "slower" for v, _ in abstats.decide(aa, 0.10, 0.05))
        slow = [abstats.estimate(*_samples(rng, math.log(1.10), sigma, rounds, tails), threshold=0.10)
                for _ in range(k)]
        caught += sum(v == "slower" for v, _ in abstats.decide(slow, 0.10, 0.05))
    assert false_runs / runs <= 0.05, f"{tails} noise: {false_runs}/{runs} unchanged runs raised a false `slower`"
    assert caught / (runs * k) >= 0.95, f"{tails} noise: caught {caught}/{runs * k} benchmarks 10 % slower"


def _samples(rng, mean_log, sigma, rounds, tails="normal"):
    base = 0.1 * np.exp(rng.normal(0, 0.1, rounds))
    # t with 3 degrees of freedom has variance 3: scaled to the same standard deviation sigma
    noise = rng.normal(0, sigma, rounds) if tails == "normal" else rng.standard_t(3, rounds) * sigma / math.sqrt(3)
    return base.tolist(), (base * np.exp(mean_log + noise)).tolist()


# -- the arms' order and the loop, with stand-in workers -------------------------------------------

class FakeArm:
    """Answers like a worker: each sample's time from `time_of(label, n)`; records every request."""

    def __init__(self, label, log, time_of, setup_answer=None, fail_on=None):
        self.label, self.log, self.time_of = label, log, time_of
        self.setup_answer = setup_answer or {"ok": True}
        self.fail_on, self.samples = fail_on, 0
        self.proc = type("P", (), {"poll": staticmethod(lambda: None)})()

    def send(self, command, **fields):
        self.log.append((self.label, f"send {command}"))
        self.sent = (command, fields)

    def answer(self, command):
        sent, fields = self.sent
        assert sent == command, f"{self.label}: answer to {command!r} asked after sending {sent!r}"
        return self.request(command, **fields)

    def request(self, command, **fields):
        self.log.append((self.label, command))
        if command == self.fail_on:
            raise ArmError(f"{self.label}: {command} failed: boom")
        if command == "setup":
            return self.setup_answer
        if command == "sample":
            self.samples += 1
            return {"times": [self.time_of(self.label, self.samples)] * fields["ops"]}
        return {"ok": True}


def _arms(log, ratio=1.0, **candidate):
    return {"baseline": FakeArm("baseline", log, lambda label, n: 0.1),
            "candidate": FakeArm("candidate", log, lambda label, n: 0.1 * ratio * (1 + 0.01 * (n % 3)), **candidate)}


def test_samples_are_sized_by_warmed_operations_not_the_workers_first_one():
    """A worker's first operation pays one-off costs (a GPU's CUDA context and first cuDNN calls:
    1 s against a 10 ms step). The samples must still hold sample_s of work: 25 steps, not 1."""
    def first_slow(label, n):
        return 1.0 if n == 1 else 0.01
    arms = {label: FakeArm(label, [], first_slow) for label in ("baseline", "candidate")}
    result = compare("b", {"kind": "x"}, arms, Settings(min_rounds=3, max_rounds=3, warmup=2, sample_s=0.25))
    assert result.ops_per_sample == 25, f"{result.ops_per_sample} operations a sample"
    assert max(result.samples["baseline"]) == pytest.approx(0.01), "the slow first operation was timed"


def test_round_order_alternates_which_arm_goes_first():
    order = [label for i in range(4) for label in round_order(i)]
    assert order == ["baseline", "candidate", "candidate", "baseline"] * 2, order


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_worker_timed_right_after_itself_favours_neither_arm(workers):
    """A worker's sample right after its own previous one is faster (warm caches: about 1 % here;
    2 % in this test).
    Whatever the number of worker pairs, both arms must get such samples equally often, or identical
    trees come out different: with pairs changing at A0 | A1 only the candidate ever ran twice in a
    row, and the same tree measured 0.987 of itself."""
    last = {"worker": None}

    def timed(label, n):
        t = 0.1 * (0.98 if last["worker"] == label else 1.0)
        last["worker"] = label
        return t

    arms = {arm: [FakeArm(arm if w == 0 else f"{arm}-{w + 1}", [], timed) for w in range(workers)]
            for arm in ("baseline", "candidate")}
    result = compare("b", {"kind": "x"}, arms, Settings(min_rounds=40, max_rounds=40, warmup=2, workers=workers))
    assert result.estimate.ratio == pytest.approx(1.0, abs=0.0015), \
        f"{workers} worker(s) an arm: the same tree measured {result.estimate.ratio:.4f} of itself"
    orders = {}
    for i in range(40):
        orders.setdefault(round_pair(i, workers), []).append(round_order(i, workers)[0])
    for pair, firsts in orders.items():
        assert firsts.count("baseline") == firsts.count("candidate"), f"pair {pair} runs one order more: {firsts}"


def test_compare_interleaves_arms_excludes_warmup_and_checks_both():
    log = []
    settings = Settings(min_rounds=6, max_rounds=6, warmup=2)
    result = compare("b", {"kind": "x"}, _arms(log, ratio=1.0), settings)
    samples = [label for label, command in log if command == "sample"]
    assert samples[:4] == ["baseline", "baseline", "candidate", "candidate"], "warm-up: each arm twice, first"
    assert samples[4:] == ["baseline", "candidate", "candidate", "baseline"] * 3, samples
    assert len(result.samples["baseline"]) == len(result.samples["candidate"]) == 6, "warm-up samples are excluded"
    assert [a for a, c in log if c == "check"] == ["baseline", "candidate"]
    assert [a for a, c in log if c == "close"] == ["baseline", "candidate"]


def test_a_smoke_run_samples_both_arms_at_once_three_rounds_without_warm_up():
    """Nothing is judged in a smoke run: it checks that each workload runs in both arms. Both
    work on each request at once (half the wall time of taking turns on two cores)."""
    log = []
    result = compare("b", {"kind": "x"}, _arms(log), Settings(smoke=True, max_rounds=3))
    samples = [(label, command) for label, command in log if command.endswith("sample")]
    both_at_once = [("baseline", "send sample"), ("candidate", "send sample"), ("baseline", "sample"),
                    ("candidate", "sample")]
    assert samples == both_at_once * 3, samples
    assert result.ops_per_sample == 1 and len(result.samples["candidate"]) == 3, result
    assert [a for a, c in log if c == "check"] == ["baseline", "candidate"]


def test_compare_stops_early_only_on_unchanged_and_judges_slower_on_every_round():
    """An unchanged benchmark stops at the first look; a slower one runs to max_rounds, so that
    `slower` is tested once (looking for it every few rounds would inflate false alarms)."""
    settings = Settings(min_rounds=5, max_rounds=20, look_every=5)
    unchanged = compare("b", {"kind": "x"}, _arms([], ratio=1.0), settings)
    assert len(unchanged.samples["baseline"]) == 5, "1 % noise around 1.0 is decided at the first look"
    slower = compare("b", {"kind": "x"}, _arms([], ratio=1.5), settings)
    assert len(slower.samples["baseline"]) == 20, "a slowdown is judged on all rounds, not at a look"
    assert abstats.verdict(slower.estimate, 0.10, 0.05) == "slower"


def test_rounds_rotate_through_worker_pairs_and_average_their_bias():
    """Two workers an arm whose candidate workers are biased +4 % and -4 % (what two identical
    processes can differ by): the rounds go to pair 0, 0, 1, 1, 0, 0, ... (each pair both orders),
    every worker sets up, warms up, checks and closes, and the biases average out to 1.00.
    With one worker (the +4 % one) the same comparison measures the bias as a change."""
    log = []
    bias = {"baseline": 1.0, "baseline-2": 1.0, "candidate": 1.04, "candidate-2": 1 / 1.04}
    arms = {arm: [FakeArm(name, log, lambda label, n: 0.1 * bias[label]) for name in (arm, f"{arm}-2")]
            for arm in ("baseline", "candidate")}
    settings = Settings(min_rounds=12, max_rounds=12, look_every=5, workers=2)  # 12 rounds, none stretched
    result = compare("b", {"kind": "x"}, arms, settings)
    assert result.pairs == [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1], result.pairs
    assert result.estimate.ratio == pytest.approx(1.0, abs=1e-9), result.estimate
    for worker in bias:
        asked = [c for label, c in log if label == worker and not c.startswith("send ")]
        assert asked[0] == "setup" and asked[-2:] == ["check", "close"], (worker, asked)
        assert asked.count("sample") == 2 + 6, f"{worker}: 2 warm-up samples and 6 rounds, got {asked}"
    single = compare("b", {"kind": "x"}, {k: [v[0]] for k, v in arms.items()}, Settings(min_rounds=10, max_rounds=12))
    assert single.estimate.ratio == pytest.approx(1.04), "one worker pair: its bias is all the gate sees"


def test_a_baseline_worker_that_cannot_set_up_makes_the_benchmark_not_comparable():
    log = []
    arms = {"baseline": [FakeArm("baseline", log, lambda *_: 0.1),
                         FakeArm("baseline-2", log, lambda *_: 0.1, setup_answer={"not_comparable": "no such model"})],
            "candidate": [FakeArm("candidate", log, lambda *_: 0.1), FakeArm("candidate-2", log, lambda *_: 0.1)]}
    result = compare("b", {"kind": "x"}, arms, Settings(workers=2))
    assert result.status == "not comparable" and "no such model" in result.reason, result
    assert sorted(label for label, c in log if c == "close") == ["baseline", "baseline-2", "candidate", "candidate-2"]


def test_a_slowdown_inside_the_unchanged_margin_but_beyond_half_the_threshold_is_not_stopped_early():
    """At threshold 5 %, a 3 % slowdown's interval lies inside the `unchanged` margin (0.952, 1.05)
    at the first look ([1.022, 1.038] here); stopping there called it `unchanged`. It must run on
    and end `slower` (more than T/2 = 2.5 %, with confidence)."""
    # One worker an arm whose pairs differ by 1 % sd: a floor of 4.1 %, under the 5 % threshold.
    settings = Settings(threshold=0.05, min_rounds=5, max_rounds=40, look_every=5, pair_bias=0.01)
    first_look = abstats.estimate([0.1] * 5, [0.1 * 1.03 / 1.01 * (1 + 0.01 * (n % 3)) for n in range(3, 8)], 0.05)
    assert abstats.verdict(first_look, 0.05, 0.05) == "unchanged", "the case must be one the old rule stopped on"
    result = compare("b", {"kind": "x"}, _arms([], ratio=1.03 / 1.01), settings)  # candidates 1.03 +- 1 %
    assert len(result.samples["baseline"]) == 40, "stopped early inside the unchanged margin"
    assert abstats.verdict(result.estimate, 0.05, 0.05) == "slower", result.estimate


def test_early_looks_do_not_inflate_false_slower():
    """Simulated A/B runs at exactly the boundary ratio 1 + T/2 (the worst case for a false
    `slower`) with 8 % per-round noise (a busy machine, still decidable in 40 rounds: at 15 % most
    runs are refused for noise in their first rounds and the looks are never reached): with looks
    at 10, 15, ..., 35 rounds and `slower` judged only at 40, the rate stays at the nominal level
    (58 in 1000 at a nominal 50); when looks could also stop on `slower` (this gate's first
    version) the same simulation gives 171 in 1000."""
    rng = np.random.default_rng(1)
    settings = Settings(min_rounds=10, max_rounds=40, look_every=5, warmup=0)
    level, runs, false = 0.05, 1000, 0
    for _ in range(runs):
        noise = iter(rng.normal(math.log(1.05), 0.08, 400).tolist())
        arms = {"baseline": FakeArm("baseline", [], lambda label, n: 0.1),
                "candidate": FakeArm("candidate", [], lambda label, n: 0.1 * math.exp(next(noise)))}
        result = compare("b", {"kind": "x"}, arms, settings, family_size=1)
        false += abstats.verdict(result.estimate, 0.10, level) == "slower"
    assert false / runs <= level + 2 * math.sqrt(level * (1 - level) / runs), f"{false}/{runs} false `slower`"


def test_a_workload_the_baseline_cannot_set_up_is_not_comparable():
    log = []
    arms = _arms(log)
    arms["baseline"].setup_answer = {"not_comparable": "ImportError: No module named 'mgpu.trainer'"}
    result = compare("b", {"kind": "x"}, arms, Settings())
    assert result.status == "not comparable" and "mgpu.trainer" in result.reason
    assert not any(c == "sample" for _, c in log), "nothing is timed for a workload one arm cannot run"
    [result] = judge([result], Settings())
    assert result.verdict == "not comparable"


@pytest.mark.parametrize("fail_on", ["sample", "check"])
def test_a_failing_workload_fails_the_comparison_never_unchanged(fail_on):
    with pytest.raises(ArmError, match="boom"):
        compare("b", {"kind": "x"}, _arms([], fail_on=fail_on), Settings(min_rounds=3, max_rounds=3))


def test_exit_status_of_the_gate():
    def judged(verdict):
        r = Comparison("b", {}, verdict=verdict)
        return r
    assert gate_exit_status([judged("unchanged"), judged("slower")], Settings()) == 1
    assert gate_exit_status([judged("unchanged"), judged("inconclusive"), judged("faster")], Settings()) == 0
    assert gate_exit_status([judged("inconclusive")], Settings(strict=True)) == 1
    assert gate_exit_status([judged("slower")], Settings(smoke=True)) == 0


# -- real workers ------------------------------------------------------------------------------------

def test_a_workload_that_fails_in_a_real_worker_names_the_error(tmp_path):
    arm = Arm("candidate", ROOT, sys.executable, tmp_path)
    try:
        assert arm.versions["torch"], arm.versions
        with pytest.raises(ArmError, match="candidate: setup failed: .*width must be a positive integer"):
            arm.request("setup", spec={"kind": "train-step", "strategy": "single", "devices": 1, "width": 0})
    finally:
        arm.close()


def test_a_worker_that_dies_fails_with_its_exit_code(tmp_path):
    arm = Arm("baseline", ROOT, sys.executable, tmp_path)
    arm.request("setup", spec={"kind": "matmul", "size": 8, "products": 1})
    arm.proc.kill()
    arm.proc.wait()
    with pytest.raises(ArmError, match="baseline worker exited with code -9"):
        arm.request("sample", ops=1)
    arm.close()


# -- bad input (the gate's options, baseline resolution and arm start as functions) -------------------------------

def _worktrees() -> list[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "worktree", "list", "--porcelain"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if line.startswith("worktree ")]


def _is_git_checkout() -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode == 0


def _broken_checkout(tmp_path) -> Path:
    tree = tmp_path / "broken"
    (tree / "mgpu").mkdir(parents=True)
    (tree / "pyproject.toml").write_text('[project]\nname = "mgpu"\n')
    (tree / "mgpu" / "__init__.py").write_text("raise ImportError('this mgpu cannot be imported')\n")
    return tree


def _not_a_python(tmp_path) -> Path:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'no torch here' >&2\nexit 1\n")
    fake.chmod(0o755)
    return fake


BAD_GATE_INPUT = {
    "unknown-revision": (lambda tmp: dict(baseline="no-such-revision-xyz"), "not a revision of the repository at"),
    "not-a-checkout": (lambda tmp: dict(baseline=str(tmp)), "is not a checkout of mgpu"),
    "baseline-is-the-candidate": (lambda tmp: dict(baseline=str(ROOT)), "that folder is the candidate itself"),
    "baseline-mgpu-broken": (lambda tmp: dict(baseline=str(_broken_checkout(tmp))), "the baseline's mgpu"),
    "python-without-torch": (lambda tmp: dict(python=str(_not_a_python(tmp))), "is not a Python with torch"),
    "python-not-executable": (lambda tmp: dict(python=str(tmp / "nothing")), "not an executable file"),
    "no-baseline": (lambda tmp: dict(), "the gate needs a baseline"),
    "threshold-0": (lambda tmp: dict(baseline="HEAD", threshold="0"), "--ab-threshold must be a percentage in (0, 100)"),
    "threshold-100": (lambda tmp: dict(baseline="HEAD", threshold="100%"),
                      "--ab-threshold must be a percentage in (0, 100)"),
    "threshold-text": (lambda tmp: dict(baseline="HEAD", threshold="ten"),
                       "--ab-threshold must be a percentage in (0, 100)"),
    "max-rounds-2": (lambda tmp: dict(baseline="HEAD", max_rounds="2"), "--ab-max-rounds must be an integer >= 3"),
    "sample-s-0": (lambda tmp: dict(baseline="HEAD", sample_s="0"), "--ab-sample-s must be a number of seconds in (0, 60]"),
    "sample-s-text": (lambda tmp: dict(baseline="HEAD", sample_s="1s"),
                      "--ab-sample-s must be a number of seconds in (0, 60]"),
    "workers-0": (lambda tmp: dict(baseline="HEAD", workers="0"), "--ab-workers must be an integer from 1 to 8 or auto"),
    "workers-9": (lambda tmp: dict(baseline="HEAD", workers="9"), "--ab-workers must be an integer from 1 to 8 or auto"),
    "workers-text": (lambda tmp: dict(baseline="HEAD", workers="two"),
                     "--ab-workers must be an integer from 1 to 8 or auto"),
}


@pytest.mark.parametrize("case", sorted(BAD_GATE_INPUT))
def test_bad_gate_input_is_a_gate_error_naming_the_problem_before_anything_is_timed(case, tmp_path):
    """The gate's options, baseline resolution and arm start as functions: GateError (one line;
    pytest's usage error, exit 4, from the plugin) and no worktree, worker or folder left behind."""
    make_options, message = BAD_GATE_INPUT[case]
    options = make_options(tmp_path)
    before = _worktrees()
    with pytest.raises(GateError) as raised:
        run = GateRun(Settings.from_values({"threshold": options.get("threshold", "10"),
                                            "max_rounds": options.get("max_rounds", "40"),
                                            "sample_s": options.get("sample_s", "0.25"),
                                            "workers": options.get("workers", "auto")}, prefix="ab-"),
                      read_trees(ROOT, options.get("baseline"), options.get("python")))
        try:
            run.start()
        finally:
            run.close()
    assert message in str(raised.value) and "\n" not in str(raised.value), str(raised.value)
    assert _worktrees() == before, "a temporary worktree was left behind"


def test_a_revision_of_another_repository_is_named_as_not_one_of_this_repository(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    subprocess.run(["git", "-C", str(other), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    sha = subprocess.run(["git", "-C", str(other), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    with pytest.raises(GateError, match=f"--ab-baseline {sha}: not a revision of the repository at {ROOT}"):
        read_trees(ROOT, sha)
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(GateError, match="is not a git repository"):
        read_trees(plain, "HEAD")


def test_good_gate_options_become_the_settings():
    settings = Settings.from_values({"threshold": "5%", "max_rounds": "12", "strict": True, "sample_s": "1.5",
                                     "workers": "2"})
    assert (settings.threshold, settings.max_rounds, settings.strict, settings.smoke, settings.sample_s,
            settings.workers) == (0.05, 12, True, False, 1.5, 2)
    assert (Settings.from_values().sample_s, Settings.from_values().workers) == (0.25, 1), \
        "at the default 10 %: one worker an arm"
    assert [Settings.from_values({"threshold": t, "workers": "auto"}).workers for t in ("9.9", "7", "5")] == [1, 2, 3], \
        "below 10 %: more workers an arm (one pair's bias comes near the T/2 margin)"
    assert Settings.from_values({"threshold": "5", "pair_bias": "0.5"}).workers == 1, \
        "a quieter machine's pair bias needs fewer"
    assert Settings.from_values({"threshold": "5", "workers": "1"}).workers == 1, "an explicit count wins"
    smoke = Settings.from_values(smoke=True)
    assert smoke.smoke and smoke.max_rounds == 3, "--benchmark-disable makes the gate a three-round smoke run"


def test_a_revision_of_this_repository_resolves_to_a_temporary_worktree_removed_afterwards():
    if not _is_git_checkout():
        pytest.skip("this folder is not a git checkout")
    before = _worktrees()
    baseline = check_baseline("HEAD", ROOT)
    assert _worktrees() == before, "checking a REF must not create the worktree yet"
    tree = baseline.checkout()
    try:
        assert (tree / "mgpu" / "__init__.py").is_file(), tree
        assert len(_worktrees()) == len(before) + 1
    finally:
        baseline.remove()
    assert _worktrees() == before and not tree.exists()


def test_the_run_says_when_the_candidate_has_uncommitted_changes(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "model.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "model.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    assert "no uncommitted changes" in read_trees(repo, "HEAD").candidate_desc
    (repo / "model.py").write_text("x = 2\n")
    run = GateRun(Settings.from_values(), read_trees(repo, "HEAD"))
    assert "WITH uncommitted changes to model.py" in run.trees.candidate_desc, run.trees.candidate_desc
    assert any("WITH uncommitted changes to model.py" in line for line in run.summary_lines())
