"""Data-parallel parity for any model: does training on N devices compute what one device computes?

    python -m mgpu check MODULE:FUNCTION                  # the command (docs/check.md)
    >>> from mgpu.parity import check_data_parallel
    >>> check_data_parallel("examples/tiny_lm.py:spec")    # in a pytest test: AssertionError on a divergence

`record` runs a strategy and the single-device reference, `compare` holds the tolerances (from a
float64 run, not a hand-picked atol), `probe` finds what the model does that matters (random,
batch-mixing and unused layers, buffers), `check` puts them together, `report` prints and writes.
"""

from mgpu.parity.check import CheckOptions, CheckResult, Report, check_data_parallel, run_check
from mgpu.parity.compare import Divergence, assert_tensors_close

__all__ = ["CheckOptions", "CheckResult", "Report", "check_data_parallel", "run_check", "Divergence",
           "assert_tensors_close"]
