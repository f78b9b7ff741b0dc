"""CUDA-graph training steps: one step captured once (`torch.cuda.CUDAGraph`) and replayed, so that
a timed step is the GPU's work and not the host's kernel launches (a 10-ms step on the H200 of
docs/notes/gpu-runs.md was launch-bound, and its samples 3 times as noisy as the CPU's).

    why = why_not_captured(strategy, mode="auto", compiled=False)   # None: it may be captured
    graph = GraphStep(strategy, batches, global_batch, on_step=losses.append)
    stats = graph.step()            # the next batch copied into the static inputs, the graph replayed

What is captured is the strategy's own step, `forward_backward` then `optimizer_step`, on static
device tensors (each step's batch is copied into them first). The first WARMUP steps run plain on a
side stream, as torch's whole-network capture does (cuBLAS and cuDNN pick their algorithms, the
optimizer makes its state); they are real steps of the run, so the losses and weights are the
plain step's, step by step. Autocast's cast cache is off while capturing (a cached bf16 copy of a
weight would be captured as a constant).

Captured: `single`, and `manual` on one device. Not (one line each, the step then timed as it is):
a CPU; ddp and fsdp (their steps run in rank processes); manual or dataparallel on several GPUs
(one graph holds one device's stream); an optimizer with `capturable` off (Adam, AdamW: build it
with capturable=True); a torch.compile'd model (its mode="reduce-overhead" captures graphs itself).
A step that fails to capture (a host read inside it, shapes that change) says so with the error.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from mgpu_perf.gate.options import GRAPH_MODES  # --ab-graphs' choices, held once

__all__ = ["GRAPH_MODES", "WARMUP", "why_not_captured", "GraphStep", "graph_state"]

WARMUP = 3  # plain steps on a side stream before the capture (torch's example takes 3)


def why_not_captured(strategy, mode: str = "auto", compiled: bool = False) -> str | None:
    """None when this strategy's step may be captured under `mode`, else the reason, in one line."""
    if mode not in GRAPH_MODES:
        raise ValueError(f"graphs must be one of {', '.join(GRAPH_MODES)}, got {mode!r}")
    if mode == "off":
        return "off (asked)"
    devices = list(strategy.devices)
    name = getattr(strategy, "name", type(strategy).__name__)
    if devices[0].type != "cuda":
        return f"{devices[0].type}: CUDA graphs need a CUDA device"
    if getattr(strategy, "spawns_ranks", False) or name in ("ddp", "fsdp"):
        return f"{name}: its steps run in rank processes (graphs in ranks are not done yet)"
    if len(set(devices)) > 1:
        return f"{name} on {len(set(devices))} GPUs: one graph holds one device's stream (not done yet)"
    if name not in ("single", "manual"):
        return f"{name}: not captured yet (single and manual are)"
    if compiled:
        return "--compile: torch.compile's mode='reduce-overhead' captures CUDA graphs itself"
    for opt in strategy.optimizers():
        if any(group.get("capturable") is False for group in opt.param_groups):
            return (f"the optimizer ({type(opt).__name__}) has capturable=False: build it with capturable=True "
                    "to time graph replays")
    return None


def graph_state(captured: bool, why: str | None, mode: str, cuda: bool) -> dict:
    """What a worker reports about graphs at setup (gate/compare.py shows it, ab.json keeps it):
    `shown` when the reason is news to the user (on a GPU, or asked for with `on`)."""
    return {"captured": captured, "why": why or "", "shown": not captured and mode != "off" and (cuda or mode == "on")}


class GraphStep:
    """The strategy's training step as a CUDA graph over static inputs (see the module docstring).
    `batches`: (inputs, target) pairs, host or device, all of one shape, cycled in order from
    `start`; `on_step(stats)` is called with each plain warm-up step's [loss_sum, correct]."""

    def __init__(self, strategy, batches: list, global_batch: int, start: int = 0,
                 on_step: Callable[[torch.Tensor], None] = lambda _: None, warmup: int = WARMUP):
        self.strategy, self.batches, self.global_batch = strategy, batches, global_batch
        self.device = strategy.devices[0]
        self.steps = start
        inputs, target = batches[start % len(batches)]
        as_tuple = inputs if isinstance(inputs, tuple) else (inputs,)
        self.static_inputs = tuple(t.to(self.device).clone() for t in as_tuple)
        self.static_target = target.to(self.device).clone()
        self.tuple_inputs = isinstance(inputs, tuple)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with _autocast_cache_off():
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    on_step(self._plain())
            torch.cuda.current_stream(self.device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_stats = self._run()

    def _inputs(self):
        return self.static_inputs if self.tuple_inputs else self.static_inputs[0]

    def _load(self) -> None:
        inputs, target = self.batches[self.steps % len(self.batches)]
        for static, t in zip(self.static_inputs, inputs if isinstance(inputs, tuple) else (inputs,)):
            static.copy_(t, non_blocking=True)
        self.static_target.copy_(target, non_blocking=True)
        self.steps += 1

    def _run(self) -> torch.Tensor:
        stats = self.strategy.forward_backward(self._inputs(), self.static_target, self.global_batch)
        self.strategy.optimizer_step()
        return stats

    def _plain(self) -> torch.Tensor:
        self._load()
        stats = self._run().clone()
        torch.cuda.current_stream(self.device).synchronize()
        return stats

    def step(self) -> torch.Tensor:
        """One step: the next batch into the static inputs, the graph replayed; its [loss_sum, correct]."""
        self._load()
        self.graph.replay()
        return self.static_stats


@contextlib.contextmanager
def _autocast_cache_off():
    """Autocast's weight-cast cache off (mgpu's autocast leaves it at the global setting)."""
    before = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(before)
