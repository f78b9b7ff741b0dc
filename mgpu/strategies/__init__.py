"""One module per strategy; `get_strategy(name)` returns its class.

    strategy = get_strategy("manual").create(2, StrategySettings())   # a run's: cfg.strategy_settings()
"""

from mgpu.config import STRATEGY_NAMES, StrategySettings
from mgpu.errors import ConfigError
from mgpu.strategies.base import Strategy
from mgpu.strategies.dataparallel import DataParallel
from mgpu.strategies.ddp import DistributedDataParallel
from mgpu.strategies.fsdp import FullyShardedDataParallel
from mgpu.strategies.manual import Manual
from mgpu.strategies.single import SingleDevice

STRATEGIES = {cls.name: cls for cls in (SingleDevice, Manual, DataParallel, DistributedDataParallel,
                                       FullyShardedDataParallel)}
assert tuple(STRATEGIES) == STRATEGY_NAMES
# One process per device (they start ranks of their own, or run inside torchrun's).
RANK_STRATEGIES = tuple(name for name, cls in STRATEGIES.items() if cls.spawns_ranks)


def get_strategy(name: str) -> type[Strategy]:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ConfigError(f"unknown strategy {name!r}: choose one of {', '.join(STRATEGIES)}") from None


__all__ = ["Strategy", "StrategySettings", "STRATEGIES", "RANK_STRATEGIES", "get_strategy", "SingleDevice", "Manual",
           "DataParallel", "DistributedDataParallel", "FullyShardedDataParallel"]
