"""The arithmetic and plumbing behind the perf reports: interleaved DDP timing, scaling rows, the
scaling table, and `python -m mgpu_perf ddp-scaling` end to end (tiny network) and on bad input.

    pytest mgpu_perf_tests/test_reporting.py
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from mgpu.devices import torch_threads
from mgpu_perf import commands as command
from mgpu_perf import scaling
from mgpu_perf.harness import interleave


class FakePool:
    """Stands in for a StrategyRankPool: records when it was stepped, returns a set loss."""

    def __init__(self, name, log, loss=1.0, moved=0.1):
        self.name, self.log, self.loss, self.moved = name, log, loss, moved

    def step(self):
        self.log.append(self.name)
        return self.loss

    def weights_moved(self):
        return self.moved


def test_interleaved_step_times_alternates_counts_round_by_round():
    log = []
    pools = {1: FakePool(1, log), 2: FakePool(2, log)}
    times = interleave.interleaved_step_times(pools, rounds=3, warmup=2)
    assert log == [1, 1, 2, 2] + [1, 2] * 3, f"step order {log}: warm-up per pool, then one step each per round"
    assert {n: len(t) for n, t in times.items()} == {1: 3, 2: 3}


@pytest.mark.parametrize("loss", [float("nan"), float("inf")])
def test_interleaved_step_times_rejects_non_finite_loss(loss):
    with pytest.raises(FloatingPointError, match="at 2 ranks"):
        interleave.interleaved_step_times({1: FakePool(1, []), 2: FakePool(2, [], loss=loss)}, rounds=1)


def test_interleaved_step_times_rejects_steps_that_change_nothing():
    with pytest.raises(AssertionError, match="did not change at 2 ranks"):
        interleave.interleaved_step_times({1: FakePool(1, []), 2: FakePool(2, [], moved=0.0)}, rounds=1)


@pytest.mark.parametrize("rounds, warmup", [(0, 0), (-1, 2), (2, -1), (1.5, 0)])
def test_interleaved_step_times_rejects_bad_rounds(rounds, warmup):
    with pytest.raises(ValueError, match="rounds must be"):
        interleave.interleaved_step_times({1: FakePool(1, [])}, rounds=rounds, warmup=warmup)


def test_scaling_rows_speedup_and_efficiency():
    # 1 rank: 32 images in 0.5 s (median); 2 ranks: 64 images in 0.625 s -> 1.6x, efficiency 0.8.
    rows = interleave.scaling_rows({2: [0.7, 0.625, 0.6], 1: [0.5, 0.4, 0.55]}, per_rank_batch=32)
    assert [r["ranks"] for r in rows] == [1, 2]
    one, two = rows
    assert math.isclose(one["images_per_s"], 64.0) and math.isclose(two["images_per_s"], 64 / 0.625)
    assert math.isclose(two["speedup"], 1.6) and math.isclose(two["efficiency"], 0.8), two
    assert math.isclose(two["speedup (fastest steps)"], 2 * 0.4 / 0.6), two
    assert one["speedup"] == 1.0 and one["global_batch"] == 32 and two["global_batch"] == 64


def test_scaling_table_from_rows(tmp_path):
    rows = scaling.add_speedups([
        {"strategy": "ddp", "measure": "interleaved", "devices": 1, "label": "1ranks-cpu", "images_per_s": 50.0},
        {"strategy": "ddp", "measure": "interleaved", "devices": 2, "label": "2ranks-cpu", "images_per_s": 90.0},
    ])
    assert math.isclose(rows[1]["speedup"], 1.8) and math.isclose(rows[1]["efficiency"], 0.9)
    lines = scaling.format_table(rows)
    assert any("interleaved" in line and "1.80" in line and "0.90" in line for line in lines), lines
    paths = scaling.write_outputs(rows, {"title": "t", "emulated": True}, tmp_path)
    assert json.loads(paths[0].read_text())["rows"][1]["speedup"] == pytest.approx(1.8)
    assert paths[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _command(capsys, *argv) -> SimpleNamespace:
    """`python -m mgpu_perf ARGV`, run in this process (the ranks are processes anyway); this
    process's torch thread count is given back afterwards."""
    with torch_threads():
        code = command.main(list(argv))
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


@pytest.mark.multiprocess
def test_ddp_scaling_command_runs_and_applies_its_bound(capsys):
    # A tiny network so that it takes seconds; a bound no machine reaches, so the FAIL path runs too.
    out = _command(capsys, "ddp-scaling", "--width", "4", "--batch", "4", "--rounds", "2", "--warmup", "1",
                   "--min-speedup", "1000")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 rank(s)" in out.stdout and "2 rank(s)" in out.stdout and "speedup" in out.stdout, out.stdout
    assert "FAIL: speedup" in out.stderr and "below 1000" in out.stderr, out.stderr


@pytest.mark.parametrize("args, message", [
    (["--rounds", "0"], "--rounds must be at least 1, got 0"),
    (["--batch", "-3"], "batch size must be a positive integer, got -3"),  # mgpu's own rule and message
    (["--width", "0"], "width must be a positive integer, got 0"),      # mgpu's own rule and message
    (["--width", "x"], "argument --width: invalid int value: 'x'"),
    (["--warmup", "-1"], "--warmup must be at least 0, got -1"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
    (["--devices", "0,2"], "devices must be a positive integer, got 0"),
    (["--devices", "a"], "expected rank counts like 1,2"),
    (["--min-speedup", "nan"], "--min-speedup must be a positive number"),
])
def test_ddp_scaling_command_rejects_bad_input(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        command.main(["ddp-scaling", *args])  # stops before any rank starts
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.timed  # a ratio of two real timings
@pytest.mark.multiprocess
def test_hot_path_command_prints_its_three_ratios(capsys):
    out = _command(capsys, "hot-path", "--width", "4", "--batch", "4", "--rounds", "2", "--warmup", "1")
    assert out.returncode == 0, out.stdout + out.stderr
    single = [line for line in out.stdout.splitlines() if line.startswith("single: mgpu's step at ")]
    ddp = [line for line in out.stdout.splitlines() if line.startswith("ddp: 2 DDP ranks at ")]
    fsdp = [line for line in out.stdout.splitlines() if line.startswith("fsdp: 2 FSDP ranks at ")]
    assert single and ddp and fsdp, out.stdout
    ratio = float(single[0].split(" at ")[1].split()[0])
    assert 0.2 < ratio < 5, f"a ratio of two timings of the same work should be near 1: {single[0]}"


@pytest.mark.parametrize("args, message", [
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--ranks", "0"], "devices must be a positive integer, got 0"),
    (["--width", "-1"], "width must be a positive integer, got -1"),
])
def test_hot_path_command_rejects_bad_input(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        command.main(["hot-path", *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
