"""Run the user's script at each world size, as torchrun would, and collect every rank's record.

Each run is one `mgpu.launch.spawn` (torch's elastic agent: RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; ranks forked from a fork server that has imported torch, so a rank
costs a fork, not an interpreter and an import of torch) of `rank.run_rank`, which runs the
script with runpy as `python SCRIPT` would. Every rank writes its record and its stdout/stderr into
one temporary folder, removed when the check ends (also on a crash or a timeout).

World 1 runs twice on each kind of device the comparison uses: run A, plain, and run B, whose
gradients get a rounding-sized perturbation (compare.py: the tolerance), which also shows whether
the script is reproducible at all. On a machine with GPUs, a world size up to the GPU count runs on
the GPUs (the script picks its device, as under torchrun, with TF32 off and cuDNN deterministic);
a larger one runs on the CPU (CUDA_VISIBLE_DEVICES empty), and its world 1 with it.
"""

from __future__ import annotations

import ast
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field

from mgpu.errors import LaunchError, MgpuError

__all__ = ["Target", "WorldRun", "RankFailure", "ScriptCheckError", "expand_args", "run_worlds", "PERTURB"]

# Run B's gradients are perturbed by this times (|g| + rms(g)) per element, with random signs: a few
# float32 roundings, the size of the difference another summation order makes (compare.py).
PERTURB = 2.0 ** -22
# Lines of a failing rank's stderr shown.
TAIL_LINES = 8


class ScriptCheckError(MgpuError, ValueError):
    """The script cannot be checked as given: missing, bad ARGS expression, no optimizer step, ..."""


@dataclass
class Target:
    script: str | None = None      # a path, run as `python SCRIPT`
    module: str | None = None      # or a module, run as `python -m MODULE`
    args: tuple[str, ...] = ()

    def label(self) -> str:
        return f"-m {self.module}" if self.module else str(self.script)

    def validate(self) -> "Target":
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
        for world in (1, 2, 3):
            expand_args(self.args, world)
        return self


@dataclass
class RankFailure:
    world: int
    rank: int | None
    kind: str                  # "crash", "timeout"
    message: str
    tail: list[str] = field(default_factory=list)

    def describe(self) -> str:
        where = f"world {self.world}" + ("" if self.rank is None else f", rank {self.rank}")
        if self.kind == "timeout":
            head = f"{where}: the script did not reach its last recorded step within the timeout ({self.message}): a hang?"
        else:
            head = f"{where}: the script failed: {self.message}"
        return head + "".join(f"\n    | {line}" for line in self.tail)


@dataclass
class WorldRun:
    world: int
    run: str                   # "A", "B" (world 1's perturbed rerun) or "" (world > 1)
    device: str                # "cpu" or "cuda"
    args: list[str]
    ranks: list[dict] = field(default_factory=list)   # each rank's record (recorder.Recorder.result)
    failure: RankFailure | None = None
    seconds: float = 0.0
    started: float = 0.0       # time.time() at the spawn, and when it returned
    ended: float = 0.0

    @property
    def name(self) -> str:
        return f"world {self.world}" + {"A": "", "B": " (rerun)", "": ""}[self.run]


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


# -- running -------------------------------------------------------------------------------------------

def _cores() -> int:
    from mgpu.devices import usable_cores

    return max(1, len(usable_cores()))


def _tail(folder: str, tag: str, rank: int | None, stream: str = "err") -> list[str]:
    ranks = [rank] if rank is not None else [0]
    for r in ranks:
        path = os.path.join(folder, f"{tag}-rank{r}.{stream}")
        try:
            with open(path, errors="replace") as f:
                lines = [line.rstrip() for line in f.read().splitlines() if line.strip()]
        except OSError:
            continue
        return lines[-TAIL_LINES:]
    return []


