"""Data-parallel parity for any model: does training on N devices compute what one device computes?

    python -m mgpu check MODULE:FUNCTION                  # the command (docs/guide/check.md)
    >>> from mgpu.parity import check_data_parallel
    >>> check_data_parallel("examples/tiny_lm.py:spec")    # in a pytest test: AssertionError on a divergence

One of mgpu's two checks, on the check core at the top of mgpu/check/ (the divergence, the tolerance
rule, the report); the other is mgpu/check/script/, a user's own training script. Read in the order a check runs:

    plan      plans     each run's batches, optimizer, strategy and name
              probe     what the model does that matters (random, batch-mixing and unused layers, buffers, a mean loss)
    run       record    a strategy's run as it happens, and the single-device reference steps
              ranks     ddp and fsdp: one spawn of ranks per world size, their recordings gathered on rank 0
    judge     judge     each check's verdict against the references (the check's context and reference cache)
              compare   a run's tensors against the references, within the core's tolerance rule
              findings  findings about the model, notes about the run, the command that reproduces a failure
    report    report    the results, as a table, a failure message, and JSON
    command   command   `mgpu check`: its options from the command line, the core's command ending
    check     check     run_check and check_data_parallel: the stages above in order, and the API
"""

from mgpu.check.divergence import Divergence
from mgpu.check.model.check import CheckOptions, CheckResult, Report, check_data_parallel, run_check
from mgpu.check.model.compare import assert_tensors_close

__all__ = ["CheckOptions", "CheckResult", "Report", "check_data_parallel", "run_check", "Divergence",
           "assert_tensors_close"]

