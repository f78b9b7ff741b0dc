"""What each run of a check is: its plans, its optimizer, the strategy it drives, its name and first device.

    plan = plan_check(options)           # ModelCheckPlan: the plans, the runs, the probe's shards
    plans = make_plans(options)          # {"plain": RunPlan, "uneven": RunPlan, "accumulate": RunPlan}
    strategy = strategy_for("manual", 2, options)
    label("ddp", 2)                      # "ddp on 2 ranks", as timeouts and progress lines name a run

The in-process runs (check.py), the rank runs (ranks.py) and the references (judge.py) all take
their optimizer from `make_optimizer`, so that every run and its reference step alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mgpu.comm import shard_bounds
from mgpu.config import CheckOptions, StrategySettings
from mgpu.devices import devices
from mgpu.check.model.record import RunPlan
from mgpu.spec import ModelSpec
from mgpu.strategies import RANK_STRATEGIES, get_strategy  # RANK_STRATEGIES: each run is a spawn of its ranks

__all__ = ["ModelCheckPlan", "plan_check", "make_plans", "make_optimizer", "SGDFactory", "strategy_for", "label", "run_device"]

# --compile: the process group's timeout, and the allowance added to the ranks' deadline: backstops
# behind the step's limit (the hang detector, which leaves out compiling), since a cold compile of a
# real model on a busy CPU takes minutes.
COMPILING_COLLECTIVE_S = 1800.0


@dataclass(frozen=True)
class ModelCheckPlan:
    """Everything a check runs, decided from the options before anything runs: each strategy's plans,
    the (strategy, devices) runs in the options' order, and the shards the probe cuts the plain
    batch into (on the most devices checked: [start, stop) each)."""

    plans: dict
    runs: tuple
    probe_shards: tuple


def plan_check(options: CheckOptions) -> ModelCheckPlan:
    plans = make_plans(options)
    n, batch = max(options.devices), plans["plain"].batch_size
    return ModelCheckPlan(plans, tuple(options.runs()), tuple(shard_bounds(batch, n, i) for i in range(n)))


def make_plans(options: CheckOptions) -> dict[str, RunPlan]:
    """The runs of each strategy: plain steps, a batch the device counts do not divide, and accumulation
    over micro-steps of different sizes (CheckOptions.accumulation_batch)."""
    return {"plain": RunPlan(options.batch_size, options.steps, options.seed),
            "uneven": RunPlan(options.uneven_batch(), options.steps, options.seed),
            "accumulate": RunPlan(options.accumulation_batch(), options.steps, options.seed, micro_steps=options.accumulate)}


def make_optimizer(options: CheckOptions, spec: ModelSpec):
    """The spec's optimizer, or the check's SGD with momentum and weight decay (so that optimizer
    state and decay are exercised)."""
    return spec.optimizer or SGDFactory(options.lr, options.momentum, options.weight_decay)


@dataclass(frozen=True)
class SGDFactory:
    lr: float
    momentum: float
    weight_decay: float

    def __call__(self, params):
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)


def strategy_for(name: str, n: int, options: CheckOptions, find_unused: bool = False):
    """Strategy `name` on n devices (or ranks), created as the check runs it: its step timeout, its
    device kind, DDP's find_unused_parameters (for a model some steps leave parameters of unused),
    and the speed options (--amp bf16: the forward and loss under bfloat16 autocast; --compile: the
    (wrapped) model under torch.compile)."""
    collective_s = options.step_timeout or 60.0
    if options.compile:  # a rank waits at a collective while another compiles, which the step's limit
        collective_s = max(collective_s, COMPILING_COLLECTIVE_S)  # leaves out (step_timeout's peers): so must this
    settings = StrategySettings(timeout=collective_s, device=options.device, find_unused_parameters=find_unused)
    strategy = get_strategy(name).create(n, settings)
    strategy.use_speed_options(amp=options.amp, compile=options.compile)
    return strategy


def label(name: str, n: int) -> str:
    """How a run is named in progress lines and timeouts: "manual on 2 devices", "ddp on 2 ranks"."""
    return f"{name} on {n} {'ranks' if name in RANK_STRATEGIES else 'devices' if n > 1 else 'device'}"


def run_device(n: int, kind: str = "auto") -> torch.device:
    """The first device of a run on n devices: cuda:0 when n GPUs exist (and kind allows), else the CPU (emulated)."""
    return devices(n, kind=kind)[0]
