"""The gated workloads: what a worker of either arm of the A/B gate builds from a spec and times.

    workload = make_gated({"kind": "train-step", "strategy": "ddp", "devices": 2, "width": 16, "batch": 32})
    workload.op()        # the timed unit
    workload.check()     # raises if the results were wrong (non-finite losses, weights that did not move)
    workload.close()

Kinds: `train-step` and `train-epoch` (mgpu's ResNet-18 through its Trainer), `matmul` (the
notebook's kernel), `model-step` (a user's model, `MODULE:FUNCTION`: harness/models.py). A worker
runs this module against whatever `mgpu` (or user's code) its tree holds, so it reaches them only
through their public API: an API the baseline lacks raises ImportError or AttributeError at
construction, which the gate reports as `not comparable`.
"""

from __future__ import annotations

import math

import torch

from mgpu_perf.harness.graphs import GRAPH_MODES, graph_state
from mgpu_perf.harness.models import ModelBench, module_file
from mgpu_perf.harness.ranks import StrategyRankPool, spawns_ranks
from mgpu_perf.harness.sessions import TrainBench, TrainSession, require_training_api

__all__ = ["GATE_KINDS", "make_gated"]


class _Timed:
    """How a worker times a workload (gate/worker.py): `cuda_device`, the CUDA device whose stream
    CUDA events time the step on (None: host wall time decides, `clock_note` says why), and
    `graphs`, whether the step is replayed from a CUDA graph (and why not)."""

    cuda_device = None
    compile_watch = None  # counts/step.py's CompileWatch from the workload's start, when its model is compiled
    clock_note = "host wall time: the step runs on the CPU"
    graphs = {"captured": False, "why": "", "shown": False}
    session = None

    def _time_where_it_runs(self, strategy: str, mode: str) -> None:
        """After setup: CUDA events for a CUDA step in this process, graphs where asked and possible."""
        if spawns_ranks(strategy):
            cuda = torch.cuda.is_available()
            if cuda:
                self.clock_note = f"host wall time: {strategy}'s steps run in rank processes, out of this worker's streams"
            self.graphs = graph_state(False, f"{strategy}: its steps run in rank processes (graphs in ranks are not "
                                             "done yet)" if mode != "off" else "off (asked)", mode, cuda)
            return
        device = self.session.strategy.devices[0]
        if device.type == "cuda":
            self.cuda_device = device
        self.graphs = self.session.use_graphs(mode)

    def count(self, collect_garbage: bool = True) -> list[dict]:
        """One more step, counted (mgpu_perf/counts/step.py), outside the timing: each rank's counts (one
        entry in this process). A CUDA-graph replay dispatches no ops, so the step counted is the plain one.
        `collect_garbage`: counts/step.py's count_step's (False where nothing is timed after)."""
        from mgpu_perf.counts.step import count_session

        graph = getattr(self.session, "graph", None)
        if graph is not None:
            self.session.graph = None
        try:
            return count_session(self.session, self.op, self.compile_watch, collect_garbage)
        finally:
            if graph is not None:
                self.session.graph = graph

    def use_graphs(self, enabled: bool) -> None:
        """The parent's word when another worker could not capture: every worker times one kind of step."""
        if not enabled and self.session is not None and getattr(self.session, "graph", None) is not None:
            self.session.use_graphs("off")
            self.graphs = {**self.graphs, "captured": False}


