"""Proof that the A/B gate (mgpu_perf/gate/) tells a slowdown from noise on this machine, measured.

    python -m mgpu_perf validate-gate                # the full validation (about 25 minutes on 2 cores)
    python -m mgpu_perf validate-gate --quick        # a smaller version (about 5 minutes)
    python -m mgpu_perf validate-gate --threshold 5  # the gate at --ab-threshold 5 against a 5 % slower step
    python -m mgpu_perf validate-gate --threshold 5 --workers 2   # ... with two worker processes an arm
    python -m mgpu_perf validate-gate --runs 0 --set-runs 2 --set-forward 50   # the set against a slower forward
    python -m mgpu_perf validate-gate --quick --plant-on gpu   # on a GPU: a kernel that CUDA-graph replays run

Run it from a checkout of mgpu with nothing else on the machine; it is not part of CI. It copies
the tree three times into a temporary folder (so the checkout may change while it runs): `same`
(unchanged), and two candidates whose every training step and evaluation take T % and T/2 % longer
than their own time (T: --threshold, default 10; a busy-wait appended to the copy's
mgpu/trainer.py, so the slowdown scales with the machine's speed of the moment, as a real one
would). Then:

1. Rates on one gated benchmark, the `single` training step, each run a whole gate decision with
   fresh worker processes: `--runs` runs each with both arms the same tree (a `slower` there is a
   false alarm), with the T % candidate (must be `slower`) and with the T/2 % candidate (reported).
   The runs of the three kinds are interleaved, so the machine's drift hits them alike. Each is
   judged at the level the benchmark gets in a whole run of the gated set (alpha / set size, the
   strictest Holm step).
2. The whole gated set, `pytest perf --ab-baseline <same> --ab-threshold T`: `--set-runs` runs from
   the unchanged tree (no `slower` anywhere) and from the T % candidate (every training benchmark
   `slower`, the kernel not), with the time per run. `--set-forward P`: that candidate's model forward
   takes P % longer instead (a busy-wait in forward hooks, in every process: ddp's and fsdp's
   ranks too), a slowdown of part of the step, as a real one would be.

`--plant-on gpu` (CUDA only): the slowdown is GPU work instead, a spin kernel launched after
ResNet-18's forward and sized to the plant's share of an eager training step's GPU time
(lab/plants.py PLANTED_GPU). A busy-wait in Trainer.step never runs in a CUDA-graph replay of the
step (the harness replays the captured step, not Trainer.step), so on a GPU this is the plant that
tests the gate on what it times there.

Writes gate-validation.json into --out and prints the rates; exits 1 if the targets (at most 1
false `slower` in 20 and at least 19 detections in 20 at T %, scaled to --runs) are missed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from mgpu_perf.errors import GateError
from mgpu_perf.gate.arm import start_workers
from mgpu_perf.gate.compare import compare, with_round_health
from mgpu.options import percent_shown
from mgpu_perf.gate.settings import Settings
from mgpu_perf.gate.stats import verdict
# The plants and the tree's copies live in lab/plants.py; imported from here too (validate_counts, notes' scripts).
from mgpu_perf.lab.plants import PLANTED, PLANTED_FORWARD, copy_tree, project_files  # noqa: F401
from mgpu_perf.lab.validate_gate_options import ValidateGateOptions


@dataclass(frozen=True)
class Experiment:
    """What one validate-gate run measures: its benchmark (the name, the spec, the gated set's size
    for its level), the runs of each kind, the gate's settings, and the kinds that must be caught:
    the T % candidate, and the whole set's slowed one (the same, or --set-forward's)."""
    name: str
    spec: dict
    family: int
    runs: int
    set_runs: int
    settings: Settings
    big: str       # the T % candidate's label: "10% slower" (or --plant's: "15% slower")
    set_big: str   # the whole set's slowed candidate's label: big, or "forward 50% slower"
    plant: float = 0.0   # the big candidate's slowdown (a fraction): at or above the threshold, `unchanged` is wrong
    set_slowed_only: bool = False  # the whole set from the slowed candidate only
    stop_starting_at: float = math.inf  # time.time() after which no run starts (--stop-starting-after-min)


def single_step_spec() -> tuple[str, dict, int]:
    """The `single` training step as the gate runs it, and the size of the gated set (for its level)."""
    from mgpu_perf.gated import Case, gated_set, train_spec
    from mgpu_perf.sweep import make_sweep

    sweep = make_sweep(None)
    return "test_train_step[single]", train_spec("train-step", Case("single", 1), sweep), len(gated_set(sweep))


def one_decision(baseline: Path, candidate: Path, name: str, spec: dict, family: int, workdir: Path,
                 settings: Settings) -> dict:
    """A whole gate decision on one benchmark with fresh workers: baseline tree vs candidate tree."""
    run_dir = Path(tempfile.mkdtemp(dir=workdir))
    start = time.perf_counter()
    arms = {}
    try:  # as the gate starts them
        arms = start_workers({"baseline": (baseline, sys.executable), "candidate": (candidate, sys.executable)},
                             settings.workers, run_dir, require_mgpu=True)
        result = compare(name, spec, arms, settings, family_size=family)
    finally:
        for arm in (arm for pool in arms.values() for arm in pool):
            arm.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    level = settings.alpha / family  # the strictest Holm step of a whole run of the gated set
    if result.status == "undecidable":
        result = replace(result, level=level, verdict=result.status)
    else:  # as the gate judges it, its rounds' health included
        result = with_round_health(result, verdict(result.estimate, settings.threshold, level), level,
                                   settings.threshold)
    low, high = result.interval()
    return {"verdict": result.verdict, "ratio": result.estimate.ratio, "interval": [low, high],
            "rounds": len(result.samples["baseline"]), "seconds": time.perf_counter() - start,
            "samples": result.samples, "reason": result.reason, "plans": result.plans,
            "ops_per_sample": result.ops_per_sample, "counted": result.counted.verdict,
            "count_changes": result.counted.changes, "count_reason": result.counted.reason, "count_s": result.count_s,
            "round_s": result.round_s, "facts": result.facts,
            "health": result.health.to_dict() if result.health else None}  # every round, to replay the decision


def whole_set(candidate: Path, baseline: Path, out: Path, settings: Settings) -> dict:
    """`pytest perf --ab-baseline BASELINE` run from the candidate tree; verdicts from its ab.json."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "perf", "--ab-baseline", str(baseline), "-q",
                           "--ab-threshold", f"{settings.threshold * 100:g}", "--ab-max-rounds", str(settings.max_rounds),
                           "--ab-sample-s", f"{settings.sample_s:g}", "--ab-workers", str(settings.workers),
                           "-p", "no:cacheprovider", "--perf-out", str(out)], cwd=candidate, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - start
    try:
        report = json.loads((out / "ab.json").read_text())
    except (OSError, ValueError):
        raise RuntimeError(f"the gate run wrote no ab.json (exit {proc.returncode}):\n{proc.stdout[-3000:]}"
                           f"\n{proc.stderr[-2000:]}") from None
    named = {b["name"].split("::")[-1]: b for b in report["benchmarks"]}
    return {"exit": proc.returncode, "seconds": seconds, "verdicts": {k: b["verdict"] for k, b in named.items()},
            "ratios": {k: b["ratio"] for k, b in named.items()},
            "reasons": {k: b["reason"] for k, b in named.items() if b.get("reason")},
            "benchmarks": [kept(b) for b in report["benchmarks"]]}


