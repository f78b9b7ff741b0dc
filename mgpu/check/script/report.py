"""The report stage of check-script: the verdict, each world's comparison, the findings; as text and JSON.

    report = ScriptReport.of(target, options, runs, judgement)   # seconds and timings set by the caller
    print(report.text()); report.write_json("check.json"); report.exit_code(strict=True)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mgpu.check.divergence import Divergence
from mgpu.check.findings import ZERO_GRADIENTS
from mgpu.check.report import CheckReport, Verdict
from mgpu.check.script.compare import WorldComparison
from mgpu.check.script.causes.start import UNINITIALISED

__all__ = ["ScriptReport", "timings_of"]


@dataclass
class ScriptReport(CheckReport):
    target: str
    args: list
    worlds: tuple
    steps: int                                   # asked for
    runs: list = field(default_factory=list)     # WorldRun
    comparisons: list = field(default_factory=list)  # WorldComparison
    failures: list = field(default_factory=list)     # RankFailure
    findings: list = field(default_factory=list)     # Finding
    notes: list = field(default_factory=list)
    unreproducible: Divergence | None = None
    seconds: float = 0.0
    timings: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)     # --whole-run: EpochProblem (causes/epochs.py), failures
    epoch_steps: int = 0                             # --whole-run's --epoch-steps; 0: not a whole run
    evaluation: object = None                        # --whole-run: evaluation.EvaluationJudgement

    @classmethod
    def of(cls, target, options, runs: list, judgement) -> "ScriptReport":
        """The report of a judged check (judge.Judgement); seconds and timings are set by the caller."""
        return cls(target.label(), list(target.args), options.worlds, options.steps, runs=runs,
                   comparisons=judgement.comparisons, failures=judgement.failures, findings=judgement.findings,
                   notes=judgement.notes, unreproducible=judgement.unreproducible, problems=judgement.problems,
                   epoch_steps=(options.epoch_steps or 0) if options.whole_run else 0,
                   evaluation=getattr(judgement, "evaluation", None))

    # -- verdict -----------------------------------------------------------------------------------
    @property
    def verdict(self) -> Verdict:
        if self.failures or self.problems or any(c.status == "fail" for c in self.comparisons):
            return Verdict.FAILED
        if self.unreproducible is not None or any(c.status == "finding" for c in self.comparisons):
            return Verdict.NOT_VERIFIED
        if self._zero_gradients() is not None:  # a loss that cannot move the weights agrees at any world size
            return Verdict.NOT_VERIFIED
        return Verdict.PASSED

    def _zero_gradients(self):
        return next((f for f in self.findings if f.name == ZERO_GRADIENTS), None)

    def first_failure(self, strict: bool = False) -> str:
        """The message of an AssertionError: what failed first (under strict a finding counts), or why
        nothing could be verified."""
        for f in self.failures:
            return f.describe()
        for c in self.comparisons:
            if c.status == "fail" and c.first is not None:
                return f"world {c.world} against world 1: {c.first.describe()}"
        for p in self.problems:
            return f"{p.name}: {p.text}"
        if strict and self.findings:
            return f"finding {self.findings[0].name}: {self.findings[0].text}"
        for c in self.comparisons:
            if c.status == "finding" and c.first is not None:
                return f"world {c.world} against world 1: {c.first.describe()}"
        if self.unreproducible is not None:
            return self._unreproducible_text()
        return self.summary()

    def _steps_made(self) -> int:
        return min((len(r.ranks[0].steps) for r in self.runs if r.world == 1 and r.ranks), default=0)

    def _unreproducible_text(self) -> str:
        d = self.unreproducible
        head = f"NOT VERIFIED: two world-1 runs of the script differ ({d.where()}, " \
               f"{d.tensor if d.kind != 'data' else d.detail}): {d.diagnosis}"
        if d.diagnosis.startswith(UNINITIALISED):  # seeded, and still apart: no seed writes that memory
            return head
        return (f"{head}. Seed it: torch.manual_seed(0) (and "
                "random.seed, numpy.random.seed) at the top of the script, before the model and the DataLoader are "
                "made; a DataLoader with shuffle=True takes generator=torch.Generator().manual_seed(0); a "
                "DistributedSampler takes seed=0")

    # -- text --------------------------------------------------------------------------------------
    def summary(self) -> str:
        compared = max((c.steps for c in self.comparisons), default=0)
        t = f"({self.seconds:.1f} s)"
        if self.failures:
            f = self.failures[0]
            where = f"world {f.world}" + ("" if f.rank is None else f", rank {f.rank}")
            what = {"timeout": "timed out", "parted": f"parted: {f.message}"}.get(f.kind, f"crashed: {f.message}")
            return f"FAILED: {where} {what} {t}"
        for c in self.comparisons:
            if c.status == "fail":
                return f"FAILED: world {c.world} parts from world 1 {c.first.describe()} {t}"
        for p in self.problems:
            return f"FAILED: {p.name}: {p.text} {t}"
        if self.unreproducible is not None:
            d = self.unreproducible
            cause = d.diagnosis if d.diagnosis.startswith(UNINITIALISED) else "the script is not seeded"
            return f"NOT VERIFIED: two world-1 runs differ {d.where()} ({d.tensor or d.detail}): {cause} {t}"
        for c in self.comparisons:
            if c.status == "finding":
                return (f"NOT VERIFIED: world {c.world} differs from world 1 {c.first.where()} for a known reason: "
                        f"{c.first.diagnosis} {t}")
        if self._zero_gradients() is not None:
            return ("NOT VERIFIED: every gradient world 1 recorded is zero (finding zero-gradients): a loss that "
                    "cannot move the weights agrees at any world size, so the comparison proved nothing; give the "
                    f"check a loss that depends on the weights {t}")
        others = [str(w) for w in self.worlds if w > 1]
        if not others:
            return (f"PASSED: world 1 reproduces itself over {self._steps_made()} optimizer step(s) (no other world size "
                    f"asked) {t}")
        who = (f"world {others[0]} computes" if len(others) == 1 else
               f"worlds {', '.join(others[:-1])} and {others[-1]} compute")
        whole = f" over the whole run ({self._epochs_made()} epoch(s), --epoch-steps {self.epoch_steps})" \
            if self.epoch_steps else ""
        return f"PASSED: {who} what world 1 computes over {compared} optimizer step(s){whole} {t}"

    def _epochs_made(self) -> int:
        from mgpu.check.script.causes.epochs import training_passes

        return max((len(training_passes(r.ranks[0])) for r in self.runs if r.world == 1 and r.ranks), default=0)

    def text(self) -> str:
        asked = (f"the whole run, each training epoch cut after {self.epoch_steps} optimizer step(s)"
                 if self.epoch_steps else f"{self.steps} optimizer step(s) asked")
        lines = [f"mgpu check-script {self.target}{''.join(' ' + a for a in self.args)}: worlds "
                 f"{', '.join(map(str, self.worlds))}, {asked}"]
        a = next((r for r in self.runs if r.world == 1 and r.run == "A" and r.ranks), None)
        if a is not None:
            recs = a.ranks[0].steps
            if recs:
                kinds = sorted({r.optimizer_type for r in recs})
                lines.append(f"  world 1 recorded {len(recs)} step(s) of {', '.join(kinds)} over "
                             f"{len(recs[0].grads)} parameter(s), {a.ranks[0].forwards} model forward(s)")
        for f in self.failures:
            lines.append("  " + f.describe())
        if self.epoch_steps:
            lines.extend("  " + line for line in self._whole_run_lines())
        for p in self.problems:
            lines.append(f"  FAILED {p.name}: {p.text}")
        if self.unreproducible is not None:
            lines.append("  " + self._unreproducible_text())
        for c in self.comparisons:
            lines.append("  " + _comparison_line(c))
            lines.extend(f"    note: {n}" for n in c.notes)
            every = [label for label in c.compared if not label.endswith("(before step 1)")]
            for e in c.epochs:
                said = "; ".join(e["compared"]) or "nothing"
                if e["compared"] and all(any(x.startswith(label) for label in e["compared"]) for x in every):
                    said = "every check of a step above"
                lines.append(f"    epoch {e['epoch']} ({e['steps']}): compared {said}"
                             + (f"; not compared: {'; '.join(e['not_compared'])}" if e["not_compared"] else ""))
        for f in self.findings:
            lines.append(f"  finding {f.name}: {f.text}")
        lines.extend(f"  note: {n}" for n in self.notes)
        if self.timings:
            lines.append("  time: " + _timing_line(self.timings))
        lines.append(self.summary())
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"script": self.target, "args": list(self.args), "worlds": list(self.worlds), "steps": self.steps,
                "verdict": self.verdict.value, "verified": self.verified, "exit_code": self.exit_code(),
                "summary": self.summary(),
                "failures": [{"world": f.world, "rank": f.rank, "kind": f.kind, "message": f.message,
                              "tail": f.tail} for f in self.failures],
                "unreproducible": self.unreproducible.to_json() if self.unreproducible else None,
                "comparisons": [c.to_json() for c in self.comparisons],
                "findings": [f.to_json() for f in self.findings], "notes": self.notes,
                "runs": [{"world": r.world, "run": r.run or None, "device": r.device, "args": r.args,
                          "seconds": round(r.seconds, 3), "steps": len(r.ranks[0].steps) if r.ranks else None}
                         for r in self.runs],
                "seconds": round(self.seconds, 3), "timings": self.timings,
                **({"whole_run": self._whole_run_json()} if self.epoch_steps else {})}

    # -- --whole-run ---------------------------------------------------------------------------------
    def _whole_run_json(self) -> dict:
        from mgpu.check.script.causes.epochs import epochs_of

        return {"epoch_steps": self.epoch_steps, "problems": [p.to_json() for p in self.problems],
                "evaluation": self.evaluation.json if self.evaluation is not None else {},
                "runs": [{"run": r.name, "world": r.world, "epochs": epochs_of(r.ranks[0]) if r.ranks else [],
                          "evaluation_passes": _evaluation_passes(r), "exits": r.exits} for r in self.runs]}

    def _whole_run_lines(self) -> list[str]:
        """Each run's epochs (steps, how each ended) and how its ranks exited."""
        from mgpu.check.script.causes.epochs import epochs_of

        out = []
        for r in self.runs:
            if not r.ranks:
                continue
            epochs = epochs_of(r.ranks[0])
            said = "; ".join(f"epoch {e['epoch']} {e['steps']} step(s), {e['ended']}" for e in epochs) or \
                "no DataLoader fed its steps (a step-based loop: run to the script's own step count)"
            evaluation = _evaluation_passes(r)
            out.append(f"{r.name}: {len(r.ranks[0].steps)} optimizer step(s): {said}"
                       + (f"; {evaluation} evaluation pass(es) (loaders that fed no step, not cut)" if evaluation else ""))
            if r.exits:
                out.append(f"  exits: {'; '.join(r.exits)}")
        return out + (_evaluation_lines(self.evaluation) if self.evaluation is not None else [])


