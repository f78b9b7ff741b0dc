"""The gate's reports: the verdict table, the exit status, ab.json, and each arm's samples in
pytest-benchmark's saved-run format (ab-baseline.json, ab-candidate.json: `pytest-benchmark
compare` shows them).

The ratio is the rounds' 20 % trimmed mean of log ratios (gate/stats.py). Verdicts: `slower` (the
ratio's interval lies above 1 + threshold/2), `unchanged` (inside the equivalence margin),
`faster`, `inconclusive` (neither: more rounds would be needed), `not comparable` (the baseline
cannot set the workload up). Beside it, the counted verdict (gate/counted.py): `slower (counted)`,
`changed`, `same`. Exit status 1 on `slower`, on `slower (counted)` (unless --ab-counts report) and
on `inconclusive` with strict, else 0; a smoke run judges nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from mgpu_perf.counts.judge import NOT_COUNTED, SAME, SLOWER_COUNTED
from mgpu_perf.gate.comparison import Comparison
from mgpu_perf.gate.settings import Settings
from mgpu_perf.gate.sizing import threshold_floor
from mgpu_perf.gate.stats import TRIM

__all__ = ["gate_exit_status", "format_table", "describe_counts", "write_reports"]


def gate_exit_status(results: list[Comparison], settings: Settings) -> int:
    """1 when a judged benchmark is `slower` (or `inconclusive` or `undecidable` under --ab-strict), or
    `slower (counted)` (unless --ab-counts report), else 0; a smoke run judges nothing."""
    bad = {"slower"} | ({"inconclusive", "undecidable"} if settings.strict else set())
    counted = settings.counts == "gate" and any(r.counted.verdict == SLOWER_COUNTED for r in results)
    return 1 if not settings.smoke and (counted or any(r.verdict in bad for r in results)) else 0


def format_table(results: list[Comparison], settings: Settings) -> list[str]:
    header = f"{'benchmark':<44}{'baseline':>10}{'candidate':>11}{'ratio':>8}  {'interval':<15}{'rounds':>7}  verdict"
    lines = [header, "-" * len(header)]
    for r in results:
        name = r.name.split("::")[-1][:43]
        if r.status == "not comparable" or r.estimate is None:
            lines.append(f"{name:<44}{'-':>10}{'-':>11}{'-':>8}  {'-':<15}{'-':>7}  not comparable ({r.reason[:60]})")
            continue
        low, high = r.interval()
        interval = f"{low:.3f}-{high:.3f}" if math.isfinite(high) and r.status == "compared" else "-"
        lines.append(f"{name:<44}{r.median('baseline') * 1e3:>8.1f}ms{r.median('candidate') * 1e3:>9.1f}ms"
                     f"{r.estimate.ratio:>8.3f}  {interval:<15}{len(r.samples['baseline']):>7}  {r.verdict}")
        lines += [f"  {line}" for line in describe_timing(r)]
        lines += [f"  {line}" for line in describe_counts(r)]
    lines.append(f"ratio: the rounds' {TRIM:.0%} trimmed mean (Yuen's interval); "
                 f"threshold {settings.threshold:.0%}: slower = interval above {1 + settings.threshold / 2:.3f}; "
                 f"whole-run false-alarm level {settings.alpha} (Holm)"
                 + (f"; {settings.workers} worker processes an arm" if settings.workers > 1 else "")
                 + ("; SMOKE RUN: verdicts mean nothing" if settings.smoke else ""))
    return lines


def describe_counts(r: Comparison) -> list[str]:
    """The counted verdict under a benchmark's row: what its step does differently, guarded first."""
    c = r.counted
    if c.verdict == NOT_COUNTED:
        return [f"counted: {NOT_COUNTED} ({c.reason})"] if c.reason else []
    if c.verdict == SAME:
        return ["counted: the same step in both arms"]
    return [f"counted: {c.verdict}: {'; '.join(c.changes[:6])}" + (f"; {len(c.changes) - 6} more" if len(c.changes) > 6 else "")]