KEPT = ("name", "status", "verdict", "ratio", "interval", "rounds", "reason", "noise", "plans", "samples", "pairs",
        "health", "ops_per_sample", "seconds")


def kept(benchmark: dict) -> dict:
    """What validate-gate keeps of one benchmark of ab.json: its decision and rounds, and each
    round's facts (gate/health.py) where it was not `slower` (the rounds to look at again)."""
    return {k: benchmark.get(k) for k in KEPT} | ({"facts": benchmark.get("facts")}
                                                if benchmark.get("verdict") != "slower" else {})


def rate(decisions: list[dict], verdict: str) -> str:
    hits = sum(d["verdict"] == verdict for d in decisions)
    return f"{hits}/{len(decisions)}"


def build_parser() -> argparse.ArgumentParser:
    from mgpu.errors import OneLineParser

    parser = OneLineParser(prog="python -m mgpu_perf validate-gate", description=__doc__.split("\n\n")[0])
    ValidateGateOptions.add_all(parser.add_argument)
    return parser


def single_decisions(experiment: Experiment, copies: dict, tmp: Path, partial: Path) -> dict[str, list[dict]]:
    """`runs` decisions of each kind (candidate tree), interleaved; every one written to `partial` as it ends."""
    e, settings = experiment, experiment.settings
    same, kinds = copies["same"], copies["kinds"]
    decisions: dict[str, list[dict]] = {k: [] for k in kinds}
    print(f"1. {e.name} ({e.spec}), {e.runs} runs per kind, threshold {settings.threshold * 100:g} %, "
          f"{settings.workers} worker(s) an arm, judged at alpha {settings.alpha}/{e.family}", flush=True)
    for i in range(e.runs):
        for kind, candidate in kinds.items():
            if time.time() > e.stop_starting_at:
                return decisions
            d = one_decision(same, candidate, e.name, e.spec, e.family, tmp, settings)
            decisions[kind].append(d)
            partial.write_text(json.dumps({"settings": asdict(settings), "decisions": decisions}) + "\n")
            print(f"   run {i + 1:>2} {kind:<11} {d['verdict']:<13} ratio {d['ratio']:.3f} "
                  f"[{d['interval'][0]:.3f}, {d['interval'][1]:.3f}] {d['rounds']:>2} rounds {d['seconds']:.0f} s",
                  flush=True)
    return decisions


