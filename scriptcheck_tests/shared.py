"""check-script runs that several tests only read, made once a session.

A check of examples/loops/world_size_factor.py at 1 vs 2 ranks (3 runs: world 1 twice and world 2, then
a traced pass where it fails) takes 5-7 s on a 2-core CPU. Three tests read the same one:
examples/test_loops.py's planted defect `world_size_factor` (its first divergence and diagnosis) and
`test_check_script_raises_the_first_divergence` (check_script's AssertionError), and
scriptcheck_tests/test_locate.py's `test_a_loss_divided_by_the_world_size_once_more_enters_in_the_loss...`
(where it enters). `shared_report` makes a run once for each (script, ARGS, ranks, steps) and hands every
test the same report; a test must only read it.

    from scriptcheck_tests.shared import shared_report, with_shared_runs
"""

from __future__ import annotations

import contextlib
import inspect
import os

from mgpu.scriptcheck import run_check_script

LOOPS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "loops")

# examples/loops/world_size_factor.py, the global batch kept at 24, 4 steps: the run the three tests share
WORLD_SIZE_FACTOR = (os.path.join(LOOPS, "world_size_factor.py"), ("--batch-size", "{24 // world_size}"), (1, 2), 4)

_REPORTS: dict = {}


def _key(script: str, args, ranks, steps: int) -> tuple:
    return os.path.realpath(script), tuple(str(a) for a in args), tuple(int(n) for n in ranks), int(steps)


SHARED = {_key(*WORLD_SIZE_FACTOR)}


def shared_report(script: str, args=(), ranks=(1, 2), steps: int = 4):
    """The report of run_check_script(script, args, ranks=ranks, steps=steps): made once a session where
    it is one of SHARED (kept for the tests that read it), made for the caller alone otherwise."""
    key = _key(script, args, ranks, steps)
    if key not in SHARED:
        return run_check_script(script, list(args), ranks=tuple(ranks), steps=steps)
    if key not in _REPORTS:
        _REPORTS[key] = run_check_script(script, list(args), ranks=tuple(ranks), steps=steps)
    return _REPORTS[key]


@contextlib.contextmanager
def with_shared_runs(function):
    """Within the block, `function` (check_script, say) gets its run from shared_report where its call's
    script, ARGS, ranks and steps are a shared run's, and runs it itself otherwise: what it does with
    the report (raise the first divergence) is its own code, unchanged. Where `function` no longer looks
    run_check_script up among its module's names, it runs the check itself (slower, the same test)."""
    names = function.__globals__
    real = names.get("run_check_script")
    if real is None:
        yield
        return

    signature = inspect.signature(real)

    def run(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        given = call.arguments
        if given.get("script") is not None and given.get("module") is None and given.get("progress") is None:
            key = _key(given["script"], given.get("args", ()), given.get("ranks", ()), given.get("steps", 0))
            if key in _REPORTS:
                return _REPORTS[key]
        return real(*args, **kwargs)

    names["run_check_script"] = run
    try:
        yield
    finally:
        names["run_check_script"] = real
