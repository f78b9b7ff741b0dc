"""One round of the gate in both arms: which worker pair takes it and in which order, which clock
decides, and the requests to the workers (gate/arm.py) that set every worker up, agree on CUDA
graphs, take a round's samples and close them. gate/compare.py's loop decides how many rounds.

Two identical workers differ by a bias of their own (the process's memory layout and the like)
that no number of rounds removes; with several workers an arm the rounds go to the arms' worker
pairs in turn, two rounds each (round_pair, round_order), so the pairs' biases average out. One
arm works at a time while timing; only untimed work (set-up, a smoke run's samples) runs in every
worker at once (in_both).
"""

from __future__ import annotations

import statistics

from mgpu_perf.gate.arm import Arm, ArmError
from mgpu_perf.gate.health import RoundFacts, sample_facts

__all__ = ["round_order", "round_pair", "choose_clock", "sample_times", "in_both", "agree_on_graphs", "take_round",
           "close_workers"]

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