def whole_sets(experiment: Experiment, same: Path, unchanged: Path, slowed: Path, tmp: Path,
               partial: Path | None = None) -> dict[str, list[dict]]:
    """`set_runs` runs of the whole gated set from the unchanged tree and from the slowed candidate
    (--set-slowed-only: from the slowed one only), none started past --stop-starting-after-min;
    every run written to `partial` as it ends."""
    big = experiment.set_big
    sets: dict[str, list[dict]] = {"same tree": [], big: []}
    print(f"2. the whole gated set, {experiment.set_runs} runs per kind", flush=True)
    kinds = ((big, slowed),) if experiment.set_slowed_only else (("same tree", unchanged), (big, slowed))
    for i in range(experiment.set_runs):
        for kind, candidate in kinds:
            if time.time() > experiment.stop_starting_at:
                print(f"   no more runs: --stop-starting-after-min reached after {i} run(s)", flush=True)
                return sets
            r = whole_set(candidate, same, tmp / f"set-{kind.split()[0]}-{i}", experiment.settings)
            sets[kind].append(r)
            if partial is not None:
                partial.write_text(json.dumps({"whole_set": sets}) + "\n")
            verdicts = ", ".join(f"{k}: {v}" for k, v in r["verdicts"].items())
            print(f"   run {i + 1} {kind:<11} exit {r['exit']} in {r['seconds']:.0f} s: {verdicts}", flush=True)
    return sets


def as_required(r: dict, slowed: bool) -> bool:
    """Unchanged tree: exit 0, no `slower`. Slowed: exit 1, every training benchmark `slower`, the kernel `unchanged`."""
    if not slowed:
        return r["exit"] == 0 and "slower" not in r["verdicts"].values()
    return r["exit"] == 1 and all(v == ("unchanged" if "matmul" in k else "slower") for k, v in r["verdicts"].items())


def verdict_counts(runs: list[dict]) -> dict[str, dict[str, int]]:
    """Per benchmark of the whole-set runs, how many gave each verdict."""
    counts: dict[str, dict[str, int]] = {}
    for r in runs:
        for name, v in r["verdicts"].items():
            counts.setdefault(name, {})[v] = counts.setdefault(name, {}).get(v, 0) + 1
    return counts


def wrong_unchanged(experiment: Experiment, decisions: dict, sets: dict) -> dict:
    """The gate's worst answer, counted apart from `undecidable`: a planted slowdown at or above the
    threshold judged `unchanged`. The single step's runs of the big candidate, and the training
    benchmarks of the whole set's slowed runs (not the kernel, which no plant touches; not a
    --set-forward candidate, whose step is slowed by less than its forward)."""
    e = experiment
    if e.plant < e.settings.threshold:
        return {"single": None, "set": None, "set_total": None, "set_training_verdicts": 0}
    single = sum(d["verdict"] == "unchanged" for d in decisions.get(e.big, []))
    runs = sets.get(e.big, []) if e.set_big == e.big else []
    training = [(k, v) for r in runs for k, v in r["verdicts"].items() if "matmul" not in k]
    per = {k: sum(v == "unchanged" for name, v in training if name == k) for k, _ in training}
    return {"single": single, "set": per, "set_total": sum(per.values()), "set_training_verdicts": len(training)}