def _evaluation_lines(evaluation) -> list[str]:
    """Each evaluation loader's coverage at world N (examples per rank against world 1's; its passes alike in one
    line), then the figures' tally."""
    said: dict = {}
    for c in evaluation.json.get("coverage", []):
        how = ("a rank evaluated world 1's whole set" if c["whole_on_a_rank"] else
               "a random sample of the set, drawn per rank: not judged" if c["random_sample"] else
               f"{c['duplicates']} repeated, {c['missing']} left out" +
               (" (gather_for_metrics drops the repeats)" if c["gather_for_metrics"] and c["duplicates"] else ""))
        text = (f"world {c['world']} {c['seen']} example(s) ({', '.join(map(str, c['shards']))} per rank) against "
                f"world 1's {c['world_1']}: {how}")
        said.setdefault((c["loader"], text), []).append(str(c["evaluation"]))
    out = [f"evaluation{'s' if len(passes) > 1 else ''} {', '.join(passes)} ({loader}): {text}"
           for (loader, text), passes in said.items()]
    return out + evaluation.lines


def _evaluation_passes(run) -> int:
    return sum(1 for p in getattr(run.ranks[0], "passes", []) if p.epoch is None) if run.ranks else 0


def _comparison_line(c: WorldComparison) -> str:
    head = f"world {c.world} against world 1" + (f" ({c.precision})" if c.precision else "")
    sensitivity = c.tally.sensitivity_line()
    sensitivity = f"\n    sensitivity: would call a difference of {sensitivity}" if sensitivity else ""
    # every other failure found after the first, then what was compared and what not (compare.py)
    sensitivity += "".join(f"\n    also FAILED {d.describe()}" for d in c.later)
    sensitivity += "".join(f"\n    {word}: {'; '.join(items)}" for word, items in
                           (("compared", c.compared), ("not compared", c.not_compared)) if items)
    if c.status == "pass":
        worst = "; ".join(f"largest {k} error {w['error']:.2e} of {w['allowed']:.2e} allowed ({w['tensor']}, step {w['step']})"
                          for k, w in sorted(c.worst.items()))
        return f"{head}: passed, {c.steps} step(s)" + (f"; {worst}" if worst else "") + sensitivity
    if c.status == "not-compared":
        return f"{head}: not compared: {c.reason}"
    word = "FAILED" if c.status == "fail" else "differs (finding, not a failure)"
    epoch = next((e["epoch"] for e in c.epochs if c.first.step and _in_steps(c.first.step, e["steps"])), None)
    word += f" in epoch {epoch}" if epoch is not None else ""
    entered = f"\n    where it enters (step {c.entered.get('step')}): {c.entered['sentence']}" if c.entered else ""
    return f"{head}: {word} {c.first.describe()}" + entered + sensitivity


