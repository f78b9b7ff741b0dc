"""Exceptions mgpu raises for bad input.

Every error a user can cause derives from `MgpuError`, so the CLI turns each into one line
(`mgpu: error: ...`, exit code 2) while a genuine bug still shows its traceback. Each class
also derives from the builtin a Python caller would expect (ValueError, FileNotFoundError, ...).
"""


class MgpuError(Exception):
    """Base class of every error caused by bad input or a bad environment."""


class ConfigError(MgpuError, ValueError):
    """A setting is out of range or inconsistent with another one."""


class DeviceError(MgpuError, RuntimeError):
    """The devices asked for cannot be had."""


class ShapeError(MgpuError, ValueError):
    """Tensors that must agree in length, shape or dtype do not."""


class DataNotFoundError(MgpuError, FileNotFoundError):
    """Dataset files are missing and downloading was not asked for."""


class DataError(MgpuError, ValueError):
    """Dataset files exist but cannot be read, or hold the wrong kind of data."""


class OutputDirError(MgpuError, OSError):
    """The output folder cannot be created or written."""


class NonFiniteLossError(MgpuError, FloatingPointError):
    """Training produced a NaN or infinite loss."""


class CheckpointError(MgpuError, RuntimeError):
    """A checkpoint is missing, truncated, corrupt or from another run configuration."""


class LaunchError(MgpuError, RuntimeError):
    """A multi-process run could not start, or one of its ranks failed."""
