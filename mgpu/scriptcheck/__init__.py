"""`mgpu check-script`: your own training script, unchanged, at world size 1 and at N ranks, compared
optimizer step by optimizer step (docs/check-script.md).

    python -m mgpu check-script [--ranks 1,2] [--steps 4] [--json F] [--strict] [--timeout S] SCRIPT [ARGS...]
    python -m mgpu check-script [options] -m MODULE [ARGS...]

    >>> from mgpu.scriptcheck import check_script
    >>> check_script("train.py", args=["--batch-size", "{64 // world_size}"], ranks=(1, 2), steps=4)

`launch` runs the script per world size (torch's elastic agent, as torchrun), `recorder` is what
runs inside each rank (torch's global optimizer and module hooks, dropout off), `compare` finds the
first divergence and says why, `report` prints it and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from mgpu.errors import MgpuError, ParityError
from mgpu.scriptcheck.launch import ScriptCheckError, Target

__all__ = ["check_script", "run_check_script", "main", "ScriptCheckError"]

DEFAULT_RANKS = (1, 2)
DEFAULT_STEPS = 4
DEFAULT_TIMEOUT = 300.0


def run_check_script(script: str | None = None, args=(), ranks=DEFAULT_RANKS, steps: int = DEFAULT_STEPS,
                     module: str | None = None, timeout: float | None = DEFAULT_TIMEOUT, progress=None):
    """Run the check and return its ScriptReport (mgpu.scriptcheck.report). Bad input (a missing
    script, a bad `{world_size}` expression, a script that never steps a torch optimizer) raises
    ScriptCheckError; a divergence or a crash is in the report, not raised."""
    from mgpu.scriptcheck.compare import compare_world, reproducibility
    from mgpu.scriptcheck.launch import run_worlds
    from mgpu.scriptcheck.report import ScriptReport, findings_of, timings_of

    started = time.time()
    worlds = tuple(sorted({1, *(int(r) for r in ranks)}))
    if any(w < 1 for w in worlds):
        raise ScriptCheckError(f"--ranks must be positive world sizes, got {ranks}")
    if not isinstance(steps, int) or steps < 1:
        raise ScriptCheckError(f"--steps must be a positive integer, got {steps!r}")
    if timeout is not None and not timeout > 0:
        raise ScriptCheckError(f"--timeout must be positive seconds, got {timeout!r}")
    target = Target(script, module, tuple(str(a) for a in args)).validate()
    report = ScriptReport(target.label(), list(target.args), worlds, steps)
    setup = time.time() - started
    runs = run_worlds(target, worlds, steps, timeout, progress=progress)
    report.runs = runs
    t_compare = time.time()
    report.failures = [r.failure for r in runs if r.failure is not None]
    findings, facts = findings_of(runs)
    report.findings = findings
    by_kind = {}
    for r in runs:
        if r.world == 1 and r.failure is None:
            by_kind.setdefault(r.device, {})[r.run] = r
    a_runs = [r for r in runs if r.world == 1 and r.run == "A" and r.failure is None]
    if a_runs and not a_runs[0].ranks[0]["records"]:
        rec = a_runs[0].ranks[0]
        seen = (f"it ran {rec['forwards']} forward(s) of a model with parameters" if rec["forwards"] else
                "it never called a model with parameters (nn.Module) either")
        raise ScriptCheckError(
            f"{target.label()} made no torch.optim optimizer step at world 1 ({seen}): check-script records at "
            "torch.optim.Optimizer.step (torch's global optimizer hooks), so it needs a script that trains with a "
            "torch.optim optimizer (or a wrapper that calls one, such as accelerate's) and steps it at least once; "
            "check the ARGS make it train")
    for r in a_runs:
        made = len(r.ranks[0]["records"])
        if made < steps:
            report.notes.append(f"the script made {made} optimizer step(s) at world 1 ({r.device}), fewer than the "
                                f"{steps} asked (--steps): compared on the steps it made")
    arg_hint = _arg_hint(target.args)
    for kind, pair in by_kind.items():
        if "A" in pair and "B" in pair and report.unreproducible is None:
            report.unreproducible = reproducibility(pair["A"], pair["B"])
    for r in runs:
        if r.world == 1:
            continue
        pair = by_kind.get(r.device, {})
        from mgpu.scriptcheck.divergence import WorldComparison

        if r.failure is not None:
            continue
        if "A" not in pair or "B" not in pair:
            report.comparisons.append(WorldComparison(r.world, "not-compared", 0, reason="world 1 failed"))
        elif report.unreproducible is not None:
            report.comparisons.append(WorldComparison(r.world, "not-compared", 0,
                                                      reason="two world-1 runs differ (see above)"))
        elif not r.ranks[0]["records"]:
            report.comparisons.append(WorldComparison(
                r.world, "fail", 0, reason="no optimizer step",
                first=_no_steps(r.world)))
        else:
            report.comparisons.append(compare_world(r, pair["A"], pair["B"], facts, arg_hint))
    report.seconds = time.time() - started
    report.timings = timings_of(runs, report.seconds, time.time() - t_compare, setup)
    return report


def _no_steps(world: int):
    from mgpu.scriptcheck.divergence import Divergence

    return Divergence(1, "data", None, None, None, None, None,
                      f"world {world} made no optimizer step where world 1 did: does the script take another path "
                      "when distributed?", detail="no step recorded")


def _arg_hint(args) -> str:
    """How to keep the global batch, in the script's own batch-size argument where there is one."""
    if any("world_size" in a for a in args):
        return "an ARGS expression of world_size that keeps the global batch (check the one given)"
    for i, a in enumerate(args):
        if "batch" in a.lower():
            value = a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
            if value.isdigit():
                flag = a.split("=", 1)[0]
                return f"{flag} {{{value} // world_size}} in ARGS"
    return "--batch-size {64 // world_size} in ARGS (an expression of world_size, evaluated per run)"


