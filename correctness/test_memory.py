"""Memory, the reason to use fsdp: each rank holds about 1/N of the parameters, gradients and
optimizer state that ddp (or one device) holds whole.

The figures are what a run reports (`RunResult.memory`, results.json's `memory_per_device`, the
`memory per device:` line): `Strategy.memory_bytes()`, which counts a sharded tensor's local shard.
The runs are the suite's shared ones (LeNet with SGD momentum, conftest's `rank_runs` and `single_device_run`).
"""

from __future__ import annotations

import dataclasses

import pytest

from conftest import requires_gpus



@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_fsdp_rank_holds_about_one_nth_of_single_devices_training_state(world_size, rank_runs, single_device_run):
    runs, single_device_memory = rank_runs(world_size), single_device_run.memory
    ddp, fsdp = runs.weights["ddp"].memory, runs.weights["fsdp"].memory
    for kind in ("parameters", "gradients", "optimizer"):
        whole = single_device_memory[kind]
        assert whole > 0, f"single device reports no {kind} bytes: {single_device_memory}"
        assert ddp[kind] == whole, f"ddp rank 0 holds {ddp[kind]} bytes of {kind}, one device {whole}: not replicated?"
        # FSDP pads each tensor's first dimension to a multiple of N, so rank 0 may hold a little more.
        ratio = fsdp[kind] / whole
        assert 1 / world_size <= ratio <= 1.05 / world_size, (
            f"fsdp rank 0 of {world_size} holds {fsdp[kind]} bytes of {kind}, {ratio:.3f} of one device's {whole} "
            f"(expected about 1/{world_size})")


@pytest.mark.multiprocess
def test_the_run_reports_its_memory_per_device(rank_runs):
    result = rank_runs(2).weights["fsdp"]
    line = result.memory_line()
    assert line.startswith("memory per device: parameters ") and "optimizer state" in line, line
    assert result.to_json()["memory_per_device"] == result.memory


@requires_gpus(1)
def test_peak_allocated_counts_from_the_strategys_setup_not_from_the_process_start():
    # The H200's first perf run recorded a 7 GB peak for a training step of 0.7 GB: the copies
    # benchmark before it in the same process had set the peak.
    import torch

    from correctness.helpers import weights_config
    from mgpu.run import train

    earlier = torch.empty(2**30, dtype=torch.uint8, device="cuda:0")  # 1 GiB, freed before the run
    del earlier
    result = train(dataclasses.replace(weights_config("single"), device="cuda"))
    assert 0 < result.memory["peak_allocated"] < 2**29, f"peak {result.memory['peak_allocated']} bytes: not reset at setup"
