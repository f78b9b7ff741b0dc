"""The run stage: the user's script at each world size, as torchrun would run it, and every rank's record.

Each run is one `mgpu.launch.spawn` (torch's elastic agent: RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; ranks forked from a fork server that has imported torch, so a rank
costs a fork, not an interpreter and an import of torch) of `rank.run_rank`, which runs the
script with runpy as `python SCRIPT` would. Every rank writes its record (a RankRecord) and its
stdout/stderr into one temporary folder, removed when the check ends (also on a crash or a timeout).
Which runs there are, and what each rank is told, is the plan's (plan.ScriptCheckPlan: world 1 twice, A and
its perturbed rerun B, then each world N; lifted to float32 as well where run A ran below it).
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace

from mgpu.check.script.inrank.records import RankRecord
from mgpu.errors import LaunchError
from mgpu.check.script.plan import (PERTURB, PERTURB_SEED_VARIABLE, ScriptCheckPlan, PlannedRun, ScriptCheckError,
                                   expand_args)

__all__ = ["WorldRun", "RankFailure", "run_worlds", "run_checked", "liftable", "PERTURB", "PERTURB_SEED_VARIABLE",
           "ScriptCheckError", "expand_args"]
# Lines of a failing rank's stderr shown.
TAIL_LINES = 8


@dataclass
class RankFailure:
    world: int
    rank: int | None
    kind: str                  # "crash", "timeout", "parted" (a rank left the others waiting: meeting.py)
    message: str
    tail: list[str] = field(default_factory=list)

    def describe(self) -> str:
        where = f"world {self.world}" + ("" if self.rank is None else f", rank {self.rank}")
        if self.kind == "parted":
            head = f"{where}: {self.message}"
        elif self.kind == "timeout":
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
    exits: list = field(default_factory=list)   # --whole-run: how each rank's script and process ended
    float64: bool = False      # the script computed in float64 (confirm.py)

    @property
    def name(self) -> str:
        return (f"world {self.world}" + {"A": "", "B": " (rerun)", "": ""}[self.run] +
                (" [float32, mixed precision lifted]" if self.lifted else "") + (" [float64]" if self.float64 else ""))


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


def run_world(plan: ScriptCheckPlan, planned: PlannedRun, folder: str, trace_step: int = 0,
              float64: bool = False) -> WorldRun:
    """One planned run (plan.PlannedRun), as its ScriptRankJob says: every rank spawned, its record loaded, or
    its failure. With trace_step k: up to step k, whose forwards are traced (locate.py). With float64: the
    script computed in float64 (confirm.py)."""
    import torch

    from mgpu.launch import spawn
    from mgpu.check.script.inrank.rank import run_rank

    job = replace(plan.jobs[planned], folder=folder)
    if trace_step:
        job = replace(job, steps=trace_step, trace_step=trace_step, tag=f"{job.tag}-t{trace_step}")
    if float64:
        job = replace(job, float64=True, tag=f"{job.tag}-f64")
    if plan.options.whole_run:  # each run in a working folder of its own (apart.py)
        from mgpu.check.script.apart import run_folder

        workdir, env = run_folder(folder, job.tag, job.cwd, job.args)
        job = replace(job, workdir=workdir, env=job.env + env)
    timeout = plan.options.timeout
    out = WorldRun(planned.world, planned.run, planned.device, list(job.args), lifted=planned.lift, float64=float64)
    started = time.time()
    try:
        spawn(run_rank, job, nprocs=planned.world, deadline_s=timeout)
    except LaunchError as e:
        out.failure = _failure(e, planned.world, folder, job.tag, timeout)
        if plan.options.whole_run:
            out.failure = _whole_run_failure(out, e, folder, job.tag)
    out.started, out.ended = started, time.time()
    out.seconds = out.ended - started
    if out.failure is None:
        for r in range(planned.world):
            path = os.path.join(folder, f"{job.tag}-rank{r}.pt")
            out.ranks.append(torch.load(path, weights_only=False))
        if plan.options.whole_run:
            out.exits = out.exits or [f"rank {r.rank}: the script {r.exit}; the process exited cleanly" for r in out.ranks]
    return out


def _whole_run_failure(out: WorldRun, e: LaunchError, folder: str, tag: str) -> RankFailure | None:
    """Under --whole-run, a failed spawn read again: a rank that left the others waiting (meeting.py's file,
    or its evidence in the ranks' states after a rank failed on a lost peer) is a "parted" failure; a
    rank that died after every rank's script had ended and saved its record (torch's gloo at interpreter
    exit: "terminate called without an active exception") is no failure: the run is judged on its records,
    and `out.exits` says how each rank exited."""
    from mgpu.check.script.causes.parted import parted_failure

    failure = out.failure
    if failure is not None and failure.kind == "timeout":
        return failure
    parted = parted_failure(folder, tag, out.world)
    if parted is not None:
        return RankFailure(out.world, parted[0], "parted", parted[1], [])
    # a rank saves its record only after its script has ended (rank.py)
    if all(os.path.exists(os.path.join(folder, f"{tag}-rank{r}.pt")) for r in range(out.world)):
        out.exits = [f"rank {r}: the script ended and its record was saved" for r in range(out.world)]
        out.exits.append(f"then {e.message or str(e).splitlines()[0]} (rank {e.rank}) as the processes exited: "
                         "after the script's end (with gloo, torch's own shutdown can end a process so: 'terminate "
                         "called without an active exception'); judged on what the ranks recorded")
        return None
    return failure


def run_worlds(plan: ScriptCheckPlan, runs: tuple[PlannedRun, ...], progress=None, parallel: int | None = None) -> list[WorldRun]:
    """The planned `runs`; `parallel` at a time (default: as many as the cores allow, one rank a core: one
    at a time on two cores, in this thread, where SIGTERM and Ctrl-C reach the agent), in one temporary
    folder that is removed afterwards. An error of a run other than its ranks' failure (which is the
    run's result) is raised here, after every started run has ended."""
    if parallel is None:
        parallel = 1 if plan.gpus else max(1, _cores() // 2)
    results: dict[tuple, WorldRun] = {}
    errors: list[BaseException] = []
    with tempfile.TemporaryDirectory(prefix="mgpu-script-") as folder:
        pending = list(runs)
        lock = threading.Lock()

        def worker():
            while True:
                with lock:
                    if not pending or errors:
                        return
                    planned = pending.pop(0)
                try:
                    result = run_world(plan, planned, folder)
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
    return [results[p] for p in runs if p in results]


def liftable(run: WorldRun) -> bool:
    """Run A computed below float32 (autocast, FSDP2's policy, a model cast whole), as its rank 0
    recorded (precision.PrecisionSeen): check-script then also runs it lifted to float32."""
    from mgpu.check.script.inrank.precision import LOW

    seen = run.ranks[0].precision if run.ranks else {}
    return seen.get("lowest") in LOW


def run_checked(plan: ScriptCheckPlan, progress=None) -> list[WorldRun]:
    """Every run the check needs, in rounds (_rounds): world 1's run A first (on each device kind), and what
    it ran at decides the rest (the plan's `plain` runs, or its `lifted` ones for a mixed precision)."""
    runs: list[WorldRun] = []
    for planned in _rounds(plan, runs):
        runs += run_worlds(plan, planned, progress)
    return runs


def _rounds(plan: ScriptCheckPlan, runs: list[WorldRun]):
    """The plan's rounds of runs, each read after the rounds before it have run (`runs`, as they grow): the
    first; then the rest, none where world 1 crashed or never stepped (the judge says so; nothing to compare)."""
    yield plan.first
    if not any(r.failure is not None or not r.ranks[0].steps for r in runs):
        yield plan.lifted if any(liftable(r) for r in runs) else plan.plain