def summarise(experiment: Experiment, decisions: dict, sets: dict, total: float) -> dict:
    """gate-validation.json: the rates, the targets and whether they were met."""
    e, settings = experiment, experiment.settings
    false_alarms = sum(d["verdict"] == "slower" for d in decisions["same tree"])
    caught = sum(d["verdict"] == "slower" for d in decisions[e.big])
    allowed_false, needed = math.floor(e.runs / 20), math.ceil(e.runs * 19 / 20)
    decisions = {k: v for k, v in decisions.items() if v}  # --runs 0: the whole set only
    set_ok = all(as_required(r, False) for r in sets.get("same tree", [])) and \
        all(as_required(r, True) for r in sets[e.set_big])
    wrong = wrong_unchanged(e, decisions, sets)
    return {
        "benchmark": e.name, "spec": e.spec, "runs_per_kind": e.runs, "set_runs_per_kind": e.set_runs,
        "settings": {"threshold": settings.threshold, "max_rounds": settings.max_rounds, "sample_s": settings.sample_s,
                     "workers": settings.workers},
        "rates": {kind: {v: rate(ds, v) for v in ("slower", "unchanged", "inconclusive", "faster", "undecidable")}
                  for kind, ds in decisions.items()},
        "seconds_per_decision": {kind: sum(d["seconds"] for d in ds) / len(ds) for kind, ds in decisions.items()},
        "rounds_per_decision": {kind: sum(d["rounds"] for d in ds) / len(ds) for kind, ds in decisions.items()},
        "plant": e.plant, "wrong_unchanged": wrong, "set_verdicts": {k: verdict_counts(rs) for k, rs in sets.items()},
        "whole_set": sets, "total_seconds": total, "decisions": decisions,
        "targets": {"false_slower_at_most": allowed_false, "caught_at_least": needed, "wrong_unchanged": 0},
        "met": {"false_alarms": false_alarms <= allowed_false, "detections": caught >= needed, "whole_set": set_ok,
                "no_wrong_unchanged": not (wrong["single"] or wrong["set_total"])},
    }


def print_summary(summary: dict, experiment: Experiment, path: Path) -> None:
    decisions, sets, targets = summary["decisions"], summary["whole_set"], summary["targets"]
    runs = experiment.runs
    false_alarms = sum(d["verdict"] == "slower" for d in decisions.get("same tree", []))
    caught = sum(d["verdict"] == "slower" for d in decisions.get(experiment.big, []))
    if runs:
        print(f"\nsingle step, {runs} runs each (fresh workers per run):")
    for kind, ds in decisions.items():
        print(f"   {kind:<11} slower {rate(ds, 'slower')}, unchanged {rate(ds, 'unchanged')}, "
              f"inconclusive {rate(ds, 'inconclusive')}, faster {rate(ds, 'faster')}, "
              f"undecidable {rate(ds, 'undecidable')}; "
              f"{summary['rounds_per_decision'][kind]:.1f} rounds, {summary['seconds_per_decision'][kind]:.0f} s a run")
    per_run = [r["seconds"] for rs in sets.values() for r in rs]
    if experiment.set_runs and not per_run:  # --stop-starting-after-min came first
        print("whole gated set: no run (--stop-starting-after-min reached before the first)")
    elif experiment.set_runs:
        # Per kind, how many runs were as required: a slowed run with one `undecidable` is not, yet it
        # holds no wrong answer (counted apart below).
        met = ", ".join(f"{kind} {sum(as_required(r, kind != 'same tree') for r in rs)}/{len(rs)}"
                        for kind, rs in sets.items() if rs)
        print(f"whole gated set: {'as required' if summary['met']['whole_set'] else 'NOT as required'} "
              f"(runs as required: {met}; slowed: exit 1, every training benchmark `slower`, the kernel "
              f"`unchanged`); {min(per_run):.0f}-{max(per_run):.0f} s a run")
        for kind, counts in summary["set_verdicts"].items():
            for name, c in counts.items():
                print(f"   {kind:<11} {name:<40} " + ", ".join(f"{v} {n}" for v, n in sorted(c.items())))
    wrong = summary["wrong_unchanged"]
    if wrong["single"] is not None:
        single = f"single step {wrong['single']}/{runs}, " if runs else ""
        print(f"wrong unchanged (a planted {experiment.plant:.0%} slowdown, at or above the threshold, judged "
              f"`unchanged`): {single}whole set {wrong['set_total']} of {wrong['set_training_verdicts']} training verdicts")
    rates = (f"false slower {false_alarms}/{runs} (target <= {targets['false_slower_at_most']}), "
             f"caught {caught}/{runs} (target >= {targets['caught_at_least']}); ") if runs else ""  # --runs 0: none
    print(f"{rates}total {summary['total_seconds'] / 60:.1f} min; wrote {path}")


