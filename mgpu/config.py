"""Settings of one training run, shared by the CLI, the API and every strategy.

`TrainConfig.validate` holds every rule a setting must follow, and its messages. Each setting is
declared once, as a field with `option(...)` (mgpu/options.py): `mgpu train`'s flags are made from
the fields (`TrainConfig.add_to`), and the CLI only turns their text into numbers
(`TrainConfig.from_namespace`) and reports `validate`'s ConfigError as its one-line error. A run hands
its parts only what they use: the strategy its `StrategySettings` (`cfg.strategy_settings()`),
the Trainer its `LoopSettings` (`cfg.loop_settings()`).

Imports nothing heavy (no torch): the CLI checks its options before torch is imported.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from mgpu.errors import ConfigError
from mgpu.names import (AMP_MODES, DATA_NAMES, DEVICE_KINDS, MODEL_NAMES, NONFINITE_POLICIES, RESHARD_MODES,
                        SHARD_MODES, STRATEGY_NAMES)
from mgpu.options import Options, comma_list, number_text, option, whole_number
from mgpu.validators import choices_metavar, finite_number, is_int, non_negative_int, positive_int

EXACT_GPU_MATH_ENV = "MGPU_EXACT_GPU_MATH"  # "1": every run (CLI, ranks) computes with exact_gpu_math, as --exact-gpu-math


@dataclass(frozen=True)
class StrategySettings:
    """What a strategy is built with (`Strategy.create(devices, settings)`), besides its device count.

    Every strategy gets all of them and reads those it uses (the comments say which); the defaults
    are `mgpu train`'s. The values are taken as given: TrainConfig.validate (or the command that
    builds them) has checked them. The speed options (--amp, --channels-last, --compile) are not
    here: they are set with `Strategy.use_speed_options`, which checks them against the devices.
    """

    device: str = "auto"                  # all: auto | cpu | cuda, where the devices are (mgpu.devices.place)
    require_gpus: bool = False            # all: fail instead of emulating when GPUs are short
    timeout: float = 60.0                 # ddp, fsdp: seconds a rank waits for the others
    port: int | None = None               # ddp, fsdp: rendezvous port of the ranks mgpu starts (None: a free one)
    sync_bn: bool = False                 # ddp: BatchNorm converted to SyncBatchNorm (fsdp refuses it)
    find_unused_parameters: bool = False  # ddp: for models with parameters some steps leave without a gradient
    shard: str = "block"                  # fsdp: block (fully_shard each block, then the root) | model (the root)
    reshard_after_forward: bool = True    # fsdp: free the gathered weights after forward (gather again in backward)


@dataclass(frozen=True)
class LoopSettings:
    """How the Trainer's loop runs (mgpu/trainer.py). An `accumulate` that is no positive integer is
    a ConfigError here, when the settings are made: a Trainer never holds one."""

    epochs: int                           # passes over the training set by `fit` (0: evaluation only)
    on_nonfinite: str = "error"           # NaN/Inf loss: stop with NonFiniteLossError, or skip that step's update
    progress: bool = True                 # a tqdm bar per epoch on stderr (the main process only)
    accumulate: int = 1                   # micro-steps per global batch, gradients synchronised on the last

    def __post_init__(self):
        positive_int(self.accumulate, "accumulate")


@dataclass(frozen=True)
class TrainConfig(Options):
    """Every setting of a training run, each declared once: its default, and as `mgpu train`'s option
    (flag, help, text converter). The converters only turn text into numbers; `validate` holds every
    rule and message, so that `--epochs 2.5` and TrainConfig(epochs=2.5) are told the same."""

    strategy: str = option("single", metavar=choices_metavar(STRATEGY_NAMES), help="how to spread the work")
    devices: int = option(1, text=whole_number, help="devices (replicas, or ranks for ddp and fsdp); emulated on the "
                                                     "CPU when GPUs are short")
    require_gpus: bool = option(False, help="fail instead of emulating missing GPUs")
    device: str = option("auto", metavar=choices_metavar(DEVICE_KINDS),
                         help="auto: GPUs when there are --devices of them, else the CPU; cpu: the CPU even beside "
                              "GPUs; cuda: GPUs or an error (as --require-gpus)")
    exact_gpu_math: bool = option(False, help=f"TF32 off and cuDNN's deterministic algorithms in every process of "
                                              f"the run, for results another run can be compared with (also: "
                                              f"{EXACT_GPU_MATH_ENV}=1); no effect on the CPU")
    epochs: int = option(10, text=whole_number, help="passes over the training set")
    batch_size: int = option(256, text=whole_number, help="global batch size")
    lr: float = option(0.1, text=number_text, help="learning rate")
    momentum: float = option(0.0, text=number_text, help="SGD momentum")
    weight_decay: float = option(0.0, text=number_text, help="L2 penalty added to the gradient by SGD")
    model: str = option("resnet18", metavar=choices_metavar(MODEL_NAMES), help="the model trained")
    width: int = option(64, text=whole_number, help="ResNet-18 base width")
    data: str = option("synthetic", metavar=choices_metavar(DATA_NAMES),
                       help="synthetic (offline) or Fashion-MNIST (torchvision's files)")
    data_dir: str = option("data", help="folder with FashionMNIST/raw/ (torchvision layout)")
    download: bool = option(False, help="download Fashion-MNIST if it is missing")
    resize: int | None = option(None, text=whole_number, help="resize images to this side")
    train_size: int | None = option(None, text=whole_number, help="use the first N training examples")
    test_size: int | None = option(None, text=whole_number, help="use the first N test examples")
    seed: int = option(0, text=whole_number, help="seeds the weights, the synthetic data and the batch order")
    out: str | None = option("runs/latest", help="folder for results.json, accuracy.png and model.pt")
    progress: bool = option(True, flag="--no-progress", store_false=True, help="hide the progress bar")
    on_nonfinite: str = option("error", metavar=choices_metavar(NONFINITE_POLICIES),
                               help="on a NaN/Inf loss: stop with an error, or skip that step's update")
    port: int | None = option(None, text=whole_number, help="ddp rendezvous port (default: a free one, chosen per run)")
    timeout: float = option(60.0, text=number_text, help="ddp: seconds a rank waits for the others")
    sync_bn: bool = option(False, help="ddp: use SyncBatchNorm (CUDA only)")
    checkpoint_dir: str | None = option(None, metavar="DIR", help="save model, optimizer, RNG states and epoch to "
                                                                  "DIR/checkpoint.pt after every epoch")
    resume: bool = option(False, help="continue from the checkpoint in --checkpoint-dir (starts afresh, saying so, "
                                      "if there is none)")
    amp: str = option("off", metavar=choices_metavar(AMP_MODES),
                      help="bf16: autocast forward and loss to bfloat16 (weights and SGD stay fp32)")
    channels_last: bool = option(False, help="channels-last memory layout for images and convolutions")
    compile: bool = option(False, help="the training forward under torch.compile (inductor; the DDP or FSDP wrapper "
                                       "compiled with it)")
    data_on_device: bool = option(False, help="CUDA: hold the whole dataset on the first device, shuffle and gather "
                                              "there (no-op on the CPU)")
    accumulate: int = option(1, text=whole_number, metavar="K",
                             help="gradient accumulation: each global batch in K micro-steps per device, gradients "
                                  "synchronised on the last (under ddp: no_sync before it)")
    shard: str = option("block", metavar=choices_metavar(SHARD_MODES),
                        help="fsdp: fully_shard each block (residual block, layer) then the root, or the whole model "
                             "as one")
    reshard_after_forward: str = option("on", metavar=choices_metavar(RESHARD_MODES),
                                        help="fsdp: free the gathered weights after forward and gather them again for "
                                             "backward (less memory), or keep them (less communication)")

    def validate(self) -> "TrainConfig":
        """Raise ConfigError naming the first bad setting; return self when all are fine."""
        _choice("strategy", self.strategy, STRATEGY_NAMES)
        _choice("model", self.model, MODEL_NAMES)
        _choice("data", self.data, DATA_NAMES)
        _choice("on_nonfinite", self.on_nonfinite, NONFINITE_POLICIES)
        _choice("amp", self.amp, AMP_MODES)
        _choice("device", self.device, DEVICE_KINDS)
        if self.require_gpus and self.device == "cpu":
            raise ConfigError("require_gpus (--require-gpus) and device cpu (--device cpu) contradict each other: give one")
        _choice("shard", self.shard, SHARD_MODES)
        _choice("reshard_after_forward", self.reshard_after_forward, RESHARD_MODES)
        for name in ("devices", "epochs", "batch_size", "width", "accumulate"):
            positive_int(getattr(self, name), _words(name))
        for name in ("resize", "train_size", "test_size"):
            if getattr(self, name) is not None:
                positive_int(getattr(self, name), _words(name))
        non_negative_int(self.seed, "seed")
        finite_number(self.lr, "lr", lowest=0.0, inclusive=False)
        finite_number(self.momentum, "momentum", lowest=0.0, inclusive=True)
        finite_number(self.weight_decay, _words("weight_decay"), lowest=0.0, inclusive=True)
        finite_number(self.timeout, "timeout", lowest=0.0, inclusive=False)
        if self.momentum >= 1:
            raise ConfigError(f"momentum must be below 1, got {self.momentum}")
        if self.batch_size < self.devices:
            raise ConfigError(f"batch size {self.batch_size} is smaller than the {self.devices} devices: "
                              "each device needs at least one example per step")
        if self.batch_size < self.devices * self.accumulate:
            raise ConfigError(f"batch size {self.batch_size} is smaller than {self.devices} device(s) x {self.accumulate} "
                              "micro-steps (--accumulate): each device needs at least one example per micro-step")
        if self.train_size is not None and self.train_size < self.batch_size:
            raise ConfigError(f"train size {self.train_size} is smaller than one global batch of {self.batch_size}: "
                              "no full step could run")
        if self.port is not None and (not isinstance(self.port, int) or not 1 <= self.port <= 65535):
            raise ConfigError(f"port must be an integer in 1..65535, got {self.port!r}")
        if self.resume and not self.checkpoint_dir:
            raise ConfigError("resume needs a checkpoint directory (--checkpoint-dir)")
        if self.checkpoint_dir is not None and not isinstance(self.checkpoint_dir, (str, os.PathLike)):
            raise ConfigError(f"checkpoint dir must be a path, got {self.checkpoint_dir!r}")
        if self.sync_bn and self.strategy == "fsdp":
            raise ConfigError("sync_bn (--sync-bn) is not supported with the fsdp strategy: SyncBatchNorm is converted "
                              "for ddp only; fsdp's BatchNorm statistics follow the ddp rules (each rank's shard, "
                              "rank 0's kept)")
        if self.sync_bn and self.strategy != "ddp":
            raise ConfigError(f"sync_bn (--sync-bn) applies to the ddp strategy only, not {self.strategy!r}")
        if self.strategy != "fsdp":
            for name, default in (("shard", "block"), ("reshard_after_forward", "on")):
                if getattr(self, name) != default:
                    raise ConfigError(f"{name} (--{name.replace('_', '-')}) applies to the fsdp strategy only, "
                                      f"not {self.strategy!r}")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    def strategy_settings(self) -> StrategySettings:
        """What this run's strategy is built with."""
        return StrategySettings(device=self.device, require_gpus=self.require_gpus, timeout=self.timeout,
                                port=self.port, sync_bn=self.sync_bn, shard=self.shard,
                                reshard_after_forward=self.reshard_after_forward == "on")

    def loop_settings(self) -> LoopSettings:
        """How this run's Trainer loops."""
        return LoopSettings(epochs=self.epochs, on_nonfinite=self.on_nonfinite, progress=self.progress,
                            accumulate=self.accumulate)