class _TrainStep(_Timed):
    """One training step of a strategy (a DDP rank pool for ddp); check: finite losses, weights moved."""

    def __init__(self, spec: dict):
        require_training_api()
        bench = TrainBench(spec["strategy"], spec["devices"], per_device_batch=spec.get("batch", 32),
                           width=spec.get("width", 16), steps_per_epoch=spec.get("steps_per_epoch", 3),
                           threads_per_device=spec.get("threads_per_device"), amp=spec.get("amp", "off"),
                           compile=spec.get("compile", False))
        ranks = spawns_ranks(bench.strategy)
        if not ranks and bench.threads_per_device:
            torch.set_num_threads(bench.threads_per_device)
        self.session = StrategyRankPool(bench) if ranks else TrainSession(bench)
        self.losses: list[float] = []
        self._time_where_it_runs(bench.strategy, self.graph_mode(spec))

    @staticmethod
    def graph_mode(spec: dict) -> str:
        """The spec's `graphs` (auto | on | off; default auto). A train-epoch is never captured: its
        evaluation and the Trainer's loop are host work."""
        mode = spec.get("graphs", "auto")
        if mode not in GRAPH_MODES:
            raise ValueError(f"graphs must be one of {', '.join(GRAPH_MODES)}, got {mode!r}")
        return "off" if spec.get("kind") == "train-epoch" else mode

    def op(self) -> None:
        self.losses.append(self.session.step())

    def check(self) -> None:
        bad = [v for v in self.losses if not math.isfinite(v)]
        if bad:
            raise AssertionError(f"non-finite losses: {bad[:3]}")
        if self.session.weights_moved() <= 0:
            raise AssertionError("the steps did not change the weights")

    def close(self) -> None:
        self.session.close()


class _TrainEpoch(_TrainStep):
    """One short epoch (a few steps, then evaluation of one test batch)."""

    def op(self) -> None:
        self.losses.append(self.session.epoch().loss)


class _MatmulKernel(_Timed):
    """The notebook's kernel experiment: `products` products of a size x size matrix with itself."""

    def __init__(self, spec: dict):
        if spec.get("threads"):
            torch.set_num_threads(spec["threads"])
        g = torch.Generator().manual_seed(0)
        self.device = torch.device(spec.get("device", "cpu"))
        self.x = torch.rand(spec.get("size", 384), spec.get("size", 384), generator=g).to(self.device)
        self.products = spec.get("products", 20)
        self.last = None
        if self.device.type == "cuda":
            self.cuda_device = self.device

    def op(self) -> None:
        for _ in range(self.products):
            self.last = self.x.mm(self.x)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def check(self) -> None:
        # Benchmarks run PyTorch's defaults; a machine set to TF32 products (10-bit mantissa) still passes.
        rtol, atol = (2e-2, 1e-1) if self.device.type == "cuda" else (1e-4, 1e-3)
        torch.testing.assert_close(self.last.double(), self.x.double() @ self.x.double(), rtol=rtol, atol=atol)

    def count(self, collect_garbage: bool = True) -> list[dict]:
        from mgpu_perf.counts.step import count_step

        return [count_step(self.op, collect_garbage=collect_garbage).to_dict()]

    def close(self) -> None:
        pass


class _ModelStep(_TrainStep):
    """One training step of a user's model (mgpu's model contract) under a strategy and device count."""

    def __init__(self, spec: dict):
        bench = ModelBench(spec["model"], spec.get("strategy", "single"), spec.get("devices", 1),
                           per_device_batch=spec.get("batch", 32), input_shape=spec.get("input_shape"),
                           classes=spec.get("classes"), threads_per_device=spec.get("threads_per_device"),
                           amp=spec.get("amp", "off"), compile=spec.get("compile", False))
        if spawns_ranks(bench.strategy):
            bench.spec()  # here, not in the ranks: a model this tree cannot load is not comparable (SpecError)
            self.session = StrategyRankPool(bench)
        else:
            self.session = bench.open()
        self.origin = module_file(bench.model)  # the worker refuses a model imported from outside its tree
        self.losses: list[float] = []
        self._time_where_it_runs(bench.strategy, self.graph_mode(spec))


GATE_KINDS = {"train-step": _TrainStep, "train-epoch": _TrainEpoch, "matmul": _MatmulKernel, "model-step": _ModelStep}


def make_gated(spec: dict):
    """The gated workload of a spec such as {"kind": "train-step", "strategy": "single", "devices": 1}:
    an object with op() (the timed unit), count() (one step counted), check() (raises if results were
    wrong) and close()."""
    from mgpu_perf.counts.step import CompileWatch

    try:
        cls = GATE_KINDS[spec["kind"]]
    except KeyError:
        raise ValueError(f"unknown gated workload kind {spec.get('kind')!r}: one of {', '.join(GATE_KINDS)}") from None
    watch = CompileWatch() if spec.get("compile") else None  # before the model is built and compiled
    workload = cls(spec)
    workload.compile_watch = watch
    return workload
