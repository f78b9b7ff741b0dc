"""The run stage: the user's script at each world size, as torchrun would run it, and every rank's record.

Each run is one `mgpu.launch.spawn` (torch's elastic agent: RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; ranks forked from a fork server that has imported torch, so a rank
costs a fork, not an interpreter and an import of torch) of `rank.run_rank`, which runs the
script with runpy as `python SCRIPT` would. Every rank writes its record (a RankRecord) and its
stdout/stderr into one temporary folder, removed when the check ends (also on a crash or a timeout).
Which runs there are is the plan's (plan.py: world 1 twice, A and its perturbed rerun B).
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field

from mgpu.check.records import RankRecord
from mgpu.errors import LaunchError
from mgpu.scriptcheck.plan import (PlannedRun, RankJob, ScriptCheckError, ScriptCheckOptions, Target, expand_args,
                                   plan_runs)

__all__ = ["WorldRun", "RankFailure", "run_worlds", "run_checked", "liftable", "PERTURB", "ScriptCheckError", "expand_args"]

# Run B's gradients are perturbed by this times (|g| + rms(g)) per element, with random signs: a few
# float32 roundings, the size of the difference another summation order makes (compare.py).
PERTURB = 2.0 ** -22
# Run B's random signs are one fixed draw, so that a check gives one verdict on one machine; this
# variable picks another draw (docs/notes/measure/repeat_checks.py counts false alarms over draws).
PERTURB_SEED_VARIABLE = "MGPU_CHECK_PERTURB_SEED"
# Lines of a failing rank's stderr shown.
TAIL_LINES = 8


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
    lifted: bool = False       # mixed precision lifted to float32 (precision.py)
    ranks: list[RankRecord] = field(default_factory=list)   # each rank's record, rank 0 first
    failure: RankFailure | None = None
    seconds: float = 0.0
    started: float = 0.0       # time.time() at the spawn, and when it returned
    ended: float = 0.0

    @property
    def name(self) -> str:
        return (f"world {self.world}" + {"A": "", "B": " (rerun)", "": ""}[self.run] +
                (" [float32, mixed precision lifted]" if self.lifted else ""))


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


def run_world(target: Target, planned: PlannedRun, options: ScriptCheckOptions, folder: str,
              gpus: int, trace_step: int = 0) -> WorldRun:
    """One planned run (plan.PlannedRun): every rank spawned, its record loaded, or its failure.
    With trace_step k: up to step k, whose forwards are traced (locate.py)."""
    import torch

    from mgpu.launch import spawn
    from mgpu.scriptcheck.rank import run_rank

    world, run, device, lift = planned
    timeout = options.timeout
    tag = f"w{world}{run or 'N'}-{device}{'-lifted' if lift else ''}{f'-t{trace_step}' if trace_step else ''}"
    args = expand_args(target.args, world)
    env = (("CUDA_VISIBLE_DEVICES", ""),) if device == "cpu" and gpus else ()
    job = RankJob(os.path.abspath(target.script) if target.script else None, target.module, os.getcwd(), tuple(args),
                  trace_step or options.steps, folder, tag, perturb=PERTURB if run == "B" else 0.0,
                  threads=max(1, _cores() // world) if world > 1 else None, env=env,
                  exact_gpu_math=device == "cuda", sync_batchnorm=True, lift_precision=lift,
                  perturb_seed=int(os.environ.get(PERTURB_SEED_VARIABLE, "0") or 0),
                  trace_step=trace_step)
    out = WorldRun(world, run, device, args, lifted=lift)
    started = time.time()
    try:
        spawn(run_rank, job, nprocs=world, deadline_s=timeout)
    except LaunchError as e:
        out.failure = _failure(e, world, folder, tag, timeout)
    out.started, out.ended = started, time.time()
    out.seconds = out.ended - started
    if out.failure is None:
        for r in range(world):
            path = os.path.join(folder, f"{tag}-rank{r}.pt")
            out.ranks.append(torch.load(path, weights_only=False))
    return out


def run_worlds(target: Target, options: ScriptCheckOptions, progress=None, parallel: int | None = None,
               plan: list[PlannedRun] | None = None) -> list[WorldRun]:
    """Every run of the plan (default: plan.plan_runs's); `parallel` runs at a time (default: as many as the cores allow, one
    rank a core: one at a time on two cores, in this thread, where SIGTERM and Ctrl-C reach the
    agent), in one temporary folder that is removed afterwards. An error of a run other than its
    ranks' failure (which is the run's result) is raised here, after every started run has ended."""
    import torch

    gpus = torch.cuda.device_count()
    plan = plan_runs(options.worlds, gpus) if plan is None else plan
    if parallel is None:
        parallel = 1 if gpus else max(1, _cores() // 2)
    results: dict[tuple, WorldRun] = {}
    errors: list[BaseException] = []
    with tempfile.TemporaryDirectory(prefix="mgpu-script-") as folder:
        pending = list(plan)
        lock = threading.Lock()

        def worker():
            while True:
                with lock:
                    if not pending or errors:
                        return
                    planned = pending.pop(0)
                try:
                    result = run_world(target, planned, options, folder, gpus)
                except BaseException as e:  # noqa: BLE001 - raised by the caller below, not lost in a thread
                    with lock:
                        errors.append(e)
                    return
                with lock:
                    results[planned] = result
                    if result.run == "A" and result.failure is None and not result.ranks[0].steps:
                        pending.clear()  # no optimizer step at world 1: nothing to compare (the caller says so)
                if progress:
                    progress(result)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, parallel) - 1)]
        for t in threads:
            t.start()
        worker()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return [results[p] for p in plan if p in results]


def liftable(run: WorldRun) -> bool:
    """Run A computed below float32 (autocast, FSDP2's policy, a model cast whole), as its rank 0
    recorded (precision.PrecisionSeen): check-script then also runs it lifted to float32."""
    from mgpu.scriptcheck.precision import LOW

    seen = run.ranks[0].precision if run.ranks else {}
    return seen.get("lowest") in LOW


def run_checked(target: Target, options: ScriptCheckOptions, progress=None) -> list[WorldRun]:
    """Every run the check needs: world 1's run A first (on each device kind), and what it ran at
    decides the rest (plan.plan_runs: a mixed precision that can be lifted adds the lifted runs)."""
    import torch

    gpus = torch.cuda.device_count()
    first = [p for p in plan_runs(options.worlds, gpus) if p.run == "A"]
    runs = run_worlds(target, options, progress, plan=first)
    if any(r.failure is not None or not r.ranks[0].steps for r in runs):
        return runs  # world 1 crashed or never stepped: the judge says so; nothing to compare it with
    lift = any(liftable(r) for r in runs)
    rest = [p for p in plan_runs(options.worlds, gpus, lift) if p not in first]
    return runs + run_worlds(target, options, progress, plan=rest)
