"""`mgpu check-script`'s public names, where users import them (`from mgpu.scriptcheck import check_script`),
and `python -m mgpu.scriptcheck SCRIPT [ARGS...]`.

The check itself lives in mgpu/check/script/ (docs/guide/check-script.md); this package only hands its names on.
"""

from mgpu.check.script import ScriptCheckError, ScriptCheckOptions, WholeRun, check_script, main, run_check_script

__all__ = ["check_script", "run_check_script", "main", "ScriptCheckError", "ScriptCheckOptions", "WholeRun"]
