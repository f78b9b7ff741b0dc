"""One round of the gate in both arms: which worker pair takes it and in which order, which clock
decides, and the requests to the workers (gate/arm.py) that set every worker up, agree on CUDA
graphs and warm them up (set_up, one call), take a round's samples and close them. The round loop
(gate/loop.py) decides how many rounds.

    ready = set_up(pools, spec, settings)   # SetUp: the clock, operations a sample; or why the baseline cannot
    pair, times, facts = take_round(pools, i, workers, ready.ops, ready.clock, settings.smoke)

Two identical workers differ by a bias of their own (the process's memory layout and the like)
that no number of rounds removes; with several workers an arm the rounds go to the arms' worker
pairs in turn, two rounds each (round_pair, round_order), so the pairs' biases average out. One
arm works at a time while timing; only untimed work (set-up, a smoke run's samples) runs in every
worker at once (in_both).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from mgpu_perf.gate.arm import Arm, ArmError
from mgpu_perf.gate.health import RoundFacts, sample_facts
from mgpu_perf.gate.settings import Settings

__all__ = ["round_order", "round_pair", "choose_clock", "sample_times", "in_both", "agree_on_graphs", "SetUp",
           "set_up", "take_round", "close_workers"]

Pools = dict[str, list[Arm]]  # "baseline" and "candidate", each its workers


def round_order(i: int, workers: int = 1) -> tuple[str, str]:
    """Arms of round i (from 0): A B, B A, A B, ... so neither arm always runs first, and each arm
    runs twice in a row as often as the other (B B, then A A, ...). That matters: a worker timed
    right after its own previous sample is about 1 % faster (caches still warm).

    With several worker pairs (round_pair), each pair's two rounds are A B, B A on even turns and
    B A, A B on odd ones: A0 B0 B0 A0 | B1 A1 A1 B1 | ... A plain A B, B A for every pair would put
    the pairs' changes at A0 | A1, so only the candidate would ever run twice in a row."""
    flip = (i // 2) % 2 if workers > 1 else 0
    return ("baseline", "candidate") if (i + flip) % 2 == 0 else ("candidate", "baseline")


def round_pair(i: int, workers: int) -> int:
    """The worker pair of round i: two rounds each, in turn, so that every pair runs both orders and
    the pairs share the rounds evenly."""
    return (i // 2) % workers


def choose_clock(answers: list[dict]) -> tuple[str, str]:
    """Which time decides, from every worker's answer to a sample: the step's CUDA stream
    (`device_times`, CUDA events) when every worker of both arms timed it there, else host wall
    time, with the reason. Both arms must be timed by one clock, or the ratio compares two clocks."""
    notes = [a.get("clock_note") for a in answers if "device_times" not in a]
    if not notes:
        return "cuda-events", "every worker timed the step on its CUDA stream (host wall time beside it)"
    return "host", next((n for n in notes if n), "host wall time")


def sample_times(answer: dict, clock: str) -> tuple[float, float]:
    """(the deciding time, host time) of one sample: medians of its operations."""
    host = statistics.median(answer["times"])
    return (statistics.median(answer["device_times"]) if clock == "cuda-events" else host), host


def in_both(pools: Pools, command: str, **fields) -> dict[str, list[dict]]:
    """Every worker given works on one request at once (untimed work: setup; or a smoke run's
    samples, which nothing judges); each arm's answers in its workers' order. Every answer is read
    before the first error is raised, so that no worker is left with an unread reply."""
    workers = [(label, arm) for label, pool in pools.items() for arm in pool]
    for _, arm in workers:
        arm.send(command, **fields)
    answers, error = {label: [] for label in pools}, None
    for label, arm in workers:
        try:
            answers[label].append(arm.answer(command))
        except ArmError as e:
            error = error or e
    if error is not None:
        raise error
    return answers


def agree_on_graphs(pools: Pools, answers: dict[str, list[dict]]) -> dict:
    """CUDA-graph steps in every worker or in none: a worker whose step could not be captured
    keeps its plain step, and the others are told to drop their graphs, so both arms time one kind
    of step. Returns each arm's first answer (captured, and why not)."""
    states = {label: [a.get("graphs", {"captured": False, "why": "the worker did not say"}) for a in group]
              for label, group in answers.items()}
    captured = [s["captured"] for group in states.values() for s in group]
    if not any(captured) or all(captured):
        return {label: group[0] for label, group in states.items()}
    why = next(f"{label}: {s['why']}" for label, group in states.items() for s in group if not s["captured"])
    for label, pool in pools.items():
        for arm, state in zip(pool, states[label]):
            if state["captured"]:
                arm.request("graphs", enabled=False)
    return {label: {"captured": False, "why": f"dropped: {why}"} for label in states}


@dataclass(frozen=True)
class SetUp:
    """Every worker of both arms set up for one workload and warmed up (set_up), or why the baseline
    cannot run it (`lacking`: the benchmark is not comparable, and nothing else is set)."""
    lacking: str | None = None
    graphs: dict = field(default_factory=dict)  # per arm: CUDA graphs captured or not, and why not (agree_on_graphs)
    clock: str = "host"        # the deciding clock (choose_clock)
    clock_reason: str = ""
    ops: int = 1               # operations a sample, sized from the warm-up
    op_s: float = math.nan     # seconds an operation: each arm's fastest warm-up operation, averaged
    cpu_applies: bool = False  # the step runs in the workers' processes on the host clock (gate/health.py)


def set_up(pools: Pools, spec: dict, settings: Settings) -> SetUp:
    """Every worker sets the workload up at once, the arms agree on CUDA graphs and warm up. A
    workload the baseline cannot set up (an API the change added, a model file it lacks): `lacking`,
    each worker told to drop it; one the candidate cannot: ArmError. Where the graphs or the warm-up
    fail, every worker is closed (close_workers) before the error goes on."""
    answers = in_both(pools, "setup", spec=spec)  # starting rank pools and models: most of a smoke run
    lacking = _lacking_in_the_baseline(answers)
    if lacking is not None:
        for arm in (arm for pool in pools.values() for arm in pool):
            arm.request("close")
        return SetUp(lacking=lacking)
    try:
        graphs = agree_on_graphs(pools, answers)
        clock, clock_reason, ops, op_s = _warm_up(pools, settings)
    except BaseException:
        close_workers(pools)
        raise
    in_process = all(a.get("in_process") for group in answers.values() for a in group)
    return SetUp(None, graphs, clock, clock_reason, ops, op_s, cpu_applies=clock == "host" and in_process)


def _lacking_in_the_baseline(answers: dict[str, list[dict]]) -> str | None:
    """Why the baseline cannot set the workload up (None when it can); ArmError when the candidate cannot."""
    lacking = [a["not_comparable"] for a in answers["baseline"] if "not_comparable" in a]
    if lacking:
        return str(lacking[0])
    failed = [a["not_comparable"] for a in answers["candidate"] if "not_comparable" in a]
    if failed:
        raise ArmError(f"candidate: setup failed: {failed[0]}")
    return None


def _warm_up(pools: Pools, settings: Settings) -> tuple[str, str, int, float]:
    """(the deciding clock, why that clock, operations a sample, seconds an operation). Untimed, at
    least two each: the first operation of a worker pays one-off costs (on a GPU the CUDA context,
    cuDNN's first calls, the allocator's first blocks: 1 s against a 10-ms step), so the samples are
    sized by each arm's fastest warm-up operation. A smoke run takes one operation a sample and times
    nothing."""
    if settings.smoke:
        return "host", "a smoke run times nothing against anything", 1, math.nan
    warm = {label: [arm.request("sample", ops=1) for arm in pool for _ in range(max(settings.warmup, 2))]
            for label, pool in pools.items()}
    clock, reason = choose_clock([a for group in warm.values() for a in group])
    op_s = statistics.fmean(min(sample_times(a, clock)[0] for a in group) for group in warm.values())
    return clock, reason, max(1, round(settings.sample_s / max(op_s, 1e-6))), op_s


def take_round(pools: Pools, i: int, workers: int, ops: int, clock: str,
               smoke: bool) -> tuple[int, dict, dict | None]:
    """Round i: (its worker pair, {arm: (deciding time, host time)}, the round's facts for
    gate/health.py: which arm ran first, each sample's window and CPU), each arm's sample of `ops`
    operations. A smoke run checks that the workload runs in both arms: nothing is timed against
    anything, so both arms take their samples at once (and it has no facts)."""
    pair = round_pair(i, workers)
    if smoke:
        answers = in_both({label: [pool[pair]] for label, pool in pools.items()}, "sample", ops=ops)
        return pair, {label: sample_times(answer, clock) for label, (answer,) in answers.items()}, None
    order = round_order(i, workers)
    answers = {label: pools[label][pair].request("sample", ops=ops) for label in order}
    facts = RoundFacts(order[0], sample_facts(answers["baseline"]), sample_facts(answers["candidate"]))
    return pair, {label: sample_times(answers[label], clock) for label in order}, facts.to_dict()


def close_workers(pools: Pools) -> None:
    """Ask every live worker to drop its workload, each on its own: one that fails is killed, and
    the first error met before is the one reported."""
    for arm in (arm for pool in pools.values() for arm in pool):
        try:
            if arm.proc.poll() is None:
                arm.request("close")
        except ArmError:
            arm.kill()
