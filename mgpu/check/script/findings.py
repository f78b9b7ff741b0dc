"""The findings of check-script: what every rank's record supports (dropout, random draws, BatchNorm per
rank, zero gradients, uninitialised memory, collectives without autograd, ranks that draw the same random
numbers), the note that augmentation was keyed, and the facts that explain a divergence (causes/facts.py).
The evidence is gathered first, then worded once: augment.py and causes/ say what it shows.

    found = findings_of(runs, compared)   # RecordFindings: findings, notes, facts, unkeyed, world_causes
"""

from __future__ import annotations

from dataclasses import dataclass

from mgpu.check.findings import Finding, ZeroGradientWords, zero_gradients_finding
from mgpu.check.script.augment import keyed_note, not_keyed, randomness_facts, same_numbers, where_drawn
from mgpu.check.script.causes.collectives import collective_finding, merged_collectives
from mgpu.check.script.causes.facts import ScriptFacts
from mgpu.check.script.causes.start import no_process_group, no_step, uninitialised_cause

__all__ = ["RecordFindings", "findings_of", "ZERO_GRADIENT_WORDS"]

ZERO_GRADIENT_WORDS = ZeroGradientWords("world 1 recorded", "step(s)", "passes any comparison of gradients, so this "
                                        "one checked little")


@dataclass(frozen=True)
class RecordFindings:
    """What the records show, before any comparison: the findings in the report's order, the notes they bring,
    the facts compare.py explains a divergence with, the randomness that reaches the data unkeyed (augment.not_keyed),
    and per world-N run compared (judge.compared_runs) what its start says: no optimizer step, or ranks that each
    trained alone (no process group); '' where neither."""

    findings: tuple
    notes: tuple
    facts: ScriptFacts
    unkeyed: tuple
    world_causes: tuple


def findings_of(runs: list, compared: list) -> RecordFindings:
    """The findings, from every rank's record: random-layers, randomness, batch-mixing, zero-gradients,
    uninitialised-memory, collective-without-autograd, same-random-numbers (`compared`: the world-N runs)."""
    dropout_calls, modules, draws, where, bn = {}, [], {}, {}, []
    for run in runs:
        for r in run.ranks:
            for k, v in r.dropout_calls.items():
                dropout_calls[k] = max(dropout_calls.get(k, 0), v)
            modules += [m for m in r.random_modules if m not in modules]
            for k, v in r.random_draws.items():
                draws[k] = max(draws.get(k, 0), v)
            for k, v in r.random_where.items():
                where.setdefault(k, v)
            bn += [m for m in r.batchnorm if m not in bn]
    layers, mixing = _random_layers(dropout_calls, modules), _batch_mixing(bn)
    zero = _zero_gradients(runs)
    # the evidence gathered, worded: augment.py (randomness), causes/start.py, causes/collectives.py
    records = [r for run in runs for r in run.ranks]
    randomness = randomness_facts(records)
    drawn = ""
    if draws or not_keyed(randomness, suspects=False):
        what = "; ".join(f"{k}: {v} call(s) in a run" + (f", first in {where[k]}" if k in where else "")
                         for k, v in sorted(draws.items()))
        forward = (f"the forward draws random numbers beyond dropout ({what})" if draws else "")
        drawn = (f"{'; '.join(where_drawn(randomness, forward))}: each rank draws its own for its shard, so world N "
                 "matches world 1 only where the draws do not matter; draw them from the input (the example), or "
                 "switch them off for the check")
    note, unkeyed = keyed_note(randomness), not_keyed(randomness)
    same = next((t for t in map(same_numbers, compared) if t), "")
    uninitialised = uninitialised_cause(records)
    world_causes = [no_process_group(r.ranks, r.world) if r.ranks[0].steps else no_step(r.world) for r in compared]
    collectives = merged_collectives(records)
    collective = collective_finding(collectives) if collectives else ""
    findings = [Finding(name, text) for name, text in (("random-layers", layers), ("randomness", drawn),
                                                       ("batch-mixing", mixing)) if text]
    findings += [zero] if zero is not None else []
    findings += [Finding(name, text) for name, text in (("uninitialised-memory", uninitialised),
                                                       ("collective-without-autograd", collective),
                                                       ("same-random-numbers", same)) if text]
    return RecordFindings(tuple(findings), (note,) if note else (), ScriptFacts(tuple(bn), draws, collectives, randomness),
                          tuple(unkeyed), tuple(world_causes))


def _random_layers(dropout_calls: dict, modules: list) -> str:
    if not dropout_calls and not modules:
        return ""
    parts = []
    if modules:
        parts.append(f"{len(modules)} module(s): {_listed(modules)}")
    parts += [f"{v} call(s) to {k} in a run" for k, v in sorted(dropout_calls.items())]
    return ("dropout and stochastic depth switched off in every process (DropoutOff, at the function level): "
            f"{'; '.join(parts)}. With them on, each rank draws the masks of its own examples: parity can then only "
            "be statistical")


def _batch_mixing(bn: list) -> str:
    if not bn:
        return ""
    return (f"BatchNorm without SyncBatchNorm: {_listed(bn)}: as the script is, each rank normalises over its own "
            "shard and world 1 over the whole batch, so its training depends on the world size. The comparison ran "
            "it synchronised over the ranks (SyncBatchNorm's statistics, put in by the check at every world size), so "
            "that the rest of the loop is checked; for training that does not depend on the world size convert with "
            "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) (CUDA), or use GroupNorm/LayerNorm")


def _zero_gradients(runs: list) -> Finding | None:
    """The zero-gradients finding, from world 1's first run (when it recorded steps)."""
    a = next((r for r in runs if r.world == 1 and r.run == "A" and r.failure is None and r.ranks), None)
    return zero_gradients_finding([rec.grads for rec in a.ranks[0].steps] if a is not None else [], ZERO_GRADIENT_WORDS)


def _listed(items: list, most: int = 6) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")
