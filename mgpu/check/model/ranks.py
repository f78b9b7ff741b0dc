"""The rank runs of a check: ddp and fsdp, each rank a process of its own.

    runs = RankRuns({2: ModelRankJob(("ddp", "fsdp"), ...)}, options, say)   # the spawns start in a thread
    per_plan = runs.get("ddp", 2)       # [plan][rank] recordings, or why the run crashed (a string)
    rec = rank_recording(per_plan[0])   # one Recording whose replicas are the ranks

One spawn per world size runs every rank strategy of the check on it (`rank_main` in each rank,
`ModelRankJob` says what). Each rank builds the model from a seed of its own, rank 0 loads the weights
the check built, and the strategy must make them equal. After each plan, rank 0 gathers every
rank's recording: a rank leaves out what its state digests show to be bitwise rank 0's
(`_send_only_differences`), and rank 0 fills it back in (`_fill_from_rank_0`).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
import threading
from dataclasses import dataclass, replace

from mgpu.config import CheckOptions
from mgpu.devices import set_exact_gpu_math
from mgpu.errors import CheckTimeout, LaunchError, SpecError
from mgpu.check.model.plans import COMPILING_COLLECTIVE_S, label, make_optimizer, strategy_for
from mgpu.check.model.probe import switch_off_dropout
from mgpu.check.model.record import (LocalShard, Recording, assemble_shards, has_shards, load_snapshot, record_strategy,
                                state_digest)
from mgpu.spec import ModelSpec, load_spec

__all__ = ["ModelRankJob", "RankRuns", "rank_main", "rank_recording", "spec_blob"]

# Errors a rank raises that the check raises again, as they are: bad input, and a model that hangs.
_RAISED_AGAIN = {cls.__name__: cls for cls in (CheckTimeout, SpecError)}


@dataclass
class ModelRankJob:
    """What each rank of the ddp and fsdp checks on one world size runs (picklable: the ranks are
    fresh processes). The strategies run one after the other in one spawn, on one process group:
    starting processes and loading the model's libraries is a large share of a rank run."""

    strategies: tuple          # ddp, fsdp
    source: str | None
    spec_options: dict
    spec_blob: bytes | None
    initial: dict              # rank 0's weights and buffers (other ranks build their own from other seeds)
    plans: list
    options: CheckOptions
    find_unused: bool
    dropout_calls: bool = False    # the forward calls torch's dropout functions itself: hold them off too
    compile_peers: str | None = None  # --compile: the folder where the ranks tell each other how long they compiled

    def spec(self) -> ModelSpec:
        if self.spec_blob is not None:
            return pickle.loads(self.spec_blob)
        return load_spec(self.source, **self.spec_options)


def spec_blob(spec: ModelSpec) -> tuple[bytes | None, str | None]:
    """(the pickled spec, None) or (None, why it cannot travel) when it has no source to load from."""
    if spec.source:
        return None, None
    try:
        return pickle.dumps(spec), None
    except Exception as e:
        return None, (f"the spec cannot be sent to DDP ranks ({type(e).__name__}: {e}): give it as MODULE:FUNCTION "
                      "or build it from module-level functions")


# -- in each rank ---------------------------------------------------------------------------------------

def rank_main(job: ModelRankJob):
    """In each rank: the plans under each strategy of the job; rank 0 returns every rank's
    recordings, {strategy: [plan][rank]} (pickled)."""
    set_exact_gpu_math()  # as run_check has it in the launching process
    spec = job.spec()
    world = int(os.environ["WORLD_SIZE"])
    out, strategy = {}, None
    try:
        for name in job.strategies:
            # The strategies share the process group: the second one's create() finds it set up.
            strategy = strategy_for(name, world, job.options, find_unused=job.find_unused)
            out[name] = _rank_plans(job, spec, strategy)
        # Bytes, not tensors: torch's multiprocessing would pass each tensor as a file descriptor to
        # the launcher, and a model of a few hundred tensors runs out of them.
        return pickle.dumps(out) if strategy.rank == 0 else None
    finally:
        if strategy is not None:
            strategy.teardown()


def _rank_plans(job: ModelRankJob, spec: ModelSpec, strategy) -> list | None:
    """Every plan under one strategy; on rank 0, [plan][rank] recordings."""
    import torch.distributed as dist

    rank, world = strategy.rank, strategy.world_size
    out = []
    for plan in job.plans:
        model = spec.build_seeded(job.options.seed + 7919 * rank)  # ranks start apart: the strategy must make them equal
        switch_off_dropout(model, calls=job.dropout_calls)
        if rank == 0:
            load_snapshot(model, job.initial)
        strategy.use_objective(spec.objective)
        strategy.setup(model, make_optimizer(job.options, spec))
        rec = record_strategy(strategy, spec, plan, label=f"{label(strategy.name, world)} (rank {rank})",
                              timeout_s=job.options.step_timeout, keep_shards=True, peers=job.compile_peers)
        _send_only_differences(rec, rank, world)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(rec, gathered, dst=0)  # to rank 0 only: every rank's copy of all would cost memory
        if rank == 0:
            _fill_from_rank_0(gathered)
        out.append(gathered)
    return out


