"""Where an fsdp step's time goes on this CPU, against the no-communication limit.

    python docs/notes/measure/fsdp_step.py [--rounds 12] [--width 64] [--batch 32]

Full-width ResNet-18, 2 ranks of one thread each, 32 images a rank (as `python -m perf hot-path`).
Part 1: fsdp's three layouts (--shard block / model, --reshard-after-forward on / off) and ddp,
each against 2 independent processes doing the same per-rank steps with no communication, all
interleaved round by round (order reversed every round). Part 2: one rank-0 step of each fsdp
layout under torch.profiler, its time summed by kind: all-gather, reduce-scatter, other
collectives, and the rest (compute). The figures are in docs/notes/perf.md ("FSDP on a CPU").
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import ExitStack

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from mgpu_perf.harness.interleave import interleaved_ratios  # noqa: E402
from mgpu_perf.harness.ranks import IndependentPool, RankPool, StrategyRankPool, _Factory  # noqa: E402
from mgpu_perf.harness.sessions import TrainBench, TrainSession  # noqa: E402

LAYOUTS = {"fsdp block/on": dict(shard="block", reshard_after_forward="on"),
           "fsdp block/off": dict(shard="block", reshard_after_forward="off"),
           "fsdp model/on": dict(shard="model", reshard_after_forward="on")}


class _ProfiledRank:
    """A rank of a pool that can profile one step of its fsdp session."""

    def __init__(self, bench: TrainBench):
        import torch

        strategy = bench.create_strategy()
        torch.set_num_threads(bench.threads_per_device)
        self.session = TrainSession(bench, strategy)

    def profile(self) -> dict:
        from torch.profiler import ProfilerActivity, profile

        for _ in range(2):
            self.session.step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            self.session.step()
        kinds = {"all_gather": 0.0, "reduce_scatter": 0.0, "other collectives": 0.0}
        for e in prof.key_averages():
            name = e.key.lower()
            if not name.startswith(("c10d::", "gloo:", "nccl:", "record_param_comms")):
                continue
            kind = ("all_gather" if "all_gather" in name or "allgather" in name else
                    "reduce_scatter" if "reduce_scatter" in name else "other collectives")
            kinds[kind] += e.self_cpu_time_total / 1e3
        total = max(e.cpu_time_total for e in prof.key_averages()) / 1e3  # the outermost event: the step
        return {"step_ms": total, **{k: round(v, 1) for k, v in kinds.items()}}

    def close(self) -> None:
        self.session.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    common = dict(per_device_batch=args.batch, width=args.width, threads_per_device=1, steps_per_epoch=4)
    benches = {"ddp": TrainBench("ddp", 2, **common)}
    benches.update({name: TrainBench("fsdp", 2, **common, **layout) for name, layout in LAYOUTS.items()})
    with ExitStack() as stack:
        pools = {name: stack.enter_context(StrategyRankPool(b)) for name, b in benches.items()}
        independent = IndependentPool(benches["ddp"])
        stack.callback(independent.close)
        fns = {name: pool.step for name, pool in pools.items()}
        fns["independent"] = independent.step
        ratios = interleaved_ratios(fns, "independent", args.rounds, warmup=2)
    for name, r in ratios.items():
        print(f"{name:15s} {r['ratio_median']:.3f} of the limit (rounds {r['ratio_min']:.3f}-{r['ratio_max']:.3f}; "
              f"{r['a_median_s'] * 1e3:.0f} ms vs {r['b_median_s'] * 1e3:.0f} ms a step)")
    for name, layout in LAYOUTS.items():
        pool = RankPool(_Factory(_ProfiledRank, TrainBench("fsdp", 2, **common, **layout)), 2)
        try:
            pool.wait_ready()
            print(f"{name:15s} profile of one step on rank 0: {pool.run('profile')[0]}")
        finally:
            pool.close()


if __name__ == "__main__":
    main()