def check_script(script: str | None = None, args=(), ranks=DEFAULT_RANKS, steps: int = DEFAULT_STEPS,
                 module: str | None = None, timeout: float | None = DEFAULT_TIMEOUT, strict: bool = False):
    """run_check_script, for a test: returns the report when it passed; raises ParityError (an
    AssertionError) with the first divergence, or the crash, when it failed (also when it is not
    verified or has findings, with strict=True)."""
    report = run_check_script(script, args, ranks, steps, module, timeout)
    if report.exit_code(strict=strict):
        raise ParityError(report.first_failure(), report)
    return report


# -- the command ---------------------------------------------------------------------------------------

def build_parser(prog: str = "mgpu check-script") -> argparse.ArgumentParser:
    from mgpu.errors import OneLineParser

    p = OneLineParser(prog=prog, allow_abbrev=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                      description="Run your training script unchanged at world size 1 and at N ranks (torch's "
                                  "elastic agent, as torchrun) and compare them optimizer step by step.")
    add_arguments(p)
    return p


def add_arguments(p) -> None:
    p.add_argument("--ranks", default=",".join(map(str, DEFAULT_RANKS)), metavar="N[,N...]",
                   help="world sizes to run (world 1 always runs, twice: the reference and its rerun)")
    p.add_argument("--steps", default=str(DEFAULT_STEPS), metavar="K", help="optimizer steps recorded and compared")
    p.add_argument("--timeout", default=str(DEFAULT_TIMEOUT), metavar="S",
                   help="seconds one run (one world size) may take before every rank is stopped")
    p.add_argument("--json", default=None, metavar="PATH", help="write the report as JSON here")
    p.add_argument("--strict", action="store_true",
                   help="findings and NOT VERIFIED fail too (exit 1)")
    p.add_argument("-m", dest="module", action="store_true",
                   help="SCRIPT is a module, run as python -m MODULE (as torchrun's -m)")
    p.add_argument("script", metavar="SCRIPT", help="the training script (or, with -m, a module)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="the script's arguments; {expressions of world_size} are evaluated per run, "
                        "e.g. --batch-size {64 // world_size}")


def main(argv: list[str] | None = None, prog: str = "mgpu check-script") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    return run_main(parser, args)


def run_main(parser, args) -> int:
    """The command on parsed arguments (for a subcommand of `mgpu`): exit 0, 1 or 2."""
    try:
        ranks = tuple(int(p) for p in args.ranks.split(",") if p.strip())
    except ValueError:
        parser.error(f"--ranks must be comma-separated world sizes such as 1,2, got {args.ranks!r}")
    if not ranks or any(r < 1 for r in ranks):
        parser.error(f"--ranks must be positive world sizes such as 1,2, got {args.ranks!r}")
    try:
        steps = int(args.steps)
    except ValueError:
        steps = -1
    if steps < 1:
        parser.error(f"--steps must be a positive integer, got {args.steps!r}")
    try:
        timeout = float(args.timeout)
    except ValueError:
        timeout = -1.0
    if not timeout > 0:
        parser.error(f"--timeout must be positive seconds, got {args.timeout!r}")
    if args.json is not None:
        folder = os.path.dirname(os.path.abspath(args.json))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            parser.error(f"cannot write --json {args.json}: folder {folder} does not exist or is not writable")
    script, module = (None, args.script) if args.module else (args.script, None)

    def progress(run):
        state = "failed" if run.failure else f"{len(run.ranks[0]['records'])} step(s)"
        print(f"mgpu check-script: {run.name}{' [cuda]' if run.device == 'cuda' else ''}: {state}, "
              f"{run.seconds:.1f} s", file=sys.stderr, flush=True)

    try:
        report = run_check_script(script, args.args, ranks, steps, module, timeout, progress=progress)
    except MgpuError as e:
        print(f"mgpu: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", 2)
        print(f"mgpu: {'interrupted' if signum == 2 else 'terminated'}: every rank stopped", file=sys.stderr)
        return 128 + signum
    print(report.text())
    if args.json is not None:
        report.write_json(args.json)
    return report.exit_code(strict=args.strict)
