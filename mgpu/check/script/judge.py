"""The judge stage of check-script: from every run's records, what the check concludes.

    judgement = judge(plan, runs)     # ScriptCheckError when there is nothing to judge

In this order: the runs that crashed or hung; the findings every rank's record supports (dropout,
random draws, BatchNorm per rank, zero gradients) and the facts that explain a divergence; whether
world 1 reproduces itself (its runs A and B, where no perturbation reached); then each world N
against world 1, step by step (compare.py), unless world 1 failed or does not reproduce itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from mgpu.check.findings import Finding
from mgpu.check.script.divergence import ScriptDivergence
from mgpu.check.script.causes.facts import ScriptFacts
from mgpu.check.script.causes.randomness import unreproducible_unkeyed
from mgpu.check.script.compare import WorldComparison, compare_world, reproducibility
from mgpu.check.script.findings import findings_of
from mgpu.check.script.launch import RankFailure, WorldRun
from mgpu.check.script.plan import ScriptCheckPlan, ScriptCheckError, Target

__all__ = ["Judgement", "judge", "world_1_references", "compared_runs"]


@dataclass
class Judgement:
    """What the runs show: crashes, findings, notes, world 1's irreproducibility, each world's comparison;
    and what the stages after the judge (confirm.py, locate.py) read of it: the world-N runs compared (one
    a comparison, in their order), world 1's references (world_1_references) and the facts (causes/facts.py)."""

    failures: list[RankFailure] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unreproducible: ScriptDivergence | None = None
    comparisons: list[WorldComparison] = field(default_factory=list)
    problems: list = field(default_factory=list)   # --whole-run: the order of the data (causes/epochs.py), failures
    evaluation: object = None                      # --whole-run: evaluation.EvaluationJudgement (coverage, figures)
    compared: list[WorldRun] = field(default_factory=list)
    references: dict = field(default_factory=dict)
    facts: ScriptFacts | None = None


def judge(plan: ScriptCheckPlan, runs: list[WorldRun]) -> Judgement:
    """The judgement of the runs; ScriptCheckError when world 1 made no optimizer step (nothing to judge).
    In one pass a stage: what world 1 shows, then the findings (what the records explain: findings.py),
    then world 1 against itself and each world N against world 1 (compare.py), then --whole-run's own."""
    target, options = plan.target, plan.options
    out = Judgement(failures=[r.failure for r in runs if r.failure is not None])
    out.references = by_kind = world_1_references(runs)
    a_runs = [r for r in runs if r.world == 1 and r.run == "A" and r.failure is None and not r.lifted]
    if a_runs and not a_runs[0].ranks[0].steps:
        _nothing_stepped(target, a_runs[0])
    out.notes = _world_1_notes(a_runs, options.steps if not options.whole_run else 0)  # a whole run asks no count
    out.compared = compared = compared_runs(runs)
    labels = [_precision_label(r) for r in compared]
    found = findings_of(runs, compared)
    out.findings, out.facts = list(found.findings), found.facts
    out.notes += found.notes
    for pair in by_kind.values():
        # world 1 as run against itself lifted is the precision's yardstick, not a rerun: its weights
        # start in another dtype; the lifted pair says whether the script reproduces itself.
        if "A" in pair and "B" in pair and pair["A"].lifted == pair["B"].lifted and out.unreproducible is None:
            out.unreproducible = reproducibility(pair["A"], pair["B"])
    # whatever parts first at world N, N copies of world 1 (no process group) explain it
    for r, label, cause in zip(compared, labels, found.world_causes):
        world_1 = by_kind.get((r.device, r.lifted), {})
        if "A" not in world_1 or "B" not in world_1:
            result = WorldComparison(r.world, "not-compared", 0, reason="world 1 failed")
        elif out.unreproducible is not None:
            result = WorldComparison(r.world, "not-compared", 0, reason="two world-1 runs differ (see above)")
        elif not r.ranks[0].steps:
            result = WorldComparison(r.world, "fail", 0, reason="no optimizer step", first=ScriptDivergence(
                1, kind="data", detail="no step recorded", diagnosis=cause))
        else:
            result = compare_world(r, world_1["A"], world_1["B"], out.facts, plan.batch_hint)
            if cause and result.first is not None:
                result.status, result.first = "fail", dataclasses.replace(result.first, diagnosis=cause)
        result.precision = label
        out.comparisons.append(result)
    if out.unreproducible is not None and out.unreproducible.kind == "data" and found.unkeyed:
        out.unreproducible = dataclasses.replace(out.unreproducible, diagnosis=unreproducible_unkeyed(
            out.unreproducible.diagnosis, list(found.unkeyed)))
    if options.whole_run:
        from mgpu.check.script.causes.epochs import data_order_problems
        from mgpu.check.script.evaluation import judge_evaluation

        out.problems = data_order_problems(runs, by_kind)
        out.evaluation = judge_evaluation(runs, by_kind, out.comparisons, out.findings)
        out.problems += out.evaluation.problems
        out.notes += out.evaluation.notes
        out.findings += [Finding(name, text) for name, text in out.evaluation.findings]
    return out


