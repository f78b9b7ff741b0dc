"""check-script's API: the stages in order (plan -> run -> judge -> confirm -> locate -> report) for a script or a
module and its ARGS, and the report, or for a test the report's verdict as an exception.

    >>> from mgpu.scriptcheck import check_script
    >>> check_script("train.py", args=["--batch-size", "{64 // world_size}"], ranks=(1, 2), steps=4)
    >>> check_script("train.py", args=["--batch-size", "{64 // world_size}"], steps=WholeRun(epoch_steps=4))
"""

from __future__ import annotations

import functools
import time

from mgpu.check.script.plan import (DEFAULT_RANKS, DEFAULT_STEPS, DEFAULT_TIMEOUT, ScriptCheckOptions, Target,
                                    WholeRun)

__all__ = ["run_check_script", "check_with", "check_script", "WholeRun"]


def run_check_script(script: str | None = None, args=(), ranks=DEFAULT_RANKS, steps: int | WholeRun = DEFAULT_STEPS,
                     module: str | None = None, timeout: float | None = DEFAULT_TIMEOUT, progress=None):
    """Run the check and return its ScriptReport (mgpu.check.script.report). Bad input (a missing
    script, a bad `{world_size}` expression, a script that never steps a torch optimizer, a bad
    --epoch-steps) raises ScriptCheckError; a divergence or a crash is in the report, not raised.
    `steps`: the optimizer steps recorded and compared: K, the first K (then the script is stopped), or
    WholeRun(epoch_steps=K): the command's --whole-run, the script run to its own end, each training
    epoch cut after K optimizer steps (default 4), every recorded step compared."""
    options = ScriptCheckOptions.of(tuple(ranks), steps, timeout)
    return check_with(Target(script, module, tuple(str(a) for a in args)), options, progress)


def check_with(target: Target, options: ScriptCheckOptions, progress=None):
    """plan -> run -> judge -> confirm -> locate -> report, for a target and validated options (the command's
    way in): each stage handed what the stages before it found, the judgement carrying the runs it compared."""
    from mgpu.check.script.confirm import confirm_in_float64
    from mgpu.check.script.judge import judge
    from mgpu.check.script.launch import run_checked, run_world
    from mgpu.check.script.locate import locate_failures
    from mgpu.check.script.plan import plan_check
    from mgpu.check.script.report import ScriptReport, timings_of

    started = time.time()
    plan = plan_check(target, options)
    setup = time.time() - started
    runs = run_checked(plan, progress=progress)
    judged_at = time.time()
    judgement = judge(plan, runs)
    compare_s = time.time() - judged_at
    rerun = functools.partial(run_world, plan)  # confirm and locate run worlds again, each its way
    # A trajectory that parts by no factor of the world size, computed again in float64: rounding or the loop?
    confirm_s = confirm_in_float64(judgement, rerun, plan.batch_hint)
    # Only a comparison that failed at a gradient or a weight: a second, traced run says where it enters.
    locate_s = locate_failures(judgement, rerun)
    report = ScriptReport.of(plan.target, options, runs, judgement)
    report.seconds = time.time() - started
    report.timings = timings_of(runs, report.seconds, compare_s, setup)
    if confirm_s:
        report.timings["confirm"] = round(confirm_s, 3)
    if locate_s:
        report.timings["locate"] = round(locate_s, 3)
    return report


def check_script(script: str | None = None, args=(), ranks=DEFAULT_RANKS, steps: int | WholeRun = DEFAULT_STEPS,
                 module: str | None = None, timeout: float | None = DEFAULT_TIMEOUT, strict: bool = False,
                 accept_not_verified: bool = False):
    """run_check_script, for a test: returns the report when it passed; raises ParityError (an
    AssertionError) with the first divergence, or the crash, when it failed (with strict=True also for
    a finding), and NotVerifiedError (a ParityError) when it is NOT VERIFIED, unless accept_not_verified:
    the exit codes of the command, as exceptions (mgpu.check.report.CheckReport.raise_unless_accepted)."""
    report = run_check_script(script, args, ranks, steps, module, timeout)
    return report.raise_unless_accepted(strict, accept_not_verified)
