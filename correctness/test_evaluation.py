"""Property 7: evaluation over several devices gives exactly the single-device accuracy,
including when the last test batch is smaller than the device count (some shards are empty).

The test labels are built from the model's own predictions, a seeded 40 % of them then made
wrong: the exact accuracy is known up front, strictly between 0 and 1, so counting only one
device's shard, dropping a short last batch or dividing by the wrong total cannot pass.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from correctness.draws import eval_splits, seeds
from correctness.helpers import (EvalCase, EvalJob, eval_cases, evaluate, labelled_by,
                                 make_model, random_batch, run_job_in_this_process)
from mgpu.devices import devices
from mgpu.models import lenet
from mgpu.strategies import Manual, SingleDevice

pytestmark = pytest.mark.rounding  # the rounding-sensitive part: make test runs it under other CPU kernels too


def expected_accuracy(case: EvalCase, model) -> float:
    return float((model(case.images).argmax(dim=1) == case.labels).sum()) / len(case.labels)


@settings(max_examples=20)
@given(split=eval_splits(max_devices=4, max_batch=12), seed=seeds)
def test_manual_accuracy_equals_single_device_accuracy_exactly(split, seed):
    test_size, batch_size, n = split
    model = make_model("lenet", seed).eval()
    images, _ = random_batch(test_size, seed)
    case = EvalCase(images, labelled_by(model, images, seed), batch_size)
    single = evaluate(SingleDevice(devices(1)), model, case.loader())
    manual = evaluate(Manual(devices(n)), model, case.loader())
    assert single == expected_accuracy(case, model), f"single device: accuracy {single} on {case.describe()}"
    assert manual == single, (f"manual over {n} devices: accuracy {manual} but single device {single} on "
                              f"{case.describe()}, seed {seed}: {round((single - manual) * test_size)} example(s) "
                              "counted differently")


@pytest.mark.parametrize("strategy, n", [("manual", 1), ("manual", 2), ("manual", 3),
                                         pytest.param("ddp", 1, marks=pytest.mark.multiprocess),
                                         pytest.param("ddp", 2, marks=pytest.mark.multiprocess),
                                         pytest.param("ddp", 3, marks=[pytest.mark.multiprocess, pytest.mark.slow]),
                                         pytest.param("fsdp", 1, marks=pytest.mark.multiprocess),
                                         pytest.param("fsdp", 2, marks=pytest.mark.multiprocess),
                                         pytest.param("fsdp", 3, marks=pytest.mark.multiprocess)])
def test_accuracy_over_1_2_3_devices_equals_single_device_exactly(strategy, n, rank_runs):
    state_dict, cases = eval_cases()
    model = lenet()
    model.load_state_dict(state_dict)
    model.eval()
    if strategy == "manual":
        accuracies = [evaluate(Manual(devices(n)), model, case.loader()) for case in cases]
    elif n == 1:
        accuracies = run_job_in_this_process(EvalJob(state_dict, cases, strategy))  # a world of one: no spawn needed
    else:
        accuracies = rank_runs(n).accuracies[strategy]
    for case, accuracy in zip(cases, accuracies, strict=True):
        single = evaluate(SingleDevice(devices(1)), model, case.loader())
        assert single == expected_accuracy(case, model), f"single device: accuracy {single} on {case.describe()}"
        assert accuracy == single, (f"{strategy} over {n} device(s): accuracy {accuracy} but single device {single} "
                                    f"on {case.describe()}: {round((single - accuracy) * len(case.labels))} "
                                    "example(s) counted differently")
