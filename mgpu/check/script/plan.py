"""What a check-script run will do, before anything runs: the options (validated once), the
target (a script or a module, with its ARGS), the `{world_size}` expressions in ARGS, and the runs.

    options = ScriptCheckOptions(ranks=(1, 2), steps=4).validate()
    plan = plan_check(Target("train.py", None, ("--batch-size", "{64 // world_size}")), options)
    plan.first, plan.plain     # ((1, "A", "cpu"),), ((1, "B", "cpu"), (2, "", "cpu"))
    plan.jobs[plan.first[0]]   # what every rank of that run is told (ScriptRankJob), ARGS evaluated

World 1 runs twice on each kind of device the comparison uses: run A, plain, and run B, whose
gradients get a rounding-sized perturbation (the tolerance's spread, compare.py), which also shows
whether the script is reproducible at all. On a machine with GPUs, a world size up to the GPU count
runs on the GPUs; a larger one runs on the CPU, and its world 1 with it.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from mgpu.errors import MgpuError
from mgpu.options import Options, option
from mgpu.validators import number, positive_int, world_sizes

__all__ = ["ScriptCheckError", "ScriptCheckOptions", "Target", "ScriptRankJob", "PlannedRun", "ScriptCheckPlan", "expand_args",
           "plan_runs", "plan_check", "batch_hint", "PERTURB", "PERTURB_SEED_VARIABLE",
           "DEFAULT_RANKS", "DEFAULT_STEPS", "DEFAULT_TIMEOUT", "DEFAULT_EPOCH_STEPS", "WholeRun"]

DEFAULT_RANKS = (1, 2)
DEFAULT_STEPS = 4
DEFAULT_TIMEOUT = 300.0
# --whole-run: each training epoch is cut after this many optimizer steps (--epoch-steps).
DEFAULT_EPOCH_STEPS = 4
# Run B's gradients are perturbed by this times (|g| + rms(g)) per element, with random signs: a few
# float32 roundings, the size of the difference another summation order makes (compare.py).
PERTURB = 2.0 ** -22
# Run B's random signs are one fixed draw, so that a check gives one verdict on one machine; this
# variable picks another draw (docs/notes/measure/repeat_checks.py counts false alarms over draws).
PERTURB_SEED_VARIABLE = "MGPU_CHECK_PERTURB_SEED"


class ScriptCheckError(MgpuError, ValueError):
    """The script cannot be checked as given: missing, bad ARGS expression, no optimizer step, ..."""


@dataclass(frozen=True)
class WholeRun:
    """The API's `steps=WholeRun(epoch_steps=K)`: the command's `--whole-run --epoch-steps K`: the script run to
    its own end, each training epoch cut after K optimizer steps (docs/guide/check-script.md, "--whole-run")."""

    epoch_steps: int = DEFAULT_EPOCH_STEPS


def count_or_text(text: str, flag: str, error: type[Exception]):
    """--steps and --epoch-steps: a count >= 1 as an int; any other text as it is, for validate() to name as typed."""
    return int(text) if text.strip().isdigit() and int(text) >= 1 else text


@dataclass(frozen=True)
class ScriptCheckOptions(Options):
    """What check-script runs: the world sizes (world 1 always runs), the optimizer steps recorded
    and compared, and the seconds one run may take (None: no limit). With `whole_run` the script runs
    to its own end, each training epoch cut after `epoch_steps` optimizer steps (None: --whole-run's
    default, DEFAULT_EPOCH_STEPS); `epoch_steps` without `whole_run` is an error. Each field is
    declared once, as the command's option too (mgpu/options.py); the timeout stays text until
    validate() reads it ('inf': no limit)."""

    error = ScriptCheckError

    ranks: tuple[int, ...] = option(DEFAULT_RANKS, metavar="N[,N...]", text=world_sizes,
                                    help="world sizes to run (world 1 always runs, twice: the reference and its rerun)")
    steps: int = option(DEFAULT_STEPS, metavar="K", text=count_or_text, help="optimizer steps recorded and compared")
    timeout: float | None = option(DEFAULT_TIMEOUT, metavar="S",
                                   help="seconds one run (one world size) may take before every rank is stopped")
    whole_run: bool = option(False, help="run the script to its own end at every world size, each training epoch cut "
                                         "after --epoch-steps optimizer steps, every recorded step compared per "
                                         "epoch (--steps is not used)")
    epoch_steps: int | None = option(None, metavar="K", text=count_or_text,
                                     help=f"with --whole-run: optimizer steps a training epoch runs before its loader "
                                          f"ends the epoch (default {DEFAULT_EPOCH_STEPS})")

    def validate(self) -> "ScriptCheckOptions":
        """The options as given, or ScriptCheckError naming the bad one (as the command spells it)."""
        ranks = world_sizes(self.ranks, "--ranks", error=ScriptCheckError) if self.ranks else ()  # () : world 1 alone
        positive_int(self.steps, "--steps", error=ScriptCheckError)
        timeout = self.timeout
        if timeout is not None and str(timeout).strip().lower() not in ("inf", "infinity"):
            timeout = number(timeout, "--timeout", "positive seconds", lambda v: v > 0, error=ScriptCheckError)
        else:
            timeout = None  # no limit
        epoch_steps = self.epoch_steps
        if epoch_steps is not None and not self.whole_run:
            raise ScriptCheckError("--epoch-steps needs --whole-run (without it check-script stops after --steps "
                                   "optimizer steps and has no epochs to cut)")
        if self.whole_run:
            epoch_steps = DEFAULT_EPOCH_STEPS if epoch_steps is None else epoch_steps
            positive_int(epoch_steps, "--epoch-steps", error=ScriptCheckError)
        return ScriptCheckOptions(ranks, self.steps, timeout, bool(self.whole_run), epoch_steps)

    @classmethod
    def of(cls, ranks, steps, timeout) -> "ScriptCheckOptions":
        """The API's options (`steps` an int, or WholeRun(epoch_steps=K)), validated."""
        if isinstance(steps, WholeRun):
            return cls(ranks, DEFAULT_STEPS, timeout, True, steps.epoch_steps).validate()
        return cls(ranks, steps, timeout).validate()

    @property
    def worlds(self) -> tuple[int, ...]:
        return tuple(sorted({1, *self.ranks}))