def describe_timing(r: Comparison) -> list[str]:
    """What a benchmark's rows do not show: why it has no verdict, what clock decided (when not the
    host's), whether its samples were stretched, and CUDA-graph steps (taken, or why not)."""
    lines = []
    if r.status == "undecidable":
        lines.append(f"undecidable: {r.reason}")
    if r.clock != "host":
        lines.append(f"timed by {r.clock} ({r.clock_reason}); host median {_median(r.host_samples['baseline']):.1f}"
                     f" / {_median(r.host_samples['candidate']):.1f} ms")
    for i, plan in enumerate(r.plans[:-1] if r.status == "undecidable" else r.plans):
        if plan["action"] == "stretch":
            lines.append(f"samples stretched: {plan['message']}")
        elif plan["action"] == "refuse" and i + 1 < len(r.plans):
            lines.append(f"first rounds set aside, measured again: {plan['message']}")
        elif plan["action"] == "refuse":  # the last look: its rounds already settled it
            lines.append(f"decided by its first rounds, which settled it (more could not be sized: {plan['message']})")
    graphs = {label: g for label, g in r.graphs.items() if g}
    if graphs and any(g.get("captured") for g in graphs.values()):
        lines.append("CUDA-graph replays in both arms")
    elif graphs and any(g.get("shown") for g in graphs.values()):
        lines.append(f"CUDA graphs not used: {next(iter(graphs.values())).get('why', '')}")
    return lines


def _median(times: list[float]) -> float:
    return sorted(times)[len(times) // 2] * 1e3 if times else math.nan


def _benchmark_json(results: list[Comparison], arm: str, versions: dict | None, commit: str | None = None) -> dict:
    """One arm's samples in pytest-benchmark's saved-run format (for `pytest-benchmark compare`); the
    candidate's commit_info holds its commit's id (as a saved run's does)."""
    import datetime

    from pytest_benchmark import __version__ as pb_version
    from pytest_benchmark.stats import Stats

    benchmarks = []
    for r in results:
        if r.status != "compared" or not r.samples[arm]:
            continue
        stats = Stats()
        for t in r.samples[arm]:
            stats.update(t)
        as_dict = stats.as_dict()
        as_dict.update(data=list(r.samples[arm]), iterations=1)  # as Metadata.as_dict writes it
        name = r.name.split("::")[-1]
        benchmarks.append({"group": "ab-gate", "name": name, "fullname": r.name, "params": None, "param": None,
                           "extra_info": {"arm": arm, "ops_per_sample": r.ops_per_sample, "spec": r.spec},
                           "options": {"disable_gc": False, "timer": "perf_counter", "min_rounds": 1,
                                       "max_time": 0, "min_time": 0, "warmup": False},
                           "stats": as_dict})
    return {"machine_info": {"arm": arm, **(versions or {})}, "commit_info": {"id": commit} if commit else {},
            "benchmarks": benchmarks, "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "version": pb_version}


def write_reports(results: list[Comparison], settings: Settings, out: Path, baseline: str, candidate: str,
                  versions: dict, gpu_clocks: list, commit: str | None = None) -> list[Path]:
    """ab.json (everything: settings, versions, clocks, every sample; `candidate_commit`: the full hash
    of the commit the candidate's tree has checked out, None outside git) and both arms' files; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    s = settings
    report = {"baseline": baseline, "candidate": candidate, "candidate_commit": commit, "versions": versions,
              "gpu_clocks": gpu_clocks,
              "settings": {"threshold": s.threshold, "alpha": s.alpha, "min_rounds": s.min_rounds,
                           "max_rounds": s.max_rounds, "look_every": s.look_every, "sample_s": s.sample_s,
                           "workers": s.workers, "budget_s": s.budget_s, "run_budget_s": s.run_budget_s,
                           "pair_bias": s.pair_bias,
                           "floor": threshold_floor(s.pair_bias, s.workers), "graphs": s.graphs,
                           "amp": s.amp, "compile": s.compile,
                           "strict": s.strict, "smoke": s.smoke, "correction": "holm"},
              "benchmarks": [r.to_dict() for r in results]}
    (out / "ab.json").write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    for arm in ("baseline", "candidate"):
        arm_commit = commit if arm == "candidate" else None
        (out / f"ab-{arm}.json").write_text(
            json.dumps(_benchmark_json(results, arm, versions.get(arm), arm_commit), indent=2) + "\n")
    return [out / "ab.json", out / "ab-baseline.json", out / "ab-candidate.json"]
