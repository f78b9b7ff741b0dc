"""`mgpu check-script`: your own training script, unchanged, at world size 1 and at N ranks, compared
optimizer step by optimizer step (docs/guide/check-script.md).

    python -m mgpu check-script [--ranks 1,2] [--steps 4] [--json F] [--strict] [--accept-not-verified]
                                [--timeout S] SCRIPT [ARGS...]
    python -m mgpu check-script [options] -m MODULE [ARGS...]

    >>> from mgpu.scriptcheck import check_script
    >>> check_script("train.py", args=["--batch-size", "{64 // world_size}"], ranks=(1, 2), steps=4)

One of mgpu's two checks, on the check core at the top of mgpu/check/ (the divergence, the tolerance
rule, the report); the other is mgpu/check/model/, any model under mgpu's strategies. Its two sides: what
runs inside the user's process (inrank/) and what plans, runs, compares and judges it here. In order:

    plan      plan      the options (validated once), the script and its ARGS, the runs to make and what
                        each rank is told (ScriptCheckPlan); scriptargs: the script's own batch option, for the hint
    run       launch    each world size through torch's elastic agent, as torchrun; every rank's record
    in rank   inrank/   rank, recorder: inside each rank (torch's optimizer and module hooks), with inputs,
                        batchnorm, precision, feeds, collectives, evidence, settings: what a comparison or a
                        cause needs; keyed: random augmentation keyed to the example, each batch's indices;
                        draws: seeds, draws outside the forward, generator states; names: parameter names;
                        tracer: a traced rerun's modules; records: the RankRecord each rank writes
    judge     judge     crashes, findings, world 1 against itself, each world N against world 1
              compare   step by step: the start, the data, the gradients, the updates, the weights
              data, tensors, optimizer, tally: the examples compared; the error and tolerance of a tensor,
                        the equality of two settings; settings and updates; what was compared, and its sensitivity
              augment   the indices and draws merged: which sampler indices agree, what randomness is not
                        keyable, ranks drawing alike
    locate    locate    where a failed step's divergence enters the model: world 1 and N again, traced
    causes    causes/   why they part: each cause with the evidence it needs and the words it says, one module
                        per family (start, data, gradients, optimizer, collectives, randomness, entry; facts);
                        every `diagnosis=` above is a call into it (causes/__init__.py: to add a cause)
    report    report    the verdict, as text and JSON
    command   command   `mgpu check-script`: its options from the command line, the core's command ending
"""

from __future__ import annotations

import time

from mgpu.check.script.plan import (DEFAULT_RANKS, DEFAULT_STEPS, DEFAULT_TIMEOUT, ScriptCheckError, ScriptCheckOptions,
                                   Target)

__all__ = ["check_script", "run_check_script", "main", "ScriptCheckError", "ScriptCheckOptions"]


def run_check_script(script: str | None = None, args=(), ranks=DEFAULT_RANKS, steps: int = DEFAULT_STEPS,
                     module: str | None = None, timeout: float | None = DEFAULT_TIMEOUT, progress=None):
    """Run the check and return its ScriptReport (mgpu.check.script.report). Bad input (a missing
    script, a bad `{world_size}` expression, a script that never steps a torch optimizer) raises
    ScriptCheckError; a divergence or a crash is in the report, not raised."""
    options = ScriptCheckOptions(tuple(ranks), steps, timeout).validate()
    return check_with(Target(script, module, tuple(str(a) for a in args)), options, progress)


def check_with(target: Target, options: ScriptCheckOptions, progress=None):
    """plan -> run -> judge -> report, for a target and validated options (the command's way in)."""
    from mgpu.check.script.judge import judge
    from mgpu.check.script.launch import run_checked
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
    # Only a comparison that failed at a gradient or a weight: a second, traced run says where it enters.
    locate_s = locate_failures(plan, runs, judgement.comparisons)
    report = ScriptReport.of(plan.target, options, runs, judgement)
    report.seconds = time.time() - started
    report.timings = timings_of(runs, report.seconds, compare_s, setup)
    if locate_s:
        report.timings["locate"] = round(locate_s, 3)
    return report


def check_script(script: str | None = None, args=(), ranks=DEFAULT_RANKS, steps: int = DEFAULT_STEPS,
                 module: str | None = None, timeout: float | None = DEFAULT_TIMEOUT, strict: bool = False,
                 accept_not_verified: bool = False):
    """run_check_script, for a test: returns the report when it passed; raises ParityError (an
    AssertionError) with the first divergence, or the crash, when it failed (with strict=True also for
    a finding), and NotVerifiedError (a ParityError) when it is NOT VERIFIED, unless accept_not_verified:
    the exit codes of the command, as exceptions (mgpu.check.report.CheckReport.raise_unless_accepted)."""
    report = run_check_script(script, args, ranks, steps, module, timeout)
    return report.raise_unless_accepted(strict, accept_not_verified)


def main(argv: list[str] | None = None, prog: str = "mgpu check-script") -> int:
    """The command, on its own (`python -m mgpu.scriptcheck`): exit 0, 1, 2 or 3 (NOT VERIFIED)."""
    from mgpu.check.script.command import main as command_main

    return command_main(argv, prog)