def _failure(e: LaunchError, world: int, folder: str, tag: str, timeout: float | None) -> RankFailure:
    text = str(e)
    rank = getattr(e, "rank", None)
    if rank is None:
        m = re.match(r"rank (\d+) failed", text)
        rank = int(m.group(1)) if m else None
    kind = getattr(e, "kind", None)
    if kind == "deadline" or "deadline" in text.split("\n", 1)[0]:
        tail = _tail(folder, tag, 0, "err") or _tail(folder, tag, 0, "out")
        return RankFailure(world, None, "timeout", f"--timeout {timeout:g} s; every rank stopped", tail)
    first = text.split("\n", 1)[0]
    first = re.sub(r"^rank \d+ failed: ", "", first)
    tail = _tail(folder, tag, rank) or [line for line in text.splitlines()[1:] if line.strip()][-TAIL_LINES:]
    return RankFailure(world, rank, "crash", first, tail)


def run_world(target: Target, world: int, run: str, device: str, steps: int, folder: str,
              timeout: float | None, gpus: int) -> WorldRun:
    import torch

    from mgpu.launch import spawn
    from mgpu.scriptcheck.rank import run_rank

    tag = f"w{world}{run or 'N'}-{device}"
    args = expand_args(target.args, world)
    env = {"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" and gpus else {}
    cfg = {"script": os.path.abspath(target.script) if target.script else None, "module": target.module,
           "cwd": os.getcwd(),
           "args": args, "steps": steps, "folder": folder, "tag": tag, "perturb": PERTURB if run == "B" else 0.0,
           "threads": max(1, _cores() // world) if world > 1 else None, "env": env,
           "exact_gpu_math": device == "cuda", "sync_batchnorm": world > 1}
    out = WorldRun(world, run, device, args)
    started = time.time()
    try:
        spawn(run_rank, cfg, nprocs=world, deadline_s=timeout)
    except LaunchError as e:
        out.failure = _failure(e, world, folder, tag, timeout)
    out.started, out.ended = started, time.time()
    out.seconds = out.ended - started
    if out.failure is None:
        for r in range(world):
            path = os.path.join(folder, f"{tag}-rank{r}.pt")
            out.ranks.append(torch.load(path, weights_only=False))
    return out


def plan_runs(worlds: tuple[int, ...], gpus: int) -> list[tuple[int, str, str]]:
    """(world, run, device) of every run: world 1 twice (A, B) on each device kind a comparison uses."""
    kind = lambda n: "cuda" if gpus and n <= gpus else "cpu"  # noqa: E731
    others = [n for n in worlds if n > 1]
    kinds = sorted({kind(n) for n in others} or {kind(1)}, reverse=True)
    plan = [(1, run, k) for k in kinds for run in ("A", "B")]
    return plan + [(n, "", kind(n)) for n in others]


def run_worlds(target: Target, worlds: tuple[int, ...], steps: int, timeout: float | None,
               progress=None, parallel: int | None = None) -> list[WorldRun]:
    """Every run of the plan; `parallel` runs at a time (default: as many as the cores allow, one
    rank a core), in one temporary folder that is removed afterwards."""
    import torch

    gpus = torch.cuda.device_count()
    plan = plan_runs(worlds, gpus)
    if parallel is None:
        parallel = 1 if gpus else max(1, _cores() // 2)
    results: dict[tuple, WorldRun] = {}
    with tempfile.TemporaryDirectory(prefix="mgpu-script-") as folder:
        pending = list(plan)
        lock = threading.Lock()

        def worker():
            while True:
                with lock:
                    if not pending:
                        return
                    world, run, device = pending.pop(0)
                result = run_world(target, world, run, device, steps, folder, timeout, gpus)
                with lock:
                    results[(world, run, device)] = result
                    if run == "A" and result.failure is None and not result.ranks[0]["records"]:
                        pending.clear()  # no optimizer step at world 1: nothing to compare (the caller says so)
                if progress:
                    progress(result)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, parallel) - 1)]
        for t in threads:
            t.start()
        worker()
        for t in threads:
            t.join()
    return [results[p] for p in plan if p in results]
