"""What `mgpu check-script` found: the verdict, each world's comparison, the findings; as text and JSON."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from mgpu.scriptcheck.divergence import Divergence, WorldComparison

__all__ = ["ScriptReport", "findings_of", "timings_of"]


@dataclass
class ScriptReport:
    target: str
    args: list
    worlds: tuple
    steps: int                                   # asked for
    runs: list = field(default_factory=list)     # WorldRun
    comparisons: list = field(default_factory=list)  # WorldComparison
    failures: list = field(default_factory=list)     # RankFailure
    findings: list = field(default_factory=list)     # {"name", "text"}
    notes: list = field(default_factory=list)
    unreproducible: Divergence | None = None
    seconds: float = 0.0
    timings: dict = field(default_factory=dict)

    # -- verdict -----------------------------------------------------------------------------------
    @property
    def verdict(self) -> str:
        if self.failures or any(c.status == "fail" for c in self.comparisons):
            return "failed"
        if self.unreproducible is not None or any(c.status == "finding" for c in self.comparisons):
            return "not verified"
        return "passed"

    @property
    def verified(self) -> bool:
        return self.verdict == "passed"

    def exit_code(self, strict: bool = False) -> int:
        if self.verdict == "failed":
            return 1
        if strict and (self.verdict != "passed" or self.findings):
            return 1
        return 0

    def first_failure(self) -> str:
        """The message of an AssertionError: what failed first, or why nothing could be verified."""
        for f in self.failures:
            return f.describe()
        for c in self.comparisons:
            if c.status in ("fail", "finding") and c.first is not None:
                return f"world {c.world} against world 1: {c.first.describe(c.world)}"
        if self.unreproducible is not None:
            return self._unreproducible_text()
        return self.summary()

    def _steps_made(self) -> int:
        return min((len(r.ranks[0]["records"]) for r in self.runs if r.world == 1 and r.ranks), default=0)

    def _unreproducible_text(self) -> str:
        d = self.unreproducible
        return (f"NOT VERIFIED: two world-1 runs of the script differ ({d.where()}, "
                f"{d.tensor if d.kind != 'data' else d.detail}): {d.diagnosis}. Seed it: torch.manual_seed(0) (and "
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
            what = "timed out" if f.kind == "timeout" else f"crashed: {f.message}"
            return f"FAILED: {where} {what} {t}"
        for c in self.comparisons:
            if c.status == "fail":
                return f"FAILED: world {c.world} parts from world 1 {c.first.describe(c.world)} {t}"
        if self.unreproducible is not None:
            d = self.unreproducible
            return (f"NOT VERIFIED: two world-1 runs differ {d.where()} ({d.tensor or d.detail}): the script is not "
                    f"seeded {t}")
        for c in self.comparisons:
            if c.status == "finding":
                return (f"NOT VERIFIED: world {c.world} differs from world 1 {c.first.where()} for a known reason: "
                        f"{c.first.diagnosis} {t}")
        others = [str(w) for w in self.worlds if w > 1]
        if not others:
            return (f"PASSED: world 1 reproduces itself over {self._steps_made()} optimizer step(s) (no other world size "
                    f"asked) {t}")
        who = (f"world {others[0]} computes" if len(others) == 1 else
               f"worlds {', '.join(others[:-1])} and {others[-1]} compute")
        return f"PASSED: {who} what world 1 computes over {compared} optimizer step(s) {t}"

    def text(self) -> str:
        lines = [f"mgpu check-script {self.target}{''.join(' ' + a for a in self.args)}: worlds "
                 f"{', '.join(map(str, self.worlds))}, {self.steps} optimizer step(s) asked"]
        a = next((r for r in self.runs if r.world == 1 and r.run == "A" and r.ranks), None)
        if a is not None:
            recs = a.ranks[0]["records"]
            if recs:
                kinds = sorted({r["optimizer_type"] for r in recs})
                lines.append(f"  world 1 recorded {len(recs)} step(s) of {', '.join(kinds)} over "
                             f"{len(recs[0]['grads'])} parameter(s), {a.ranks[0]['forwards']} model forward(s)")
        for f in self.failures:
            lines.append("  " + f.describe())
        if self.unreproducible is not None:
            lines.append("  " + self._unreproducible_text())
        for c in self.comparisons:
            lines.append("  " + _comparison_line(c))
            lines.extend(f"    note: {n}" for n in c.notes)
        for f in self.findings:
            lines.append(f"  finding {f['name']}: {f['text']}")
        lines.extend(f"  note: {n}" for n in self.notes)
        if self.timings:
            lines.append("  time: " + _timing_line(self.timings))
        lines.append(self.summary())
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"script": self.target, "args": list(self.args), "worlds": list(self.worlds), "steps": self.steps,
                "verdict": self.verdict, "verified": self.verified, "exit_code": self.exit_code(),
                "summary": self.summary(),
                "failures": [{"world": f.world, "rank": f.rank, "kind": f.kind, "message": f.message,
                              "tail": f.tail} for f in self.failures],
                "unreproducible": self.unreproducible.to_json() if self.unreproducible else None,
                "comparisons": [c.to_json() for c in self.comparisons],
                "findings": self.findings, "notes": self.notes,
                "runs": [{"world": r.world, "run": r.run or None, "device": r.device, "args": r.args,
                          "seconds": round(r.seconds, 3), "steps": len(r.ranks[0]["records"]) if r.ranks else None}
                         for r in self.runs],
                "seconds": round(self.seconds, 3), "timings": self.timings}

    def write_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(_finite(self.to_json()), f, indent=1)
            f.write("\n")


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _comparison_line(c: WorldComparison) -> str:
    if c.status == "pass":
        worst = "; ".join(f"largest {k} error {w['error']:.2e} of {w['allowed']:.2e} allowed ({w['tensor']}, step {w['step']})"
                          for k, w in sorted(c.worst.items()))
        return f"world {c.world} against world 1: passed, {c.steps} step(s)" + (f"; {worst}" if worst else "")
    if c.status == "not-compared":
        return f"world {c.world} against world 1: not compared: {c.reason}"
    word = "FAILED" if c.status == "fail" else "differs (finding, not a failure)"
    return f"world {c.world} against world 1: {word} {c.first.describe(c.world)}"


def findings_of(runs: list) -> tuple[list, dict]:
    """The findings, from every rank's record: random-layers, randomness, batch-mixing; and the raw
    facts compare.py uses to explain a divergence."""
    dropout_calls, modules, draws, where, bn = {}, [], {}, {}, []
    for run in runs:
        for r in run.ranks:
            for k, v in r["dropout_calls"].items():
                dropout_calls[k] = max(dropout_calls.get(k, 0), v)
            modules += [m for m in r["random_modules"] if m not in modules]
            for k, v in r["random_draws"].items():
                draws[k] = max(draws.get(k, 0), v)
            for k, v in r["random_where"].items():
                where.setdefault(k, v)
            bn += [m for m in r["batchnorm"] if m not in bn]
    out = []
    if dropout_calls or modules:
        parts = []
        if modules:
            parts.append(f"{len(modules)} module(s): {_listed(modules)}")
        parts += [f"{v} call(s) to {k} in a run" for k, v in sorted(dropout_calls.items())]
        out.append({"name": "random-layers", "text": (
            "dropout and stochastic depth switched off in every process (DropoutOff, at the function level): "
            f"{'; '.join(parts)}. With them on, each rank draws its own masks: parity can then only be statistical")})
    if draws:
        what = "; ".join(f"{k}: {v} call(s) in a run" + (f", first in {where[k]}" if k in where else "")
                         for k, v in sorted(draws.items()))
        out.append({"name": "randomness", "text": (
            f"the forward draws random numbers beyond dropout ({what}): each rank draws its own for its shard, so "
            "world N matches world 1 only where the draws do not matter; draw them from the input, or switch them "
            "off for the check")})
    if bn:
        out.append({"name": "batch-mixing", "text": (
            f"BatchNorm without SyncBatchNorm: {_listed(bn)}: as the script is, each rank normalises over its own "
            "shard and world 1 over the whole batch, so its training depends on the world size. The comparison ran "
            "it synchronised over the ranks (SyncBatchNorm's statistics, put in by the check at world N), so that the "
            "rest of the loop is checked; for training that does not depend on the world size convert with "
            "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) (CUDA), or use GroupNorm/LayerNorm")})
    zero = _zero_gradients(runs)
    if zero:
        out.append({"name": "zero-gradients", "text": (
            f"every gradient world 1 recorded is zero ({zero}): a loss that cannot move the weights passes any "
            "comparison of gradients, so this one checked little (cross-entropy over a single class, a loss from "
            "detached tensors?); give the check a loss that depends on the weights")})
    return out, {"batchnorm": bn, "random_draws": draws}


def _zero_gradients(runs: list) -> str:
    """"K step(s), P parameter(s)" when world 1's first run recorded gradients and every one is zero."""
    a = next((r for r in runs if r.world == 1 and r.run == "A" and r.failure is None and r.ranks), None)
    records = a.ranks[0]["records"] if a is not None else []
    grads = [g for rec in records for g in rec["grads"].values() if g is not None]
    if not grads or any(bool(g.ne(0).any()) for g in grads):
        return ""
    return f"{len(records)} step(s), {len(records[0]['grads'])} parameter(s)"


