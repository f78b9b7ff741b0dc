"""The judge's side of random augmentation and of the script's other random numbers (the rank's side is
keyed.py and draws.py; docs/guide/check-script.md, "Random augmentation").

    facts = randomness_facts(records)        # merged over every rank of every run
    indices_agree(step_data)                 # True: the samplers gave world N world 1's examples
    not_keyed(facts)                         # ["collate_fn draws from torch's generator ...", ...]
    same_numbers(runs)                       # the same-random-numbers finding's text, or ''
    where_drawn(facts)                       # the randomness finding's sentences on where the draws are made

A map-style dataset's draws are keyed to the example (keyed.py), so a correct script with random
augmentation gives world N world 1's examples bitwise. Where the examples still differ, the indices each
sampler yielded tell why (causes/randomness.py words it): other indices are a sampler bug (FAILED, the
data named); the same indices with other contents are randomness the check could not key (NOT VERIFIED,
named with where it is drawn); no indices (no DataLoader) with draws in the training step are examples
drawn at random per rank (nanoGPT's get_batch: a choice, NOT VERIFIED).
"""

from __future__ import annotations

import collections

__all__ = ["randomness_facts", "indices_agree", "not_keyed", "same_numbers", "where_drawn", "keyed_note"]

_GENERATORS = {"torch": "torch's global generator", "numpy": "numpy's global generator (np.random)",
               "random": "Python's random"}


def randomness_facts(records) -> dict:
    """Every rank record's randomness evidence (RankRecord.randomness, set by the recorder), merged."""
    out = {"drawn": {}, "sites": [], "fetch_draws": [], "step": {}, "explicit": {}}
    for r in records:
        ev = r.randomness
        for gen, where in ev.get("drawn", {}).items():
            out["drawn"].setdefault(gen, where)
        out["sites"] += [s for s in ev.get("sites", []) if s not in out["sites"]]
        out["fetch_draws"] += [tuple(d) for d in ev.get("fetch_draws", []) if tuple(d) not in out["fetch_draws"]]
        for name, entry in ev.get("step", {}).items():
            if name not in out["step"] or entry["calls"] > out["step"][name]["calls"]:
                out["step"][name] = entry
        for name, where in ev.get("explicit", {}).items():
            out["explicit"].setdefault(name, where)
    return out


def indices_agree(sd) -> bool | None:
    """Whether world N's samplers yielded world 1's dataset indices at the step (as multisets, over every
    rank's batches); None where a side recorded none (no DataLoader over a map-style dataset)."""
    one, ranks = getattr(sd, "indices_1", None), getattr(sd, "indices_n", None)
    if not one or not ranks or any(not r for r in ranks):
        return None
    union = collections.Counter()
    for r in ranks:
        union.update(i for batch in r for i in batch)
    return union == collections.Counter(i for batch in one for i in batch)


def not_keyed(facts: dict, suspects: bool = True) -> list[str]:
    """The randomness that reaches the data and cannot be keyed to the example, each with where it is drawn;
    suspects=False: only draws seen made, not a generator the dataset holds or an IterableDataset (which
    explain data that differ, but are no randomness by themselves)."""
    out = []
    for site in facts.get("sites", []):
        kind, _, text = site.partition("\t")
        if kind in ("held", "iterable") and not suspects:
            continue
        if kind == "held":
            out.append(f"a generator object {text} (its draws follow the order examples are loaded in)")
        elif kind in ("generator", "collate", "iterable"):
            out.append(text)
    for name, entry in sorted(facts.get("step", {}).items()):
        module = f" in {entry['module']} (a module without parameters, outside the model)" if entry.get("module") else ""
        out.append(f"{name} in the training step at {entry['site']}{module}, {entry['calls']} call(s)")
    return out


def where_drawn(facts: dict, forward: str = "") -> list[str]:
    """The randomness finding's sentences: where the script draws random numbers, besides the forward."""
    out = [forward] if forward else []
    drawn = facts.get("drawn", {})
    if drawn:
        modules = sorted({f"{m} ({name})" for name, where, m in facts.get("fetch_draws", []) if where == "__getitem__"
                          and not m.endswith(")")})
        gens = ", ".join(_GENERATORS[g] for g in ("torch", "numpy", "random") if g in drawn)
        out.append(f"the Dataset's __getitem__ ({next(iter(drawn.values()))}) draws from {gens}"
                   + (f", in the transforms {', '.join(modules)}" if modules else "")
                   + ": keyed to the example by the check (index, epoch), at every world size")
    out += not_keyed(facts, suspects=False)
    return out


