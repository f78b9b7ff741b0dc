"""The names mgpu's options accept: strategies, models, data, AMP modes, device kinds, FSDP's modes.

Imports nothing: the pytest plugin declares the gate's options with them at every pytest start
(mgpu_perf/gate/settings.py), and mgpu/config.py's run settings check against them.
"""

__all__ = ["STRATEGY_NAMES", "MODEL_NAMES", "DATA_NAMES", "NONFINITE_POLICIES", "AMP_MODES", "DEVICE_KINDS",
           "SHARD_MODES", "RESHARD_MODES"]

STRATEGY_NAMES = ("single", "manual", "dataparallel", "ddp", "fsdp")
MODEL_NAMES = ("resnet18", "lenet")
DATA_NAMES = ("synthetic", "fashion-mnist")
NONFINITE_POLICIES = ("error", "skip")
AMP_MODES = ("off", "bf16")
DEVICE_KINDS = ("auto", "cpu", "cuda")  # GPUs when there are enough else the CPU | the CPU always | GPUs or an error
SHARD_MODES = ("block", "model")   # fsdp: a fully_shard per block, then the root; or the root only
RESHARD_MODES = ("on", "off")      # fsdp: free the gathered parameters after forward (gather again in backward)