@dataclass
class Target:
    script: str | None = None      # a path, run as `python SCRIPT`
    module: str | None = None      # or a module, run as `python -m MODULE`
    args: tuple[str, ...] = ()

    def label(self) -> str:
        return f"-m {self.module}" if self.module else str(self.script)

    def validate(self, worlds=(1, 2, 3)) -> "Target":
        """The target as given, or ScriptCheckError: the script or module is there, and every ARGS
        expression evaluates at each of `worlds` (the world sizes the check will run)."""
        if self.module:
            import importlib.machinery
            import sys

            top = self.module.split(".")[0]
            # Found as `python -m` finds it, from the current folder first; only the top-level package
            # is looked up, so that nothing of it is imported in this process.
            found = top.isidentifier() and (top in sys.builtin_module_names or importlib.machinery.PathFinder.find_spec(
                top, [os.getcwd(), *sys.path[1:]]) is not None)
            if not found:
                raise ScriptCheckError(f"no module named {top!r} (from {os.getcwd()}: run check-script from the "
                                       "folder python -m finds it from)")
        else:
            if not self.script:
                raise ScriptCheckError("no script given: check-script SCRIPT [ARGS...] or -m MODULE [ARGS...]")
            if not os.path.exists(self.script):
                raise ScriptCheckError(f"script {self.script} not found")
            if os.path.isdir(self.script) and not os.path.exists(os.path.join(self.script, "__main__.py")):
                raise ScriptCheckError(f"{self.script} is a folder without __main__.py, not a script")
        for world in worlds:
            expand_args(self.args, world)
        return self


@dataclass(frozen=True)
class ScriptRankJob:
    """What every rank of one run is told (launch.py makes it, rank.py and recorder.py read it)."""

    script: str | None             # the script's absolute path, or None for a module
    module: str | None
    cwd: str                       # the launcher's working folder (the fork server's may be older)
    args: tuple[str, ...]          # ARGS with this world size's expressions evaluated
    steps: int                     # stop after this many steps of the first optimizer
    folder: str                    # where each rank writes its record and its stdout/stderr
    tag: str                       # this run's file names: "w2N-cpu-rank1.pt"
    perturb: float = 0.0           # run B's perturbation (PERTURB); 0 for every other run
    threads: int | None = None     # torch threads a rank (None: torch's default)
    env: tuple = ()                # (name, value) set in each rank before the script (value None: unset)
    exact_gpu_math: bool = False   # TF32 off, cuDNN deterministic (runs on GPUs)
    sync_batchnorm: bool = False   # BatchNorm as SyncBatchNorm computes it, at every world size (batchnorm.py)
    lift_precision: bool = False   # autocast and FSDP2's mixed precision lifted to float32 (precision.py)
    perturb_seed: int = 0          # which draw of run B's random signs (PERTURB_SEED_VARIABLE)
    trace_step: int = 0            # trace the forwards of this step (tracer.py; locate.py's second run), 0: none
    epoch_steps: int = 0           # --whole-run: cut each training epoch after this many steps (0: stop after `steps`)
    workdir: str = ""              # --whole-run: this run's own working folder (apart.py), "" : the launcher's cwd
    float64: bool = False          # the script computed in float64 (inrank/float64.py; confirm.py's runs)