def _choice(name, value, allowed):
    if value not in allowed:
        raise ConfigError(f"unknown {name} {value!r}: choose one of {', '.join(allowed)}")


def _words(name: str) -> str:
    """A field's name as messages write it: batch_size -> batch size."""
    return name.replace("_", " ")


# -- `python -m mgpu check` -------------------------------------------------------------------------

CHECK_STRATEGIES = STRATEGY_NAMES


def _micro_steps_even(batch: int, devices: int, micro_steps: int) -> bool:
    """Whether every device's shard of `batch` (contiguous, sizes differing by at most one, as
    mgpu.comm.shard_sizes cuts them) cuts into `micro_steps` pieces of one size."""
    base, extra = divmod(batch, devices)
    return all((base + (d < extra)) % micro_steps == 0 for d in range(devices))


@dataclass(frozen=True)
class CheckOptions(Options):
    """Settings of a parity check (mgpu/check/model/check.py), validated like TrainConfig; each declared
    once, as `mgpu check`'s option too (lr, momentum and weight_decay are the API's only)."""

    # --strategies and --devices as mgpu_perf's bench and gate take them (mgpu/option_groups.py: the one
    # converter, comma_list), checked by validate() below: check's own messages.
    strategies: tuple[str, ...] = option(("manual", "dataparallel", "ddp", "fsdp"), metavar="S[,S...]",
                                         text=comma_list(str, empty_ok=True),
                                         help=f"strategies to check, from {','.join(CHECK_STRATEGIES)}")
    devices: tuple[int, ...] = option((2, 3), metavar="N[,N...]",
                                      text=comma_list(int, "comma-separated integers such as 2,3"),
                                      help="device counts (emulated on the CPU when GPUs are short)")
    batch_size: int = option(12, text=whole_number, help="global batch size of each step")  # also the accumulation runs'
    steps: int = option(3, text=whole_number, help="optimizer steps per run")
    seed: int = option(0, text=whole_number, help="weights (rank 0; other ranks differ) and batches")
    accumulate: int = option(2, text=whole_number, metavar="K", help="micro-steps of the gradient accumulation check")
    step_timeout: float | None = option(60.0, text=number_text, metavar="S",
                                        help="seconds a step may take before the model counts as hanging")
    lr: float = 0.05               # the default optimizer (when the spec brings none): SGD with momentum
    momentum: float = 0.9
    weight_decay: float = 1e-3
    device: str = option("auto", metavar=choices_metavar(DEVICE_KINDS),
                         help="auto: GPUs when there are enough for a device count, else the CPU; cpu: every run on "
                              "the CPU; cuda: GPUs or an error")
    amp: str = option("off", metavar=choices_metavar(AMP_MODES),
                      help="bf16: every run's forward and loss under bfloat16 autocast, as train --amp bf16 runs them; "
                           "the allowance comes from the single-device bf16 step (docs/design/check-tolerance.md)")
    compile: bool = option(False, help="every strategy's model under torch.compile (inductor), against the eager "
                                       "single-device reference; a compiled run that diverges from eager fails with "
                                       "its first divergence")

    def validate(self) -> "CheckOptions":
        _choice("device", self.device, DEVICE_KINDS)
        _choice("amp", self.amp, AMP_MODES)
        for name in ("batch_size", "steps", "accumulate"):
            positive_int(getattr(self, name), _words(name))
        non_negative_int(self.seed, "seed")
        if not self.strategies:
            raise ConfigError("no strategies to check")
        for s in self.strategies:
            if s not in CHECK_STRATEGIES:
                raise ConfigError(f"unknown strategy {s!r}: choose from {', '.join(CHECK_STRATEGIES)}")
        if not self.devices:
            raise ConfigError("no device counts to check")
        for n in self.devices:
            if not is_int(n) or n < 1:
                raise ConfigError(f"device counts must be positive integers, got {n!r}")
        most = max(self.devices)
        if self.batch_size < most:
            raise ConfigError(f"batch size {self.batch_size} is smaller than {most} devices: each device needs "
                              "at least one example per step")
        if self.batch_size < most * self.accumulate:
            raise ConfigError(f"batch size {self.batch_size} is smaller than {most} devices x {self.accumulate} "
                              "micro-steps (--accumulate): each device needs an example per micro-step")
        if self.step_timeout is not None and not (isinstance(self.step_timeout, (int, float))
                                                  and not isinstance(self.step_timeout, bool) and self.step_timeout > 0):
            raise ConfigError(f"step timeout must be a positive number of seconds, got {self.step_timeout!r}")
        return self

    def runs(self) -> list[tuple[str, int]]:
        """(strategy, devices) pairs to run; `single` runs on one device only."""
        pairs = []
        for s in self.strategies:
            for n in ([1] if s == "single" else self.devices):
                if (s, n) not in pairs:
                    pairs.append((s, n))
        return pairs

    def accumulation_batch(self) -> int:
        """The global batch of the accumulation check: the smallest from batch_size on that, on
        every device count checked (and on one device), some device's shard cuts into `accumulate`
        micro-steps of different sizes. A loss weighted per micro-step (each micro-step's mean
        divided by the number of micro-steps) is then wrong by the sizes' difference, and the check
        sees it; with micro-steps of one size it would be right by accident."""
        if self.accumulate == 1:
            return self.batch_size
        b = self.batch_size
        while any(_micro_steps_even(b, n, self.accumulate) for n in {1, *self.devices}):
            b += 1
        return b

    def uneven_batch(self) -> int:
        """The smallest batch above batch_size that no device count above 1 divides."""
        b = self.batch_size + 1
        while any(n > 1 and b % n == 0 for n in self.devices):
            b += 1
        return b
