"""Data-parallel parity for any model: does training on N devices compute what one device computes?

    python -m mgpu check MODULE:FUNCTION                  # the command (docs/guide/check.md)
    >>> from mgpu.parity import check_data_parallel
    >>> check_data_parallel("examples/tiny_lm.py:spec")    # in a pytest test: AssertionError on a divergence
    >>> from mgpu.parity import check_script              # your own training script (mgpu/scriptcheck/)
    >>> check_script("train.py", args=["--batch-size", "{64 // world_size}"], ranks=(1, 2), steps=4)

Read in the order a check runs, one job a file:

    check     run_check and check_data_parallel: the order of the steps below, and the API
    probe     what the model does that matters (random, batch-mixing and unused layers, buffers, a mean loss)
    plans     each run's batches, optimizer, strategy and name
    record    a strategy's run as it happens, and the single-device reference steps
    ranks     ddp and fsdp: one spawn of ranks per world size, their recordings gathered on rank 0
    judge     each check's verdict against the references (the check's context and reference cache)
    compare   the tolerances (from a float64 run, not a hand-picked atol) and the first divergence
    findings  findings about the model, notes about the run, the command that reproduces a failure
    report    the results, as a table, a failure message, and JSON
    dropout   holding off the dropout a forward applies through torch's functions
"""

from mgpu.parity.check import CheckOptions, CheckResult, Report, check_data_parallel, run_check
from mgpu.parity.compare import Divergence, assert_tensors_close

__all__ = ["CheckOptions", "CheckResult", "Report", "check_data_parallel", "run_check", "Divergence",
           "assert_tensors_close", "check_script"]


def __getattr__(name: str):
    # check_script lives in mgpu.scriptcheck, which imports this package's dropout: fetched when asked for.
    if name == "check_script":
        from mgpu.scriptcheck import check_script

        return check_script
    raise AttributeError(f"module 'mgpu.parity' has no attribute {name!r}")