def _send_only_differences(rec: Recording, rank: int, world: int) -> None:
    """Before rank 0 gathers the recordings: an entry of a state of rank r > 0 that is bitwise rank 0's
    (what a correct strategy gives at every step) is left out (None) when the digests of the two
    states say so; so is the optimizer state, of which only rank 0's is compared (under fsdp the
    other ranks send their shards of it). A model's state is then sent and pickled once, not once
    per rank: for a 5 M-parameter model that was most of a rank run's time. Shards (LocalShard) are
    always sent: rank 0 puts them together."""
    import torch.distributed as dist

    digests = [state_digest(_unsharded(state[0])) for state in rec.states]
    everyone = [None] * world
    dist.all_gather_object(everyone, digests)
    if rank > 0:
        rec.states = [[{k: v if isinstance(v, LocalShard) else None for k, v in state[0].items()}] if mine == first
                      else state for mine, first, state in zip(digests, everyone[0], rec.states)]
        if not any(has_shards(o) for o in rec.optimizer_states):
            rec.optimizer_states = []


def _unsharded(state: dict) -> dict:
    return {k: v for k, v in state.items() if not isinstance(v, LocalShard)}


def _fill_from_rank_0(per_rank: list) -> None:
    """On rank 0, after the gather: rank 0's entries where the other ranks left them out as equal,
    and every sharded tensor whole (assemble_shards), in states, gradients and rank 0's optimizer states."""
    first = per_rank[0]
    for rec in per_rank[1:]:
        rec.states = [[{k: first.states[s][0][k] if v is None else v for k, v in state[0].items()}]
                      for s, state in enumerate(rec.states)]
    for s in range(len(first.states)):
        for rec, whole in zip(per_rank, assemble_shards([rec.states[s][0] for rec in per_rank])):
            rec.states[s] = [whole]
    for rec, whole in zip(per_rank, assemble_shards([rec.grads[0] for rec in per_rank])):
        rec.grads = [whole]
    if any(has_shards(o) for o in first.optimizer_states):
        first.optimizer_states = [assemble_shards([rec.optimizer_states[s] for rec in per_rank])[0]
                                  for s in range(len(first.optimizer_states))]


def rank_recording(per_rank: list[Recording]) -> Recording:
    """One Recording whose replicas are the ranks."""
    first = per_rank[0]
    return Recording(states=[[rec.states[s][0] for rec in per_rank] for s in range(len(first.states))],
                     grads=[rec.grads[0] for rec in per_rank], optimizer_states=first.optimizer_states, stats=first.stats,
                     ties=[rec.ties[0] for rec in per_rank], shards=first.shards * len(per_rank))


# -- in the launching process ---------------------------------------------------------------------------

class RankRuns:
    """The ddp and fsdp runs of a check: one spawn per world size, both strategies in it, started at
    once in a thread of their own. Meanwhile the launching process (one thread: run_check) makes the
    in-process runs and computes the references, rather than wait with a core idle while the ranks
    start and load the model's libraries. A check that ends early (Ctrl-C, a hanging model in this
    process) does not wait for the thread: it is a daemon, its spawn ends at its deadline, and the
    ranks die with this process (mgpu.launch)."""

    def __init__(self, jobs: dict, options: CheckOptions, say):
        self.options, self.say, self.results = options, say, {}
        self.thread = threading.Thread(target=self._run_all, args=(jobs,), name="mgpu-check-ranks", daemon=True)
        self.done = {n: threading.Event() for n in jobs}
        self.thread.start()

    def _run_all(self, jobs: dict) -> None:
        for n, job in jobs.items():
            try:
                self.results[n] = self._run(job, n)
            except BaseException as e:  # CheckTimeout, SpecError, ...: raised where the results are read
                self.results[n] = e
            finally:
                self.done[n].set()

    def _run(self, job: ModelRankJob, n: int) -> dict:
        """{strategy: [plan][rank] recordings, or why its run crashed}. When the joint spawn fails, each
        strategy is spawned alone again, so that the crash is told to the strategy that made it."""
        self.say(f"check: {' and '.join(label(s, n) for s in job.strategies)}: starting {n} ranks")
        try:
            return _spawn_ranks(job, n, self.options)
        except LaunchError as e:
            if len(job.strategies) == 1:
                return {job.strategies[0]: f"the run crashed: {str(e).splitlines()[0]}"}
        out = {}
        for name in job.strategies:
            out.update(self._run(replace(job, strategies=(name,)), n))
        return out

    def ready(self, n: int) -> bool:
        return self.done[n].is_set()

    def get(self, name: str, n: int):
        self.done[n].wait()
        result = self.results[n]
        if isinstance(result, BaseException):
            raise result
        return result[name]


def _spawn_ranks(job: ModelRankJob, n: int, options: CheckOptions):
    from mgpu.launch import spawn

    steps = sum(p.steps + 1 for p in job.plans) * len(job.strategies)
    deadline = None if options.step_timeout is None else \
        60.0 + steps * options.step_timeout + (COMPILING_COLLECTIVE_S if options.compile else 0.0)
    try:
        with tempfile.TemporaryDirectory(prefix="mgpu-compiles-") if options.compile else contextlib.nullcontext() as peers:
            return pickle.loads(spawn(rank_main, replace(job, compile_peers=peers), nprocs=n,
                                      deadline_s=deadline))
    except LaunchError as e:
        if e.kind in _RAISED_AGAIN:  # a rank's bad input or hanging model: the check's own error, not a crash
            raise _RAISED_AGAIN[e.kind](e.message) from None
        raise
