"""Data-parallel parity for any model: does training on N devices compute what one device computes?

    python -m mgpu check MODULE:FUNCTION                  # the command (docs/guide/check.md)
    >>> from mgpu.parity import check_data_parallel
    >>> check_data_parallel("examples/tiny_lm.py:spec")    # in a pytest test: AssertionError on a divergence

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
           "assert_tensors_close"]