# -- {world_size} in ARGS ------------------------------------------------------------------------------

_BRACES = re.compile(r"\{([^{}]*)\}")
_ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Load, ast.Add, ast.Sub, ast.Mult,
            ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Call)


def _evaluate(expr: str, world: int):
    tree = ast.parse(expr.strip(), mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ValueError(f"{type(node).__name__} is not allowed")
        if isinstance(node, ast.Name) and node.id not in ("world_size", "min", "max", "int", "round"):
            raise ValueError(f"unknown name {node.id!r}")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and not node.keywords):
            raise ValueError("only min, max, int, round may be called")
    names = {"world_size": world, "min": min, "max": max, "int": int, "round": round}
    value = eval(compile(tree, "<args>", "eval"), {"__builtins__": {}}, names)  # noqa: S307 - checked above
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value


def expand_args(args, world: int) -> list[str]:
    """Each `{expression of world_size}` in ARGS evaluated for this world size:
    `--batch-size={64 // world_size}` -> `--batch-size=32` at 2 ranks. Braces that do not mention
    world_size are left as they are (JSON, format strings); `{{` and `}}` are literal braces."""
    out = []
    for arg in args:
        def replace(m):
            expr = m.group(1)
            if "world_size" not in expr:
                return m.group(0)
            try:
                return str(_evaluate(expr, world))
            except (SyntaxError, ValueError, TypeError, ZeroDivisionError) as e:
                raise ScriptCheckError(f"cannot evaluate {{{expr}}} in argument {arg!r} at world size {world}: "
                                       f"{e} (use arithmetic on world_size, e.g. {{64 // world_size}})") from None
        text = arg.replace("{{", "\0").replace("}}", "\1")
        out.append(_BRACES.sub(replace, text).replace("\0", "{").replace("\1", "}"))
    return out


def batch_hint(args, script: str | None = None, module: str | None = None) -> str:
    """How to keep the global batch, in the script's own terms: the batch argument given in ARGS
    (`--flag N`, `--flag=N`, hydra's `key=N`: written back as an expression of world_size, `key=`
    kept), else the script's own batch options read from its source (scriptargs.py: argparse and
    click flags, HF's HfArgumentParser, a hydra config's keys), else a plain instruction to add one.
    It never names a flag the script does not have."""
    from mgpu.check.script.scriptargs import batch_options, script_source

    if any("world_size" in a for a in args):
        return "an ARGS expression of world_size that keeps the global batch (check the one given)"
    found = batch_options(script_source(script, module))
    own = {flag for flag, _ in found.flags}
    for i, a in enumerate(args):
        key, eq, value = a.partition("=")
        if "batch" in a.lower() or key in own:
            if not eq and i + 1 < len(args):
                value = args[i + 1]
            if value.isdigit():
                expr = f"{{{value} // world_size}}"
                return f'"{key}={expr}" in ARGS' if eq else f'{key} "{expr}" in ARGS'  # hydra's key=value keeps its =
    if found.flags:
        flag, default = found.flags[0]
        if default is not None:
            return f'{flag} "{{{default} // world_size}}" in ARGS (its default, {default}, as world 1\'s global batch)'
        return f'{flag} "{{64 // world_size}}" in ARGS, 64 being the global batch (one every world size divides)'
    if found.hydra:
        key, value = found.hydra_keys[0] if found.hydra_keys else ("<your config's batch-size key>", None)
        return (f'"{key}={{{value if value is not None else 64} // world_size}}" in ARGS (a hydra override, '
                "key=value)")
    if found.hf:
        return '--per_device_train_batch_size "{64 // world_size}" in ARGS (TrainingArguments), 64 the global batch'
    return ("a per-device batch size that keeps the global batch: the script takes no batch-size argument (none "
            "found among its command-line options): add one and give it in ARGS as an expression of world_size "
            "({64 // world_size} for a global batch of 64), or divide the global batch by the world size in the "
            "script")


