"""Data-parallel parity of one model, as hypothesis properties: the checks of `python -m mgpu check`
(mgpu/parity: gradients, weights, every buffer, optimizer state, reported statistics, replicas
equal after every step, tied weights, uneven shards, gradient accumulation) over drawn device
counts, batch sizes, steps, micro-steps and seeds.

    pytest correctness/test_parity.py                                # mgpu's own LeNet and ResNet-18 (width 4)
    pytest correctness --model examples/tiny_lm.py:spec              # your model; the rest of the suite deselected
    pytest correctness --model torchvision.models:mobilenet_v3_small --input-shape 3,32,32 --classes 10

A failing example raises the check's ParityError: the first divergence (step, tensor, device,
errors) and the command that reproduces it; hypothesis adds the drawn example.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from correctness.draws import seeds
from correctness.helpers import COMPARISON_KIND
from correctness.shared_jobs import ParityCase, builtin_cases, fewest_training_examples, rank_report
from correctness.shared_runs import parity_job
from mgpu.parity import CheckOptions, check_data_parallel, run_check
from mgpu.strategies import RANK_STRATEGIES

pytestmark = [pytest.mark.parity, pytest.mark.rounding]

IN_PROCESS = ("manual", "dataparallel")
EXACT_CHECKS = ("gradients", "weights", "optimizer", "statistics", "uneven", "accumulate")


def _cases(config) -> dict[str, ParityCase]:
    spec = getattr(config, "mgpu_model_spec", None)  # set by the root conftest from --model
    if spec is not None:
        return {config.getoption("model"): ParityCase(spec, config.getoption("parity_examples"),
                                                      {s: (2, 3) for s in RANK_STRATEGIES})}
    return builtin_cases()


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames:
        cases = _cases(metafunc.config)
        if "rank_strategy" in metafunc.fixturenames:
            pairs = [(c, s) for name, c in cases.items() for s in RANK_STRATEGIES if s in c.world_sizes]
            ids = [f"{name}-{s}" for name, c in cases.items() for s in RANK_STRATEGIES if s in c.world_sizes]
            metafunc.parametrize("case, rank_strategy", pairs, ids=ids, scope="module")
        else:
            metafunc.parametrize("case", list(cases.values()), ids=list(cases), scope="module")


# What the two fixtures below learn of a model, by the model's name: both tests use it, and the
# rank test's parametrization (case, rank_strategy) is another fixture key than the in-process
# test's (case), so module scope alone would probe each model twice.
_LEARNT: dict = {}


def _once(what: str, case: ParityCase, learn):
    key = (what, case.spec.name)
    if key not in _LEARNT:
        _LEARNT[key] = learn(case)
    return _LEARNT[key]


def _randomness(case: ParityCase) -> str | None:
    probe = run_check(case.spec, CheckOptions(strategies=("manual",), devices=(2,), batch_size=4, steps=1,
                                              accumulate=1))
    randomness = [r for r in probe.findings if r.name == "randomness"]
    return randomness[0].reason if randomness else None


@pytest.fixture(scope="module")
def exact_or_skip(case) -> None:
    """Skip the properties (with the check's own reason) for a model whose forward draws random
    numbers beyond dropout: no run can be compared exactly with another."""
    reason = _once("randomness", case, _randomness)
    if reason is not None:
        pytest.skip(f"{case.spec.name}: {reason}")


@pytest.fixture(scope="module")
def fewest_examples(case) -> int:
    """The fewest examples one training step of the model accepts on one device: BatchNorm whose
    input has shrunk to 1x1 needs two ("Expected more than 1 value per channel when training",
    torchvision's MNASNet at 32x32), and single-device training fails there too. The draws give
    every device at least that many examples per micro-step."""
    fewest = _once("fewest", case, fewest_training_examples)
    if isinstance(fewest, str):
        pytest.fail(fewest)
    return fewest


@st.composite
def check_options(draw, fewest: int = 1, strategies=IN_PROCESS, max_devices: int = 4,
                  max_batch: int = 16, max_steps: int = 3) -> dict:
    """One strategy on one device count; a batch of at least `fewest` examples per device and
    micro-step, divisible or not (the check adds a batch no device count divides): CheckOptions
    fields, as check_data_parallel takes them."""
    n = draw(st.integers(min_value=2, max_value=max_devices), label="devices")
    accumulate = draw(st.integers(min_value=1, max_value=3), label="accumulate")
    least = n * accumulate * fewest
    batch = draw(st.one_of(st.just(least), st.integers(min_value=least, max_value=max(least, max_batch))),
                 label="batch_size")
    return dict(strategies=(draw(st.sampled_from(strategies), label="strategy"),), devices=(n,),
                batch_size=batch, steps=draw(st.integers(min_value=1, max_value=max_steps), label="steps"),
                seed=draw(seeds, label="seed") % 2**16, accumulate=accumulate)


def _assert_checked(report, what: str) -> None:
    """A property that passes because its comparisons were skipped would prove nothing."""
    ran = {r.name for r in report.results if r.status == "pass"}
    missing = [name for name in EXACT_CHECKS if name not in ran]
    assert not missing, (f"{what}: checks {missing} did not pass (statuses: "
                         f"{[(r.name, r.strategy, r.devices, r.status, r.reason) for r in report.results]})")


def test_in_process_strategies_match_single_device(case, exact_or_skip, fewest_examples):
    """manual (emulated devices) and dataparallel: every check of `mgpu check` holds for any drawn
    device count, batch size, number of steps, micro-steps and seed."""

    @settings(max_examples=case.examples)
    @given(options=check_options(fewest_examples, max_batch=16 * fewest_examples, max_steps=case.max_steps))
    def prop(options):
        report = check_data_parallel(case.spec, **options, device=COMPARISON_KIND)  # ParityError: the first divergence
        _assert_checked(report, f"{case.spec.name}, {options['strategies'][0]} on {options['devices'][0]} devices")

    prop()


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_rank_strategies_match_single_device(case, rank_strategy, exact_or_skip, fewest_examples, request,
                                             shared_runs):
    """ddp and fsdp on gloo ranks that build the model from different seeds: the ranks start equal
    (DDP's broadcast; mgpu's before fully_shard), stay bitwise equal after every step (fsdp: the
    gathered weights, every rank's buffers), tied weights stay tied, and gradients (fsdp: the
    gathered shards), weights, buffers, optimizer state, uneven shards and accumulation match the
    single-device run."""
    sizes = case.world_sizes[rank_strategy]
    job = parity_job(request.node.callspec.id)
    if shared_runs is not None and job in shared_runs.jobs:  # made as the tests before this module ran
        report = shared_runs.get(job)
    else:
        report = rank_report(case, rank_strategy, fewest_examples)
    _assert_checked(report, f"{case.spec.name} under {rank_strategy} on {sizes} ranks")
    for check in ("start", "replicas") + (("ties",) if any(r.name == "ties" for r in report.results) else ()):
        ran = [r for r in report.results if r.name == check]
        assert len(ran) == len(sizes) and all(r.status == "pass" for r in ran), ran