def keyed_note(facts: dict) -> str:
    """The note that says augmentation was keyed ('' where no __getitem__ drew)."""
    if not facts.get("drawn"):
        return ""
    return ("random augmentation: " + where_drawn(facts)[0] + ": the random numbers drawn for one example depend "
            "on its index and the epoch only, whoever loads it (docs/guide/check-script.md)")


# -- ranks that draw the same random numbers --------------------------------------------------------------

_OFFSET = ("give what must differ between ranks a per-rank offset, after what must agree is drawn: "
           "torch.manual_seed(seed + rank) after the model is built, keeping what must stay equal on its own "
           "generator seeded alike (a shuffle drawn from the global generator: a RandomSampler without a generator "
           "of its own, a DataLoader(shuffle=True); HF Trainer's seeding), not a plain seed + rank at the top")
_WORKERS = ("give each rank's DataLoader its own worker seeds: DataLoader(generator=torch.Generator()."
            "manual_seed(seed + rank)) (with a DistributedSampler, whose order comes from its own seed, this moves "
            "only the workers' seeds), or a worker_init_fn that adds the rank")


def _seeded(records, gen: str) -> str:
    calls = [[s for s in (r.randomness).get("seeds", []) if s["generator"] == gen]
             for r in records]
    if not calls[0]:
        return {"torch": "never seeded by the script: torch's default seed, the same in every process",
                "numpy": "never seeded by the script", "random": "never seeded by the script"}[gen]
    last = [c[-1] if c else None for c in calls]
    alike = all(x is not None and x["value"] == last[0]["value"] for x in last)
    head = {"torch": "torch.manual_seed", "numpy": "numpy.random.seed", "random": "random.seed"}[gen]
    return f"seeded {'alike on every rank' if alike else 'per rank'} by {head}({last[0]['value']}) at {last[0]['site']}"


def same_numbers(run) -> str:
    """The same-random-numbers finding's text for a world-N run (every rank's record), or ''."""
    records = run.ranks
    evs = [r.randomness for r in records]
    if len(records) < 2 or not all(evs):
        return ""

    def alike(key):
        states = [e.get("states", {}).get(key) for e in evs]
        return bool(states[0]) and all(s == states[0] for s in states)
    parts = []
    forward = {**evs[0].get("dropout", {}), **getattr(records[0], "random_draws", {})}
    if forward and alike("forward"):
        parts.append(f"torch's generator is in the same state on every rank at the first training forward, where the "
                     f"model draws ({', '.join(sorted(forward))}): every rank draws the same masks and noise for its "
                     f"examples ({_seeded(records, 'torch')}); {_OFFSET}")
    drawn = randomness_facts(records)["drawn"]
    passes = [e.get("passes", []) for e in evs]
    workers = passes[0] and passes[0][0]["workers"] > 0
    if drawn and workers:
        seeds = [p[0]["base_seed"] if p else None for p in passes]
        if seeds[0] is not None and all(s == seeds[0] for s in seeds):
            parts.append(f"the DataLoader's worker seeds are equal on every rank (base seed {seeds[0]}, drawn from the "
                         f"loader's generator or torch's; torch {_seeded(records, 'torch')}): worker k of every rank "
                         f"draws the same augmentation in {next(iter(drawn.values()))}; {_WORKERS}")
    elif drawn:
        for gen in ("torch", "numpy", "random"):
            if gen in drawn and alike(f"fetch-{gen}"):
                parts.append(f"{_GENERATORS[gen]} is in the same state on every rank when the Dataset's __getitem__ "
                             f"draws ({drawn[gen]}): example j of every rank's batch gets the same augmentation "
                             f"({_seeded(records, gen)}); {_OFFSET}")
    step = {k: e for k, e in evs[0].get("step", {}).items() if not e.get("own")}  # the global generator's
    if step and alike("step"):
        name, entry = sorted(step.items())[0]
        parts.append(f"every rank draws the same {name} in the training step ({entry['site']}): the generator is in "
                     f"the same state on every rank there ({_seeded(records, 'torch')}); {_OFFSET}")
    return "; and ".join(parts)
