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

from mgpu.check.names import names_on_first_use

# Where each public name lives; imported on first use (PEP 562), so that `mgpu check --help` and a bad
# option answer without importing torch (the command line imports check/model/command.py through here).
_PUBLIC = {"Divergence": "mgpu.check.divergence", "ModelDivergence": "mgpu.check.model.compare",
           "assert_tensors_close": "mgpu.check.model.compare", "CheckOptions": "mgpu.check.model.check",
           "CheckResult": "mgpu.check.model.check", "Report": "mgpu.check.model.check",
           "check_data_parallel": "mgpu.check.model.check", "run_check": "mgpu.check.model.check"}

__all__ = sorted(_PUBLIC)

__getattr__ = names_on_first_use(__name__, _PUBLIC)