def _in_steps(step: int, text: str) -> bool:
    """Whether `step` is among steps_text's 'steps 1-4, 7' (compare.per_epoch's epochs)."""
    for part in text.replace("steps ", "").replace("step ", "").split(", "):
        a, _, b = part.partition("-")
        if a.isdigit() and int(a) <= step <= int(b or a):
            return True
    return False


def timings_of(runs: list, total: float, compare_s: float, setup_s: float) -> dict:
    """Where the time went: per run, the launch (agent, rendezvous, fork: until the rank's code ran),
    the script up to its first model forward (its imports, process group, model, data), its recorded
    steps, and the stop (saving the record, leaving the process group, the agent's end)."""
    out = {"total": round(total, 3), "setup": round(setup_s, 3), "compare": round(compare_s, 3), "runs": []}
    for r in runs:
        row = {"run": r.name + (f" [{r.device}]" if r.device == "cuda" else ""), "seconds": round(r.seconds, 3)}
        if r.ranks:
            t = r.ranks[0].timing
            first = t.first_forward or t.script_end
            row.update(launch=round(t.start - r.started, 3), to_first_forward=round(first - t.script_start, 3),
                       steps=round(t.script_end - first, 3), stop=round(r.ended - t.script_end, 3))
        out["runs"].append(row)
    return out


def _timing_line(t: dict) -> str:
    runs = t.get("runs", [])
    keys = ("launch", "to_first_forward", "steps", "stop")
    sums = {k: sum(r.get(k, 0.0) for r in runs) for k in keys}
    return (f"{t['total']:.1f} s: {len(runs)} run(s) {sum(r['seconds'] for r in runs):.1f} s (launching ranks "
            f"{sums['launch']:.1f}, script to its first forward {sums['to_first_forward']:.1f}, recorded steps "
            f"{sums['steps']:.1f}, stopping {sums['stop']:.1f}), comparison {t['compare']:.1f}, set-up {t['setup']:.1f}"
            + (f", confirming in float64 {t['confirm']:.1f}" if t.get("confirm") else "")
            + (f", locating the divergence (traced runs) {t['locate']:.1f}" if t.get("locate") else ""))
