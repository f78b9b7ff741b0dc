"""A user's model as a training session: mgpu's model contract (`MODULE:FUNCTION`, mgpu/spec/)
under one strategy and device count, stepping on demand.

    session = ModelBench("examples/tiny_lm.py:spec", "manual", 2, per_device_batch=16).open()
    session.step()              # forward, backward, gradient sync, optimizer step; every device done
    with StrategyRankPool(ModelBench("mymodel:spec", "ddp", 2)) as pool:
        pool.step()             # each rank opens its own session (harness/ranks.py)

The step is the strategy's, driven through the calls mgpu's Trainer makes (`forward_backward`,
`optimizer_step`, `synchronize`) on batches drawn once from the spec (weak scaling: `per_device_batch`
examples a device). Data stays where the spec draws it (the CPU) and is moved each step, as training does.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

import torch

__all__ = ["ModelBench", "ModelSession", "module_file", "use_speed_options", "create_strategy"]


@dataclass
class ModelBench:
    """One training step of a user's model: which model, strategy, devices, batch."""

    model: str                           # MODULE:FUNCTION (a module name or a .py file)
    strategy: str
    devices: int
    per_device_batch: int = 32
    input_shape: str | None = None       # C,H,W, for a function that returns a bare nn.Module
    classes: int | None = None
    threads_per_device: int | None = None
    seed: int = 0
    lr: float = 0.01                     # the default optimizer's (plain SGD) when the spec has none
    batches: int = 3                     # distinct global batches, cycled
    amp: str = "off"                     # --amp: off | bf16 (the strategy's autocast)
    compile: bool = False                # --compile: the model wrapped in torch.compile by the strategy

    @property
    def global_batch(self) -> int:
        return self.per_device_batch * self.devices

    def train_config(self):
        """mgpu's TrainConfig for the strategy and devices, validated: the bench's settings checked by
        mgpu's own rules, with its messages."""
        from mgpu.config import TrainConfig

        return TrainConfig(strategy=self.strategy, devices=self.devices, batch_size=self.global_batch, lr=self.lr,
                           seed=self.seed, epochs=1, out=None, progress=False).validate()

    def create_strategy(self):
        """The bench's strategy on its devices, with mgpu's default settings (a rank's, in a rank)."""
        return create_strategy(self.train_config())

    def spec(self):
        from mgpu.spec import load_spec

        return load_spec(self.model, input_shape=self.input_shape, classes=self.classes)

    def open(self, strategy=None) -> "ModelSession":
        return ModelSession(self, strategy)


def create_strategy(cfg):
    """The strategy of a TrainConfig, built as the mgpu this process imports builds one: from the
    settings it uses (`cfg.strategy_settings()`), or, in a baseline arm whose mgpu predates them,
    from the whole TrainConfig."""
    from mgpu.strategies import get_strategy

    strategy_cls = get_strategy(cfg.strategy)
    if not hasattr(cfg, "strategy_settings"):  # an older mgpu: Strategy.create(cfg)
        return strategy_cls.create(cfg)
    return strategy_cls.create(cfg.devices, cfg.strategy_settings())


def use_speed_options(strategy, amp: str = "off", channels_last: bool = False, compile: bool = False) -> None:
    """The strategy's --amp, --channels-last and --compile, asked of it only when one is not the
    default: an mgpu that predates an option asked for raises (TypeError, AttributeError), which
    the A/B gate reports as `not comparable`, and one that predates them all is never asked."""
    if (amp, channels_last, compile) == ("off", False, False):
        return
    if compile:
        strategy.use_speed_options(amp, channels_last, compile=True)
    else:
        strategy.use_speed_options(amp, channels_last)


def module_file(source: str) -> str | None:
    """The file the module of `MODULE:FUNCTION` was imported from (after load_spec imported it)."""
    module_part = source.rsplit(":", 1)[0]
    if module_part.endswith(".py") or "/" in module_part or os.sep in module_part:
        return os.path.abspath(module_part)
    return getattr(sys.modules.get(module_part), "__file__", None)


class ModelSession:
    def __init__(self, bench: ModelBench, strategy=None):
        from mgpu import devices as devmod
        from mgpu.spec import slice_inputs

        spec = bench.spec()
        self.bench, self.origin = bench, module_file(bench.model)
        devmod.keep_freed_memory()  # as `python -m mgpu train` does
        self.strategy = strategy or bench.create_strategy()
        if self.strategy.devices[0].type == "cpu" and bench.threads_per_device:
            torch.set_num_threads(bench.threads_per_device)  # the same share of the cores at every count
        self.strategy.use_objective(spec.objective)
        use_speed_options(self.strategy, bench.amp, False, bench.compile)
        model = spec.build_seeded(bench.seed)
        self.initial = [p.detach().clone().cpu() for p in model.parameters()]
        lr = bench.lr
        self.strategy.setup(model, spec.optimizer or (lambda params: torch.optim.SGD(params, lr=lr)))
        self.strategy.reset_peak_memory()
        B = bench.global_batch
        local = self.strategy.local_indices(torch.arange(B))  # this rank's part (all of it but under ddp/fsdp)
        start, stop = int(local[0]), int(local[-1]) + 1
        self.local_examples = stop - start
        self.batches = []
        for i in range(bench.batches):
            inputs, target = spec.batch(B, bench.seed + 1 + i)
            self.batches.append((slice_inputs(inputs, start, stop), target[start:stop]))
        self.steps = 0
        self.graph = None

    def use_graphs(self, mode: str) -> dict:
        """From here on, CUDA-graph replays of the step where it can be captured (harness/graphs.py;
        the warm-up steps before the capture are steps of this session); the state, for the report."""
        self.graph, why = None, None
        if mode != "off":
            from mgpu.errors import one_line

            from mgpu_perf.harness.graphs import GraphStep, why_not_captured

            why = why_not_captured(self.strategy, mode, self.bench.compile)
            if why is None:
                try:
                    self.graph = GraphStep(self.strategy, self.batches, self.bench.global_batch, start=self.steps,
                                           on_step=self._counted)
                except Exception as e:  # what the step does that a graph cannot hold: said, then timed as it is
                    why = f"capture failed: {one_line(e, with_type=True)}"[:300]
        from mgpu_perf.harness.graphs import graph_state

        return graph_state(self.graph is not None, why or ("off (asked)" if mode == "off" else None), mode,
                           self.strategy.devices[0].type == "cuda")

    def _counted(self, stats) -> float:
        self.steps += 1
        loss = float(stats[0]) / self.local_examples
        if not math.isfinite(loss):
            raise FloatingPointError(f"{self.bench.model}: loss {loss} at step {self.steps} under {self.bench.strategy}")
        return loss

    def step(self) -> float:
        """One step on the next global batch, every device finished; the mean loss of this process's part."""
        if self.graph is not None:
            stats = self.graph.step()
        else:
            inputs, target = self.batches[self.steps % len(self.batches)]
            stats = self.strategy.forward_backward(inputs, target, self.bench.global_batch)  # [loss_sum, correct]
            self.strategy.optimizer_step()
        self.strategy.synchronize()
        return self._counted(stats)

    def weights_moved(self) -> float:
        """Largest absolute change of any parameter of the main replica since setup."""
        params = self.strategy.modules()[0].parameters()
        whole = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in params]  # fsdp: shards, gathered
        return max(float((p.detach().cpu() - p0).abs().max()) for p, p0 in zip(whole, self.initial))

    def memory_bytes(self) -> dict:
        return self.strategy.memory_bytes()

    def close(self) -> None:
        self.strategy.teardown()
