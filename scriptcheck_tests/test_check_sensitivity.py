"""check-script's tolerance: the sensitivity every report states means what it says, the spread is
pooled so that no tensor's tolerance rests on one random draw, and mixed precision is lifted to
float32 for the loop's arithmetic (docs/guide/check-script.md, "Sensitivity" and "Mixed precision").

    pytest scriptcheck_tests/test_check_sensitivity.py
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from mgpu.scriptcheck import run_check_script
from mgpu.check.script.inrank.precision import LiftPrecision, PrecisionSeen
from mgpu.check.script.tensors import POOL_PRECISION, POOL_RERUN, allowances

# A correct DDP loop with SGD whose world N multiplies its loss by (1 + DELTA): every gradient and every
# update is then (1 + DELTA) times world 1's, the weights hardly move apart.
SCALED_LOSS = """
import sys
import torch, torch.distributed as dist, torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

def main():
    delta = float(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(96, 8, generator=g), torch.randint(0, 4, (96,), generator=g)
    per = 16 // world
    for step in range(3):
        rows = slice(step * 16 + rank * per, step * 16 + (rank + 1) * per)
        opt.zero_grad()
        loss = F.cross_entropy(model(x[rows]), y[rows])
        (loss * (1 + delta) if world > 1 else loss).backward()
        opt.step()
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def _smallest_sensitivity(report) -> tuple[float, str]:
    (comparison,) = report.comparisons
    kinds = {k: v["relative"] for k, v in comparison.tally.sensitivity.items() if k in ("gradient", "update")}
    assert "gradient" in kinds, f"the report states no gradient sensitivity: {report.text()}"
    kind = min(kinds, key=kinds.get)
    return kinds[kind], kind


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_difference_at_twice_the_stated_sensitivity_fails_and_at_half_of_it_passes(tmp_path):
    path = tmp_path / "scaled_loss.py"
    path.write_text(textwrap.dedent(SCALED_LOSS))
    clean = run_check_script(str(path), ["0"], ranks=(1, 2), steps=3)
    assert str(clean.verdict) == "passed", clean.text()
    assert "sensitivity: would call a difference of gradients" in clean.text(), clean.text()
    sensitivity, kind = _smallest_sensitivity(clean)
    assert 1e-7 < sensitivity < 1e-3, f"a float32 loop's {kind} sensitivity is {sensitivity:.1e}: {clean.text()}"

    above = run_check_script(str(path), [repr(2 * sensitivity)], ranks=(1, 2), steps=3)
    assert str(above.verdict) == "failed", (
        f"a difference of 2 x the stated {kind} sensitivity ({2 * sensitivity:.2e}) passed:\n{above.text()}")
    below = run_check_script(str(path), [repr(sensitivity / 2)], ranks=(1, 2), steps=3)
    assert str(below.verdict) == "passed", (
        f"a difference of half the stated {kind} sensitivity ({sensitivity / 2:.2e}) failed:\n{below.text()}")


def test_a_tensor_the_rerun_hardly_moved_gets_at_least_the_steps_median_spread():
    torch.manual_seed(0)
    reference = {f"layer{i}.weight": torch.randn(50) for i in range(5)}
    rerun = {name: t + 1e-6 * torch.randn(50) for name, t in reference.items()}
    rerun["layer0.weight"] = reference["layer0.weight"] + 1e-12  # an unlucky draw: hardly moved
    pooled = allowances(reference, rerun, POOL_RERUN)
    own = {name: 16 * float((rerun[name] - t).abs().max()) for name, t in reference.items()}
    assert pooled["layer0.weight"] > 100 * own["layer0.weight"], (
        f"layer0's tolerance rests on its own draw: {pooled['layer0.weight']:.2e} (own {own['layer0.weight']:.2e})")
    others = sorted(pooled[name] for name in reference if name != "layer0.weight")
    assert pooled["layer0.weight"] >= 0.2 * others[0], f"layer0's tolerance is far below the others': {pooled}"
    largest = allowances(reference, rerun, POOL_PRECISION)
    assert all(largest[name] >= pooled[name] for name in reference), (
        f"pooling at the largest spread allows less than at the median: {largest} against {pooled}")


def test_lifting_switches_autocast_off_keeps_cast_models_float32_and_casts_their_inputs_up():
    model = torch.nn.Linear(4, 3)
    with LiftPrecision() as lift:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not torch.is_autocast_enabled("cpu"), "autocast is on inside the lifted run"
            out = model(torch.randn(2, 4))
        cast = torch.nn.Linear(4, 3).to(torch.bfloat16)
        also = torch.nn.Linear(4, 3).bfloat16().half()
        assert cast.weight.dtype == also.weight.dtype == torch.float32, "a model cast whole is not kept float32"
        from_bf16 = cast(torch.randn(2, 4).to(torch.bfloat16))
    assert out.dtype == from_bf16.dtype == torch.float32, f"lifted outputs are {out.dtype}, {from_bf16.dtype}"
    assert lift.lifted == {"autocast(cpu, bfloat16)": 1, "Module.to(bfloat16)": 1, "Module.bfloat16()": 1,
                           "Module.half()": 1}, lift.lifted
    # and everything is back as it was after the run
    assert torch.nn.Linear(2, 2).to(torch.bfloat16).weight.dtype == torch.bfloat16, "Module.to stays patched"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("cpu"), "autocast stays lifted after the run"


def test_the_precision_seen_names_autocast_and_a_model_cast_whole():
    seen = PrecisionSeen()
    model = torch.nn.Linear(4, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        seen.forward(model)
        seen.output(model(torch.randn(2, 4)))
    assert seen.lowest == "bfloat16" and seen.autocast == {"cpu:bfloat16"} and not seen.cast_whole, seen.to_json()
    cast = PrecisionSeen()
    cast.forward(torch.nn.Linear(4, 3).to(torch.float16))
    assert cast.lowest == "float16" and cast.cast_whole, cast.to_json()
    plain = PrecisionSeen()
    plain.forward(model)
    plain.output(model(torch.randn(2, 4)))
    assert plain.lowest == "float32", plain.to_json()
