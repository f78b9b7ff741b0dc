"""Fixtures and hypothesis profiles for the whole correctness suite (the only suite that uses
hypothesis: perf/ runs, which start pytest in subprocesses, do not import it)."""

import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

from mgpu.config import EXACT_GPU_MATH_ENV
from mgpu.devices import exact_gpu_math, torch_threads

# -- hypothesis profiles: `ci` (chosen when CI is set) is derandomized so CI runs are repeatable.
settings.register_profile("dev", max_examples=20, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(autouse=True, scope="package")
def exact_gpu_math_in_every_process():
    """Processes a test starts (`python -m mgpu train`, their ranks) compute with exact GPU math too:
    they do not get the fixture below, but mgpu's runs honour MGPU_EXACT_GPU_MATH. Package-wide,
    undone before perf/ runs, which times PyTorch's defaults."""
    saved = os.environ.get(EXACT_GPU_MATH_ENV)
    os.environ[EXACT_GPU_MATH_ENV] = "1"
    yield
    if saved is None:
        os.environ.pop(EXACT_GPU_MATH_ENV, None)
    else:
        os.environ[EXACT_GPU_MATH_ENV] = saved


@pytest.fixture(autouse=True, scope="package")
def one_thread():
    """The suite's models and batches are tiny: one intra-op thread is as fast as two, and on a busy
    machine OpenMP threads that spin-wait for each other slow a step down many times over.
    Package-wide (undone before perf/ runs), so that module-scoped reference runs and the tests
    comparing against them bitwise use the same thread count (it changes the order of float
    reductions), and the oneDNN bound in test_gradients holds (it was measured with one thread).
    DDP ranks choose their own (cores / ranks)."""
    with torch_threads(1):
        yield


@pytest.fixture
def native_cpu_conv():
    """oneDNN (mkldnn), PyTorch's default CPU convolution, picks kernels by batch size, and some
    lose float32 accuracy: a ResNet-18 gradient of a batch then differs from that of its shards by
    more than float32 rounding of the same arithmetic. Tests of exact arithmetic switch it off, as
    TF32 is switched off on GPUs, rather than widen their tolerance; the default path (oneDNN on)
    is checked separately against a measured bound
    (test_gradients.test_resnet18_allreduced_gradient_on_the_default_cpu_path)."""
    saved = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = saved


RANKS_MODULE = "correctness.test_reliability_ranks"


def _in_ranks_module(item) -> bool:
    module = getattr(item, "module", None)
    return module is not None and module.__name__ == RANKS_MODULE


# The background process of the shared multi-process runs, started with the session (correctness/shared_runs.py).
SHARED_RUNS = pytest.StashKey()


@pytest.fixture(scope="session")
def shared_runs(request):
    """The background process's runs (shared_runs.SharedRuns: `job in shared_runs.jobs`,
    `shared_runs.get(job)`), or None where none was started (nothing selected needs one)."""
    return request.config.stash.get(SHARED_RUNS, None)


@pytest.fixture(scope="session")
def single_trajectory(shared_runs, tmp_path_factory):
    """helpers.weights_config's single-device run step by step (helpers.reference_trajectory), once
    per session, on the suite's COMPARISON_KIND: what test_weights compares every strategy's steps with,
    and what the shared rank runs start their steps from (then computed by their background process)."""
    from correctness.helpers import reference_trajectory, weights_config

    if shared_runs is not None and "reference" in shared_runs.jobs:
        return shared_runs.get("reference")
    with torch_threads(1):
        return reference_trajectory(weights_config("single"), tmp_path_factory.mktemp("trajectory"))


@pytest.fixture(scope="session")
def rank_runs(shared_runs, single_trajectory, tmp_path_factory):
    """`rank_runs(world_size)`: the suite's shared ddp and fsdp runs (helpers.spawn_rank_runs), spawned at
    most once per world size and session: in the background while the tests run, for the world sizes
    the selected tests announce (correctness/shared_runs.py), else here on first use. A failed
    spawn is kept too, so that every test needing that world size reports it rather than spawning again."""
    from correctness.helpers import spawn_rank_runs
    from correctness.shared_runs import ranks_job

    outcomes = {}

    def get(world_size: int):
        if world_size not in outcomes:
            try:
                if shared_runs is not None and ranks_job(world_size) in shared_runs.jobs:
                    outcomes[world_size] = shared_runs.get(ranks_job(world_size))
                else:
                    outcomes[world_size] = spawn_rank_runs(world_size, single_trajectory,
                                                           tmp_path_factory.mktemp(f"ranks{world_size}"))
            except Exception as e:
                outcomes[world_size] = e
        outcome = outcomes[world_size]
        if isinstance(outcome, Exception):
            raise AssertionError(f"the ddp and fsdp runs with {world_size} ranks failed: {outcome}") from outcome
        return outcome

    return get


@pytest.fixture(scope="session")
def single_device_run():
    """helpers.weights_config's single-device run (a RunResult), once per session: what test_weights,
    test_memory and test_reliability_ranks compare the multi-device runs with. One thread, as the
    package's tests have (a session fixture is set up before the package's `one_thread`)."""
    from correctness.helpers import weights_config
    from mgpu.run import train

    with torch_threads(1):
        return train(weights_config("single"))


@pytest.fixture(scope="session")
def single_device_weights(single_device_run) -> dict:
    return single_device_run.state_dict


@pytest.fixture(autouse=True)
def _exact_gpu_math():
    """Correctness means full fp32 math on GPUs too: TF32 off and cuDNN's deterministic algorithms
    (mgpu.devices.exact_gpu_math), tolerances untouched. This folder only: perf/ runs PyTorch's
    defaults, as users do (and records them in machine_info)."""
    with exact_gpu_math():
        yield


def pytest_collection_modifyitems(config, items):
    """test_reliability_ranks' tests go last of this folder's: they read the runs started as
    collection ends (pytest_collection_finish), which then have the rest of the folder's time to
    finish (and are over before perf/'s timings, when a session runs both).

    With --model, this folder runs the parity properties on that model and nothing else (they
    are what applies to any model; the rest of the suite tests mgpu itself)."""
    here = Path(__file__).parent
    ranks = [item for item in items if _in_ranks_module(item)]
    if ranks:
        rest = [item for item in items if item not in ranks]
        last_here = max((i for i, item in enumerate(rest) if here in Path(str(item.path)).parents), default=-1)
        items[:] = rest[:last_here + 1] + ranks + rest[last_here + 1:]
    if config.getoption("model") is None:
        return
    keep, drop = [], []
    for item in items:
        inside = here in Path(str(item.path)).parents
        (drop if inside and item.get_closest_marker("parity") is None else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session):
    """When a test of test_reliability_ranks that reads its runs is selected, start them as collection ends:
    they are processes that mostly start up and wait (about 30 s), and they overlap the tests
    that come before them, which use one core of two (one_thread). The shared runs' process
    (pytest_sessionstart) is handed the jobs the selected tests need, or ended if there are none
    (correctness/shared_runs.py). Nothing starts for --collect-only."""
    if session.config.option.collectonly:
        return
    factory = session.config._tmp_path_factory  # the tmp_path_factory fixture's, before any fixture runs
    for item in session.items:
        if _in_ranks_module(item) and {"runs", "launchers"} & set(item.fixturenames):
            item.module.start_scenario(factory.mktemp("ddp"))
            break
    from correctness.shared_runs import jobs_for

    shared, jobs = session.config.stash.get(SHARED_RUNS, None), jobs_for(session.items)
    if shared is not None and jobs:
        shared.assign(jobs)
    elif shared is not None:  # nothing selected reads its runs
        shared.stop()
        del session.config.stash[SHARED_RUNS]


def pytest_sessionstart(session):
    """The background process of the shared runs (correctness/shared_runs.py) starts with the session:
    it imports torch and computes the single-device trajectory while the tests are collected, and
    learns its jobs when collection ends. Not for --collect-only, nor with --model (whose session
    runs test_parity's properties on that model alone, none of the shared runs)."""
    if session.config.option.collectonly or session.config.getoption("model") is not None:
        return
    from correctness.shared_runs import SharedRuns

    session.config.stash[SHARED_RUNS] = SharedRuns.start(session.config._tmp_path_factory.mktemp("shared-runs"))


def pytest_sessionfinish(session):
    """Whatever a session stopped early (-x, Ctrl-C) left running of those runs is killed: by the
    session that selected them (not a pytest session run inside this one, as test_check's is)."""
    import sys

    if RANKS_MODULE in sys.modules and any(_in_ranks_module(item) for item in getattr(session, "items", ())):
        sys.modules[RANKS_MODULE].stop_scenario()
    shared = session.config.stash.get(SHARED_RUNS, None)
    if shared is not None:
        shared.stop()