def compared_runs(runs: list[WorldRun]) -> list[WorldRun]:
    """The world-N runs that were compared with world 1, in the order of Judgement.comparisons (one each)."""
    return [r for r in runs if r.world > 1 and r.failure is None]


def _world_1_notes(a_runs: list[WorldRun], steps: int) -> list[str]:
    """What world 1's runs A did that the comparison must say: fewer steps than asked, set-up steps."""
    notes = []
    for r in a_runs:
        made = len(r.ranks[0].steps)
        if made < steps:
            notes.append(f"the script made {made} optimizer step(s) at world 1 ({r.device}), fewer than the "
                         f"{steps} asked (--steps): compared on the steps it made")
        if r.ranks[0].setup_steps:
            notes.append(f"the script stepped its optimizer {r.ranks[0].setup_steps} time(s) with zero gradients "
                         "before the model consumed any training data (building the optimizer's state, as a "
                         "torch.distributed.checkpoint load does): not counted as training steps")
    return notes


def world_1_references(runs: list[WorldRun]) -> dict[tuple[str, bool], dict[str, WorldRun]]:
    """(device, lifted) -> world 1's runs that world N of that kind is compared with: "A", the
    reference, and "B", whose distance from A is the spread. Where world 1 was lifted to float32
    (plan.plan_runs), the runs as run have no B of their own: their spread is A lifted, the distance
    the mixed precision itself puts between world 1 and its float32 twin (precision.py)."""
    out: dict[tuple[str, bool], dict[str, WorldRun]] = {}
    for r in runs:
        if r.world == 1 and r.failure is None:
            out.setdefault((r.device, r.lifted), {})[r.run] = r
    for (device, lifted), pair in out.items():
        if not lifted and "B" not in pair and "A" in out.get((device, True), {}):
            pair["B"] = out[(device, True)]["A"]
    return out


def _precision_label(run: WorldRun) -> str:
    """What the comparison's arithmetic was: '' for float32 as run, else a few words. A run below
    float32 is always compared lifted as well (launch.run_checked), and as run with world 1 lifted as
    its spread (world_1_references)."""
    if run.lifted:
        lifted = run.ranks[0].lifted if run.ranks else {}
        return f"float32, {', '.join(sorted(lifted)) or 'mixed precision'} lifted"
    lowest = (run.ranks[0].precision if run.ranks else {}).get("lowest", "float32")
    return "" if lowest == "float32" else f"as run, {lowest}; its spread world 1 lifted to float32"


def _nothing_stepped(target: Target, run: WorldRun) -> None:
    rec = run.ranks[0]
    seen = (f"it ran {rec.forwards} forward(s) of a model with parameters" if rec.forwards else
            "it never called a model with parameters (nn.Module) either")
    raise ScriptCheckError(
        f"{target.label()} made no torch.optim optimizer step at world 1 ({seen}): check-script records at "
        "torch.optim.Optimizer.step (torch's global optimizer hooks), so it needs a script that trains with a "
        "torch.optim optimizer (or a wrapper that calls one, such as accelerate's) and steps it at least once; "
        "check the ARGS make it train")
