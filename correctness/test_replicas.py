"""Property 3: under the manual strategy every replica holds bitwise the same parameters (and
BatchNorm buffers) after every step.

Bitwise, not within a tolerance: the allreduce leaves the very same gradient on every replica and
each replica then applies the same SGD arithmetic, so any difference at all is a bug (a replica
that missed the copy-back of the allreduced gradient, skipped its update, or drifted).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from correctness.draws import multi_batch_and_devices, seeds, training_steps
from correctness.helpers import (assert_every_parameter_changed, assert_tensors_close, make_model,
                                 random_batch, sgd)
from mgpu.devices import devices
from mgpu.strategies import Manual


@pytest.mark.parametrize("model_name", ["lenet", "resnet18"])
@settings(max_examples=10)
@given(case=multi_batch_and_devices(max_devices=4, max_batch=16), seed=seeds, steps=training_steps)
def test_every_replica_is_bitwise_identical_after_every_step(model_name, case, seed, steps):
    batch_size, n = case
    model = make_model(model_name, seed)  # training mode: ResNet's BatchNorm buffers must stay in sync too
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    strategy = Manual(devices(n))
    strategy.setup(model, sgd(lr=0.05, momentum=0.9, weight_decay=1e-3))
    for step in range(1, steps + 1):
        X, y = random_batch(batch_size, seed + step)  # fresh data every step
        strategy.forward_backward(X, y, batch_size)
        strategy.optimizer_step()
        main = strategy.replicas[0].state_dict()
        for d, replica in enumerate(strategy.replicas[1:], start=1):
            assert_tensors_close(replica.state_dict(), main, exact=True, where=(
                f"{model_name}, batch {batch_size} over {n} devices, seed {seed}: after step {step}, "
                f"replica {d} ({strategy.devices[d]}) vs replica 0"))
    assert_every_parameter_changed(strategy.replicas[0].state_dict(), initial,
                                   where=f"{model_name} over {n} devices after {steps} steps")
