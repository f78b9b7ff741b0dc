"""Under --whole-run: the script's evaluation at world N against world 1: which examples each evaluation pass
covered (coverage), the figures rank 0 reported, and the evidence behind a figure that differs.

    coverage_of(run_n, run_1)              # [Coverage(made_at="train.py:40", number=1, duplicates=1, ...)]
    figure_evidence(row, run_n, run_1, covered)   # ("mean-of-means", {...}) or None
    judge_evaluation(runs, by_kind, comparisons, findings)   # EvaluationJudgement: problems, notes, json

**Coverage.** An evaluation pass is a DataLoader pass that fed no optimizer step; the passes a rank makes between
two training epochs are one evaluation (a main pass and an auxiliary one over the tail; a loader line passed
over again begins the next: `evaluations`), matched across runs by the training epochs begun before it. Its
examples are the digests of each example's input (else, where world 1's inputs repeat, the sampler's indices,
through Subsets). At world N, each loader line's passes over the ranks count once where every rank that ran it
saw the same examples (rank 0 alone; the same tail on every rank), else every rank's; together they are
counted against world 1's: repeated examples (a DistributedSampler's padding, accelerate's even_batches)
and world 1's examples no rank evaluated (drop_last, an uneven split). A rank that evaluated world 1's whole
set (rank 0 alone, or every rank the whole set) is no coverage problem; repeats dropped by accelerate's
gather_for_metrics (called in the evaluation) are not either; nor, reported as a note, repeats that no figure rank 0 printed shows
where rank 0 gathered in the evaluation (every figure printed from it alike at world 1 and N, no example
left out, an all_gather or gather called: the predictions collected and the padding cut off, as a script's
own gather-and-truncate does). An evaluation world 1 itself repeats examples in (a sampler
drawing with replacement) or with a pass a rank left early (a fixed number of batches) is not counted; one
whose sampler shuffles and stops short of its dataset (random evaluation batches, drawn per rank) is counted
and said, not judged: it has no set to cover.

**A figure's evidence** (only for a figure that differs from world 1's while world 1 and its rerun agree): the
last DataLoader pass rank 0 fetched from before the line must be an evaluation pass P; the collectives rank 0
called between P's first batch and the line (`CollectiveSeen`, matched across ranks by their count) are the
window (a line after training batches is no evaluation's figure: rank 0's own batches, noted once). In this order: P's coverage problem; a tensor reduced more than once in the window; a reduction
whose per-rank values' plain mean is the figure while the ranks' shard sizes differ (a mean of means; the
mean weighted by the shard sizes is what world 1 computes); a SUM whose total is the figure, about N times
world 1's (a sum of means); rank 0's shard smaller than world 1's set with no collective in the window. A
figure of a random sample drawn per rank is not compared.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from mgpu.check.script.figures import FigureRow, figures_of, line_up, unmeasured

__all__ = ["Coverage", "EvaluationJudgement", "coverage_of", "figure_evidence", "judge_evaluation", "eval_passes",
           "keyed_passes"]


@dataclass(frozen=True)
class Coverage:
    """One evaluation pass's examples at world N against world 1's (the module docstring's counts)."""

    made_at: str
    number: int
    world: int
    reference: int            # distinct examples world 1 evaluated
    dataset: int | None       # len(dataset)
    seen: int                 # examples evaluated at world N, all ranks, repeats counted
    distinct: int
    missing: int              # of world 1's, evaluated by no rank at world N
    shards: tuple             # examples per rank (0: the rank ran no such pass)
    gathered: bool            # accelerate's gather_for_metrics called in the pass (its padding dropped)
    by: str                   # "sampler indices" | "input digests"
    whole_on_a_rank: bool = False   # a rank evaluated world 1's whole set
    keys: tuple = ()          # rank 0's passes in it at world N: (the loader's line, k-th evaluation pass from it)
    sampled: bool = False     # a random sample of the set (a shuffling sampler short of the dataset): not judged

    @property
    def duplicates(self) -> int:
        return self.seen - self.distinct

    @property
    def problem(self) -> bool:
        return not self.whole_on_a_rank and not self.sampled and (self.missing > 0 or (self.duplicates > 0 and not self.gathered))

    def to_json(self) -> dict:
        return {"loader": self.made_at, "evaluation": self.number, "world": self.world, "world_1": self.reference,
                "dataset": self.dataset, "seen": self.seen, "distinct": self.distinct, "duplicates": self.duplicates,
                "missing": self.missing, "shards": list(self.shards), "gather_for_metrics": self.gathered,
                "by": self.by, "whole_on_a_rank": self.whole_on_a_rank, "random_sample": self.sampled,
                "problem": self.problem}


@dataclass
class EvaluationJudgement:
    problems: list = field(default_factory=list)    # EpochProblem: coverage, figures, checkpoints (failures)
    notes: list = field(default_factory=list)
    findings: list = field(default_factory=list)
    json: dict = field(default_factory=dict)
    lines: list = field(default_factory=list)       # the report's lines


def eval_passes(record) -> list:
    """A rank's evaluation passes: DataLoader passes that fed no optimizer step and delivered a batch."""
    return [p for p in getattr(record, "passes", []) if p.epoch is None and p.batches]


def _examples(p, by: str) -> list:
    return p.indices if by == "sampler indices" else p.digests


def keyed_passes(record) -> dict:
    """A rank's evaluation passes by (the loader's line, the k-th evaluation pass from loaders made there): a
    DataLoader made anew at each evaluation is one loader line, its passes counted in order."""
    out, counts = {}, collections.Counter()
    for p in eval_passes(record):
        counts[p.made_at] += 1
        out[(p.made_at, counts[p.made_at])] = p
    return out


def _pass(record, key):
    return keyed_passes(record).get(key)


def evaluations(record) -> dict:
    """A rank's evaluation passes grouped into evaluations: (training epochs begun before it, k-th repeat of a loader
    line since) -> [(key, pass)]. The passes one evaluation makes between two training epochs (a main pass and
    an auxiliary one over the tail, a validation and a test set) are one group; a loader line passed over again
    (an evaluation every N steps) begins the next."""
    starts = sorted(p.started for p in getattr(record, "passes", []) if p.epoch is not None)
    out: dict = {}
    seen: dict = {}
    for key, p in keyed_passes(record).items():
        before = sum(1 for t in starts if t and t < p.started)
        repeat = seen.setdefault(before, {})
        group = (before, repeat.get(p.made_at, 0))
        repeat[p.made_at] = group[1] + 1
        out.setdefault(group, []).append((key, p))
    return out


def _group_examples(per_rank: list, by: str) -> tuple[list, tuple, bool]:
    """World N's examples of one evaluation: each loader line's passes over the ranks, once where every rank that ran
    it saw the same examples (replicated: rank 0 alone, or the same tail on every rank), else every rank's; the
    examples per rank; whether some rank's passes alone hold all of them."""
    lines: dict = {}
    for r, passes in enumerate(per_rank):
        for _, p in passes:
            lines.setdefault(p.made_at, {}).setdefault(r, []).extend(_examples(p, by))
    examples, shards = [], [0] * len(per_rank)
    for ranks in lines.values():
        sets = [set(v) for v in ranks.values()]
        replicated = len(ranks) == 1 or all(x == sets[0] for x in sets[1:])
        for r, v in ranks.items():
            shards[r] += len(v)
        examples += next(iter(ranks.values())) if replicated else [i for v in ranks.values() for i in v]
    return examples, tuple(shards), False


def coverage_of(run_n, run_1) -> list[Coverage]:
    """Each evaluation of world 1's rank 0 that world N made too, counted (the module docstring's rule)."""
    if run_1 is None or not run_1.ranks or not run_n.ranks:
        return []
    out = []
    groups_n = [evaluations(rec) for rec in run_n.ranks]
    for number, (group, ref) in enumerate(evaluations(run_1.ranks[0]).items(), 1):
        per_rank = [g.get(group, []) for g in groups_n]
        passes = [p for _, p in ref] + [p for rank in per_rank for _, p in rank]
        if not any(per_rank) or not all(p.exhausted for p in passes):
            continue
        by = next((b for b in ("input digests", "sampler indices") if all(_examples(p, b) for p in passes) and
                   len({i for _, p in ref for i in _examples(p, b)}) == sum(len(_examples(p, b)) for _, p in ref)), None)
        if by is None:   # none, or world 1 itself repeats examples (drawn with replacement, or inputs alike)
            continue
        whole = {i for _, p in ref for i in _examples(p, by)}
        examples, shards, _ = _group_examples(per_rank, by)
        union = set(examples)
        lines = ", ".join(dict.fromkeys(p.made_at for _, p in ref))
        on_a_rank = any(set().union(*(set(_examples(p, by)) for _, p in rank)) >= whole for rank in per_rank if rank)
        # random batches drawn per rank (a shuffling sampler that stops short of its dataset): no set to cover
        sampled = any(p.shuffles and p.dataset_size and len(_examples(p, by)) < p.dataset_size for _, p in ref)
        out.append(Coverage(lines, number, run_n.world, len(whole), sum(p.dataset_size or 0 for _, p in ref) or None,
                            len(examples), len(union), len(whole - union), shards,
                            any(p.gathered for rank in per_rank for _, p in rank), by, on_a_rank,
                            tuple(key for key, _ in per_rank[0]), sampled))
    return out


def _decimals(text: str) -> int:
    body = text.rstrip("%").lower().split("e")[0]
    return len(body.split(".", 1)[1]) if "." in body else 0


def _matches(figure, x: float) -> bool:
    """The figure as printed is x (or x as a percentage), to the digits printed."""
    tol = 0.5 * 10 ** -_decimals(figure.text) + 1e-9 * abs(x)
    return any(abs(figure.value - x * s) <= tol * (10 if "e" in figure.text.lower() else 1) for s in (1, 100))


def _fetching(record, seq: int):
    """The pass that delivered the rank's last batch before clock `seq` (RankRecord.switches), or None."""
    last = None
    for tick, index in getattr(record, "switches", []):
        if tick >= seq:
            break
        last = index
    return record.passes[last] if last is not None and last < len(record.passes) else None


def _window(rec0, p, seq: int) -> list:
    return [c for c in rec0.collectives_seen if p.started <= c.seq < seq]


def figure_evidence(row: FigureRow, run_n, run_1, covered: dict):
    """(cause, facts) for a figure that differs (the module docstring's evidence, in its order), or None."""
    rec0, seq = run_n.ranks[0], row.world_n.seq
    p = _fetching(rec0, seq)
    if p is None:
        return None
    if p.epoch is not None or not p.batches:
        return "training", {}   # the line follows training batches, not an evaluation: no cause (judge_evaluation)
    key = next((k for k, q in keyed_passes(rec0).items() if q is p), None)
    if key in covered and covered[key].problem:
        return "coverage", {"coverage": covered[key]}
    if key in covered and covered[key].sampled:
        return "random-sample", {"coverage": covered[key]}   # no cause: nothing to compare (judge_evaluation)
    window = _window(rec0, p, seq)
    twice = collections.Counter(c.tensor for c in window if c.reduce and c.tensor)
    again = next((c for c in window if twice[c.tensor] > 1), None)
    if again is not None:
        return "reduced-twice", {"collective": again, "times": twice[again.tensor]}
    sizes = [len(_examples(q, "sampler indices") or _examples(q, "input digests")) if q is not None else 0
             for q in (_pass(rec, key) for rec in run_n.ranks)]
    for c in window:
        found = _reduced_means(c, run_n, sizes, row)
        if found is not None:
            return found
    ref = _pass(run_1.ranks[0], key) if run_1 is not None and run_1.ranks else None
    if ref is not None and 0 < sizes[0] < len(_examples(ref, "sampler indices") or _examples(ref, "input digests")) \
            and not window:
        return "rank-0-shard", {"shard": sizes[0], "whole": len(_examples(ref, "sampler indices") or
                                                                 _examples(ref, "input digests")), "loader": p.made_at}
    return None


_GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_object", "gather", "gather_object")


def _reduced_means(c, run_n, sizes: list, row: FigureRow):
    """A reduction of per-rank means (all_reduce, or gathered and reduced by the script): averaged over unequal
    shards, or summed (the module docstring)."""
    if not (c.reduce in ("SUM", "AVG") or c.op in _GATHERS) or not c.before:
        return None
    befores = []
    for rec in run_n.ranks:
        twin = next((x for x in rec.collectives_seen if x.number == c.number and x.op == c.op), None)
        if twin is None or len(twin.before) != len(c.before):
            return None
        befores.append(twin.before)
    fig_n, fig_1, n = row.world_n, row.world_1, len(befores)
    for j in range(len(c.before)):
        values = [b[j] for b in befores]
        plain, total = sum(values) / n, sum(values)
        if all(sizes) and len(set(sizes)) > 1:
            weighted = sum(s * v for s, v in zip(sizes, values)) / sum(sizes)
            if abs(weighted - plain) > 1e-12 * max(1.0, abs(plain)) and _matches(fig_n, plain) and \
                    not _matches(fig_n, weighted):
                return "mean-of-means", {"collective": c, "values": values, "sizes": sizes, "plain": plain,
                                         "weighted": weighted}
        if c.reduce != "AVG" and _matches(fig_n, total) and abs(fig_n.value - n * fig_1.value) <= \
                0.25 * n * abs(fig_1.value):
            return "sum-of-means", {"collective": c, "values": values, "total": total}
    return None


def judge_evaluation(runs, by_kind: dict, comparisons: list, findings: list) -> EvaluationJudgement:
    """Coverage, figures and checkpoints of a whole run's worlds (the module docstring; causes/evaluation.py and
    causes/checkpoints.py word them)."""
    from mgpu.check.script.causes.checkpoints import optimizer_unsaved, shared_paths
    from mgpu.check.script.causes.evaluation import coverage_text, coverage_unreached_text, figures_not_compared
    from mgpu.check.script.causes.epochs import EpochProblem

    out = EvaluationJudgement(json={"coverage": [], "figures": [], "checkpoints": []})
    done = [r for r in runs if r.failure is None and r.ranks]
    for r in done:
        out.json["checkpoints"] += [{"world": r.world, "run": r.name, "rank": rec.rank, "how": s.how, "path": s.path,
                                     "where": s.where, "optimizer": s.optimizer, "weights": s.weights}
                                    for rec in r.ranks for s in rec.saves]
        if r.world > 1:
            out.problems += [EpochProblem("checkpoint-path", text) for text in shared_paths(r)]
    a = next((r for r in done if r.world == 1 and r.run == "A"), None)
    unsaved = optimizer_unsaved(a) if a is not None else None
    if unsaved:
        out.findings.append(("checkpoint-optimizer", unsaved))
    for r in (r for r in done if r.world > 1 and not r.lifted):
        pair = by_kind.get((r.device, r.lifted), {})
        run_1, rerun = pair.get("A"), pair.get("B")
        counted = coverage_of(r, run_1)
        covered = {key: c for c in counted for key in c.keys}
        out.json["coverage"] += [c.to_json() for c in counted]
        comparison = next((c for c in comparisons if c.world == r.world), None)
        why = figures_not_compared(comparison, [f.name for f in findings])
        statuses: dict = {}
        first = len(out.problems)   # this world's coverage problems go before its figures'
        if run_1 is None or rerun is None or why:
            if run_1 is not None and figures_of(run_1.ranks[0].printed):
                out.notes.append(why or f"world {r.world}: the figures were not compared (world 1 failed)")
        else:
            statuses = _figures(out, r, run_1, rerun, covered)
        by_loader: dict = {}   # one problem a loader: its evaluations listed
        for c in counted:
            if c.problem:
                by_loader.setdefault(c.made_at, []).append(c)
        for cs in by_loader.values():
            text = coverage_text(cs[0], [c.number for c in cs])
            said = [st for c in cs for key in c.keys for st in statuses.get(key, [])]
            if said and all(st == "alike" for st in said) and all(not c.missing and _gathered(r.ranks[0], c)
                                                                 for c in cs):   # gathered, the repeats cut off
                out.notes.append(coverage_unreached_text(text, len(said)))
            else:
                out.problems.insert(first, EpochProblem("coverage", text))
                first += 1
    return out


def _gathered(rec0, coverage: Coverage) -> bool:
    """Rank 0 gathered (all_gather, gather, their _object forms) after one of the evaluation's passes began and
    before the next pass: the predictions collected, so that the script could cut the padding off."""
    passes = keyed_passes(rec0)
    for key in coverage.keys:
        p = passes.get(key)
        if p is None:
            continue
        after = min((q.started for q in rec0.passes if q.started > p.ended), default=float("inf"))
        if any(c.op in _GATHERS and p.started <= c.seq < after for c in rec0.collectives_seen):
            return True
    return False


def _figures(out: EvaluationJudgement, run_n, run_1, rerun, covered: dict) -> dict:
    """The figures lined up and judged (the module docstring); returns each evaluation pass's key -> the statuses
    of the figures printed from it (the coverage of an evaluation whose figures are all alike is not failed)."""
    from mgpu.check.script.causes.epochs import EpochProblem
    from mgpu.check.script.causes.evaluation import figure_text, training_figures_text, unexplained_text

    rows = line_up(figures_of(run_1.ranks[0].printed), figures_of(rerun.ranks[0].printed),
                   figures_of(run_n.ranks[0].printed))
    counts, failed, during, by_key = collections.Counter(), {}, [], {}
    keys = {id(p): k for k, p in keyed_passes(run_n.ranks[0]).items()}
    for row in rows:
        if unmeasured(row.label, row.unit):
            status = "not compared: time, speed, memory, progress or set by the world size"
        elif row.world_1 is None or row.world_n is None:
            status = f"not compared: printed at world {1 if row.world_n is None else run_n.world} only"
        elif row.rerun is None or row.rerun.value != row.world_1.value:
            status = "not compared: not deterministic (world 1 and its rerun differ)"
        elif row.world_n.value == row.world_1.value:
            status = "alike"
        else:
            found = figure_evidence(row, run_n, run_1, covered)
            if found is not None and found[0] == "random-sample":
                status = "not compared: its evaluation is a random sample drawn per rank"
            elif found is not None and found[0] == "training":
                status = "differs, printed during training"   # rank 0's own batches: one note for them all
                during.append(row)
            elif found is not None:
                status = f"failed: {found[0]}"
                failed.setdefault((row.key[0], row.key[2], found[0]), []).append((row, found))
            else:
                status = "differs, no evidence of a cause"
                out.notes.append(unexplained_text(row, run_n.world))
        counts[status.split(":")[0]] += 1
        fetched = _fetching(run_n.ranks[0], row.world_n.seq) if row.world_n is not None else None
        if fetched is not None and id(fetched) in keys and not status.startswith("not compared"):
            by_key.setdefault(keys[id(fetched)], []).append(status)
        out.json["figures"].append({"world": run_n.world, "label": row.label, "line": row.line,
                                    "world_1": row.world_1.text if row.world_1 else None,
                                    "rerun": row.rerun.text if row.rerun else None,
                                    "world_n": row.world_n.text if row.world_n else None, "status": status})
    if during:
        out.notes.append(training_figures_text(during, run_n.world))
    for same in failed.values():   # one problem a figure and cause: its first line, the others counted
        row, (cause, facts) = same[0]
        out.problems.append(EpochProblem("figure", figure_text(row, run_n.world, cause, facts, len(same) - 1)))
    if rows:
        out.lines.append(f"figures rank 0 reported, world {run_n.world} against world 1: " +
                         ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return by_key
