"""The error `mgpu history` raises for bad input: a storage folder that is not there or holds no run,
a folder that is not a git repository, a bad option. One line on the command line, exit code 2."""

from mgpu.errors import MgpuError

__all__ = ["HistoryError"]


class HistoryError(MgpuError, ValueError):
    """The history cannot be read as asked: nothing was analysed."""
