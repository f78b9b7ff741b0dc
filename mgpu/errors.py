"""Exceptions mgpu raises for bad input.

Every error a user can cause derives from `MgpuError`, so the CLI turns each into one line
(`mgpu: error: ...`, exit code 2) while a genuine bug still shows its traceback. The exit codes
and the one-line parser live here too, so that any command can use them without importing another. Each class
also derives from the builtin a Python caller would expect (ValueError, FileNotFoundError, ...).
"""


import argparse

# The exit codes of every mgpu and mgpu_perf command, in this one table (when each is used, command by
# command: docs/guide/failures.md, "Exit codes of every command"; mgpu/cli.py's docstring).
EXIT_OK = 0             # the run finished; check, check-script: PASSED; gate: nothing slower; history: no slowdown
EXIT_FAILED = 1         # a rank failed or a NaN loss; a check FAILED; bench: a case failed; gate: slower, or a
                        # workload failed in an arm; history: a slowdown the A/B gate confirmed (--confirm)
EXIT_USAGE = 2          # bad input: one line on stderr, `mgpu: error: ...`
EXIT_NOT_VERIFIED = 3   # check, check-script: nothing differed, but too little was compared to say so
EXIT_SUSPECTED = 4      # history: a suspected slowdown that no gate confirmed (not 3: the checks' NOT VERIFIED)
EXIT_NOT_COMPARABLE = 6  # the counted baseline (pytest --counts-check FILE): an entry of another torch or device
                         # (pytest's own codes end at 5)
EXIT_SIGNALLED = 128    # plus the signal's number: 130 Ctrl-C (SIGINT), 143 SIGTERM; every rank stopped first
# A rank's own exit codes, which its launcher reads (mgpu.launch) and turns into one of the above:
EXIT_RANK_DEADLINE = 124  # ended by spawn's deadline_s (timeout's own code)
EXIT_RANK_PARTED = 125    # check-script --whole-run: ended by the watcher that saw another rank leave (meeting.py)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage dump) and exit code 2: the parser of every mgpu
    and mgpu_perf command."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"mgpu: error: {message}\n")


def one_line(e: BaseException, with_type: bool = False) -> str:
    """An exception's message on one line (for `mgpu: error: ...`); with_type prefixes its class name."""
    text = " ".join(str(e).split())
    if with_type:
        return f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text or type(e).__name__


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
    """A multi-process run could not start, or one of its ranks failed.

    str(): one line, "rank 1 failed: RuntimeError: ...", "rank 1 failed: killed by SIGKILL", "port
    ... is already in use"; after it, the rank's traceback when the rank raised something other
    than an mgpu error. The same in fields (mgpu.launch fills them), for callers that act on them:

    rank: the rank that failed first; None when no rank did (the run could not start, or outlived
        its deadline).
    kind: the class name of the exception the rank raised ("CheckTimeout", "RuntimeError"), or
        "signal" (killed by one), "exit" (an exit code), "deadline", "port"; None where not told.
    message: the rank's exception message (its first line, without the class name), or what the
        one line says for the other kinds.
    """

    def __init__(self, text: str, rank: int | None = None, kind: str | None = None, message: str | None = None):
        super().__init__(text)
        self.rank, self.kind = rank, kind
        self.message = text.split("\n", 1)[0] if message is None else message


class SpecError(MgpuError, ValueError):
    """A user's model (MODULE:FUNCTION, or a ModelSpec) cannot be loaded, built or trained as given."""


class CheckTimeout(MgpuError, TimeoutError):
    """A step of a parity check did not finish within its time limit (the model hangs)."""


class ParityError(AssertionError):
    """Data-parallel training computed something else than single-device training.

    An AssertionError, so that `check_data_parallel(spec)` fails a pytest test with the first
    divergence as its message. Not an MgpuError: the model or mgpu is wrong, not the input.
    """

    def __init__(self, message: str, report=None):
        super().__init__(message)
        self.report = report


class NotVerifiedError(ParityError):
    """A check found nothing that differs, but compared too little to say that parity holds (its
    verdict is NOT VERIFIED: comparisons skipped, world 1 not reproducing itself, gradients that are
    all zero). A ParityError, so that a test fails on it as on a divergence; a class of its own, so
    that a caller can tell the two apart (and `accept_not_verified=True` lets it pass)."""


def end_command(run, failures: tuple = ()) -> int:
    """Every mgpu command's ending (train, check, check-script): `run()`'s exit code; one of `failures`
    (a run that failed while training: a rank's error, a NaN loss) printed and exit 1; any other
    MgpuError (bad input) one line and exit 2; Ctrl-C or SIGTERM (a KeyboardInterrupt carrying
    `signum`: mgpu.launch stops every rank first) said and 128 + the signal."""
    import sys

    try:
        return run()
    except failures as e:
        # A rank's failure keeps its lines ("rank R failed: ...", then its traceback if it was a bug).
        print(f"mgpu: error: {e if isinstance(e, LaunchError) else one_line(e)}", file=sys.stderr)
        return EXIT_FAILED
    except MgpuError as e:
        print(f"mgpu: error: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", 2)
        print(f"mgpu: {'interrupted' if signum == 2 else 'terminated'}: every rank stopped", file=sys.stderr)
        return EXIT_SIGNALLED + signum
