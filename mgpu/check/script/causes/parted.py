"""Causes of the parted family (--whole-run at N ranks): a decision taken on one rank, which left the loop
or the script while the others wait in a collective. Evidence: the ranks' published states and the
watcher's decision (inrank/meeting.py), read by the launcher after the run ended (launch.py)."""

from __future__ import annotations

import json

from mgpu.check.script.inrank.meeting import DDP_ALL_REDUCE, parted, parted_path, read_states

__all__ = ["parted_failure", "parted_text"]


def parted_failure(folder: str, tag: str, world: int) -> tuple[int, str] | None:
    """(the rank that left, the words) from the watcher's decision file, or from the states the ranks left
    behind (a rank that failed on a lost peer before its watcher decided); None without evidence."""
    try:
        with open(parted_path(folder, tag)) as f:
            decided = json.load(f)
        return decided["left"], parted_text(decided, decided["states"])
    except (OSError, ValueError, KeyError):
        pass
    if world < 2:
        return None
    states = read_states(folder, tag, world)
    for me in range(world):
        evidence = parted(states, me)
        if evidence is not None:
            return evidence["left"], parted_text(evidence, states)
    return None


def _at(state: dict) -> str:
    epoch = state.get("epoch")
    where = f" (its last at {state['step_at']})" if state.get("step_at") else ""
    return (f"epoch {epoch}, " if epoch else "") + f"after optimizer step {state.get('step', 0)}{where}"


def _collective(inside: dict) -> str:
    op = inside["op"]
    name = op if op == DDP_ALL_REDUCE else f"dist.{op}"
    shape = f" of a tensor of shape {tuple(inside['shape'])}" if inside.get("shape") is not None else ""
    return f"{name}{shape} at {inside['where']} (its collective number {inside['seq']})"


def parted_text(evidence: dict, states: list) -> str:
    """'rank 0 left ... while rank 1 waits in ...: a decision taken on one rank; reduce it across ranks'."""
    left, waiting = states[evidence["left"]], states[evidence["waiting"]]
    r, w = evidence["left"], evidence["waiting"]
    if evidence["how"] == "ended":
        went = f"reached the end of the script after {left.get('seq', 0)} collective(s)"
    else:
        went = f"went on to {_collective(left['in'])}"
    others = [i for i, s in enumerate(states) if i != r and s and s.get("in") and s["in"]["seq"] == waiting["in"]["seq"]]
    who = f"rank {w}" if len(others) <= 1 else "ranks " + ", ".join(map(str, others))
    return (f"rank {r} left the others: at {_at(left)} it {went}, while {who} wait{'s' if len(others) <= 1 else ''} "
            f"in {_collective(waiting['in'])} (epoch {waiting['in'].get('epoch') or '-'}, after step "
            f"{waiting['in'].get('step', 0)}), which rank {r} never joins: a decision taken "
            f"on one rank (an early stop, a break or a return on rank {r}'s own loss, metric or data): reduce it "
            "across ranks so that every rank decides alike: all_reduce or broadcast the flag "
            "(stop = torch.tensor(float(flag)); dist.broadcast(stop, 0); if stop.item(): break)")