# -- the runs ------------------------------------------------------------------------------------------

class PlannedRun(NamedTuple):
    world: int
    run: str            # "A" (world 1, the reference), "B" (world 1, perturbed: the spread) or "" (world > 1)
    device: str         # "cpu" or "cuda"
    lift: bool = False  # mixed precision lifted to float32 (precision.py)


def plan_runs(worlds: tuple[int, ...], gpus: int, lift: bool = False) -> list[PlannedRun]:
    """Every run: world 1 twice (A, B) on each device kind a comparison uses, then each world N.

    With `lift` (world 1's run A computed in a mixed precision that can be lifted: autocast, FSDP2's
    policy), the loop's arithmetic is compared at float32, A, B and each N lifted; and each N as run
    against A as run, whose spread is A lifted (the precision's own rounding): A, A lifted, B lifted,
    N lifted, N. Run A comes first either way: what it ran at decides the rest (check_with)."""
    kind = lambda n: "cuda" if gpus and n <= gpus else "cpu"  # noqa: E731
    others = [n for n in worlds if n > 1]
    kinds = sorted({kind(n) for n in others} or {kind(1)}, reverse=True)
    if not lift:
        plan = [PlannedRun(1, run, k) for k in kinds for run in ("A", "B")]
        return plan + [PlannedRun(n, "", kind(n)) for n in others]
    plan = [PlannedRun(1, "A", k) for k in kinds] + [PlannedRun(1, run, k, True) for k in kinds for run in ("A", "B")]
    return plan + [PlannedRun(n, "", kind(n), True) for n in others] + [PlannedRun(n, "", kind(n)) for n in others]


@dataclass(frozen=True)
class ScriptCheckPlan:
    """Everything the check decides before anything runs, handed to the run stage (launch.run_checked)
    and the judge. Run A goes first; what it computed at picks the rest: `plain` (B and each world N)
    when it ran at float32, `lifted` (plan_runs with lift) when it ran below. Every planned run's
    ScriptRankJob is here, its ARGS evaluated; only its folder, the run stage's temporary one, is left empty."""

    target: Target
    options: ScriptCheckOptions
    gpus: int
    first: tuple[PlannedRun, ...]
    plain: tuple[PlannedRun, ...]
    lifted: tuple[PlannedRun, ...]
    jobs: dict = field(default_factory=dict)   # PlannedRun -> ScriptRankJob
    batch_hint: str = ""                       # how to keep the global batch, in the script's own terms


def plan_check(target: Target, options: ScriptCheckOptions, gpus: int | None = None,
               cores: int | None = None) -> ScriptCheckPlan:
    """The check's plan for a target and validated options: the target validated at every world size
    (ScriptCheckError), the runs (plan_runs, both ways), each run's ScriptRankJob and the batch hint.
    `gpus` and `cores` default to this machine's (a rank of world N gets cores // N torch threads)."""
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count()
    if cores is None:
        from mgpu.devices import usable_cores

        cores = max(1, len(usable_cores()))
    target = target.validate(options.worlds)
    plain, lifted = plan_runs(options.worlds, gpus), plan_runs(options.worlds, gpus, lift=True)
    first = tuple(p for p in plain if p.run == "A")
    seed = int(os.environ.get(PERTURB_SEED_VARIABLE, "0") or 0)
    jobs = {p: _job(target, options, p, gpus, cores, seed) for p in (*plain, *lifted)}
    return ScriptCheckPlan(target, options, gpus, first, tuple(p for p in plain if p not in first),
                     tuple(p for p in lifted if p not in first), jobs,
                     batch_hint(target.args, target.script, target.module))


def _job(target: Target, options: ScriptCheckOptions, planned: PlannedRun, gpus: int, cores: int,
         seed: int) -> ScriptRankJob:
    world, run, device, lift = planned
    return ScriptRankJob(os.path.abspath(target.script) if target.script else None, target.module, os.getcwd(),
                   tuple(expand_args(target.args, world)), options.steps, "",
                   f"w{world}{run or 'N'}-{device}{'-lifted' if lift else ''}",
                   perturb=PERTURB if run == "B" else 0.0, threads=max(1, cores // world) if world > 1 else None,
                   env=(("CUDA_VISIBLE_DEVICES", ""),) if device == "cpu" and gpus else (),
                   exact_gpu_math=device == "cuda", sync_batchnorm=True, lift_precision=lift, perturb_seed=seed,
                   epoch_steps=options.epoch_steps or 0 if options.whole_run else 0)
