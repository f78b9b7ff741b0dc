"""`mgpu check`'s public names, where users import them (`from mgpu.parity import check_data_parallel`).

The check itself lives in mgpu/check/model/ (docs/guide/check.md); this package only hands its names on.
"""

from mgpu.check.model import (CheckOptions, CheckResult, Divergence, Report, assert_tensors_close,
                              check_data_parallel, run_check)

__all__ = ["CheckOptions", "CheckResult", "Report", "check_data_parallel", "run_check", "Divergence",
           "assert_tensors_close"]


def __getattr__(name: str):
    if name == "check_script":  # it lived here once; the two checks do not import each other
        raise AttributeError("mgpu.parity has no check_script: it is mgpu.scriptcheck's "
                             "(from mgpu.scriptcheck import check_script)")
    raise AttributeError(f"module 'mgpu.parity' has no attribute {name!r}")