def main(argv: list[str] | None = None) -> int:
    from mgpu.errors import one_line

    parser = build_parser()
    try:
        args = ValidateGateOptions.from_args(parser.parse_args(argv))
    except GateError as e:
        parser.error(one_line(e))
    settings = args.settings
    threshold = float(percent_shown(settings.threshold))  # percent: the gate's, and the slowdown it must catch
    runs, set_runs, plant = args.runs, args.set_runs, args.plant
    from mgpu_perf.gate.baseline import is_mgpu_checkout

    root = Path(args.tree).resolve()
    if not is_mgpu_checkout(root):
        parser.error(f"--tree {root} is not a checkout of mgpu (validate-gate plants slowdowns in its mgpu/trainer.py)")
    on_gpu = args.plant_on == "gpu"
    if on_gpu:
        import torch

        if not torch.cuda.is_available():
            parser.error("--plant-on gpu: no CUDA device visible to torch (the plant is a kernel on the GPU)")
    full, half = plant / 100, threshold / 200
    where = " (GPU kernel)" if on_gpu else ""
    big, small = f"{plant:g}% slower{where}", f"{threshold / 2:g}% slower{where}"
    forward = bool(args.set_forward and set_runs)  # the whole set's candidate: a slower forward instead
    name, spec, family = single_step_spec()
    experiment = Experiment(name, spec, family, runs, set_runs, settings, big,
                            f"forward {args.set_forward:g}% slower" if forward else big, full, args.set_slowed_only,
                            time.time() + 60 * args.stop_starting_after_min if args.stop_starting_after_min else math.inf)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / f"gate-validation-t{threshold:g}.partial.json"  # every decision as it ends
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mgpu-validate-gate-") as tmp:
        tmp = Path(tmp)
        same = copy_tree(root, tmp / "same")  # the baseline of every run
        unchanged = copy_tree(root, tmp / "unchanged")  # a candidate identical to it (a folder may not be both arms)
        def planted(fraction: float, folder: str) -> Path:
            return copy_tree(root, tmp / folder, gpu=fraction) if on_gpu else copy_tree(root, tmp / folder, fraction)

        slowed = {full: planted(full, "slowed-full")}
        if not args.without_half:
            slowed[half] = planted(half, "slowed-half")
        kinds = {"same tree": unchanged, big: slowed[full], **({} if args.without_half else {small: slowed[half]})}
        decisions = single_decisions(experiment, {"same": same, "kinds": kinds}, tmp, partial)
        set_slowed = copy_tree(root, tmp / "slowed-forward", forward=args.set_forward / 100) if forward else slowed[full]
        sets = whole_sets(experiment, same, unchanged, set_slowed, tmp, out / f"gate-validation-t{threshold:g}.sets.partial.json")
    summary = summarise(experiment, decisions, sets, time.perf_counter() - began)
    path = out / f"gate-validation-t{threshold:g}.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    partial.unlink(missing_ok=True)
    (out / f"gate-validation-t{threshold:g}.sets.partial.json").unlink(missing_ok=True)
    print_summary(summary, experiment, path)
    return 0 if all(summary["met"].values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