def _listed(items: list, most: int = 6) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def timings_of(runs: list, total: float, compare_s: float, setup_s: float) -> dict:
    """Where the time went: per run, the launch (agent, rendezvous, fork: until the rank's code ran),
    the script up to its first model forward (its imports, process group, model, data), its recorded
    steps, and the stop (saving the record, leaving the process group, the agent's end)."""
    out = {"total": round(total, 3), "setup": round(setup_s, 3), "compare": round(compare_s, 3), "runs": []}
    for r in runs:
        row = {"run": r.name + (f" [{r.device}]" if r.device == "cuda" else ""), "seconds": round(r.seconds, 3)}
        if r.ranks:
            t = r.ranks[0]["timing"]
            first = t.get("first_forward") or t["script_end"]
            row.update(launch=round(t["start"] - r.started, 3), to_first_forward=round(first - t["script_start"], 3),
                       steps=round(t["script_end"] - first, 3), stop=round(r.ended - t["script_end"], 3))
        out["runs"].append(row)
    return out


def _timing_line(t: dict) -> str:
    runs = t.get("runs", [])
    keys = ("launch", "to_first_forward", "steps", "stop")
    sums = {k: sum(r.get(k, 0.0) for r in runs) for k in keys}
    return (f"{t['total']:.1f} s: {len(runs)} run(s) {sum(r['seconds'] for r in runs):.1f} s (launching ranks "
            f"{sums['launch']:.1f}, script to its first forward {sums['to_first_forward']:.1f}, recorded steps "
            f"{sums['steps']:.1f}, stopping {sums['stop']:.1f}), comparison {t['compare']:.1f}, set-up {t['setup']:.1f}")
