"""Errors mgpu_perf raises for bad input. Each derives from mgpu.errors.MgpuError, so that mgpu's
command line prints it as one line (`mgpu: error: ...`, exit code 2), as it does mgpu's own."""

from mgpu.errors import MgpuError

__all__ = ["GateError"]


class GateError(MgpuError, ValueError):
    """The A/B gate cannot run as asked: a bad option, a REF that is no revision of the repository,
    a baseline whose code or Python cannot start a worker. Nothing was timed."""
