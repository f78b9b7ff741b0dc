"""The gate's statistic against a 20 % trimmed mean, on the same recorded rounds.

    python docs/notes/measure/gate_statistic.py analyse                       # docs/notes/measure/gate-rounds-t5.json
    python docs/notes/measure/gate_statistic.py record --decisions 10 --out rounds.json   # ~50 s a decision here

`record` times the single training step as validate-gate does (fresh workers per decision, both
arms the same tree, or the candidate's Trainer.step planted 5 % slower), 80 rounds each with no
early stop, and keeps every round's samples. `analyse` replays each decision through the gate's
rules (gate/stats.py: the early stop at every 5th round from the 10th, `settled`, then `verdict`) twice:
with the rounds' plain mean of log ratios and Student's t (the gate's statistic until the fifth
session), and with their 20 % trimmed mean and Yuen's interval (the gate's statistic since:
gate/stats.py's `estimate`, with `trim=0` for the mean). Same rounds, same rules, only the statistic
differs, so the counts compare the statistics and not two moments of this VM. The figures are in
docs/notes/perf.md ("Tried again on a noisy day" and after it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from mgpu_perf.gate import stats as gate_stats  # noqa: E402

ROUNDS = ROOT / "docs" / "notes" / "measure" / "gate-rounds-t5.json"
TRIM = gate_stats.TRIM


def estimate(statistic: str, baseline, candidate, threshold: float):
    """The gate's estimate (gate/stats.py) with its 20 % trimmed mean, or with the plain mean (trim 0)."""
    return gate_stats.estimate(list(baseline), list(candidate), threshold, trim=0.0 if statistic == "mean" else TRIM)


def replay(statistic: str, baseline, candidate, threshold: float, level: float, max_rounds: int,
           min_rounds: int = 10, look_every: int = 5) -> tuple[str, int]:
    """(verdict, rounds) of one recorded decision under the gate's early stop and verdict rules."""
    for n in range(min_rounds, max_rounds, look_every):
        if gate_stats.settled(estimate(statistic, baseline[:n], candidate[:n], threshold), threshold, level):
            return gate_stats.verdict(estimate(statistic, baseline[:n], candidate[:n], threshold), threshold, level), n
    final = estimate(statistic, baseline[:max_rounds], candidate[:max_rounds], threshold)
    return gate_stats.verdict(final, threshold, level), max_rounds


def analyse(path: Path, family: int = 7, alpha: float = 0.05) -> None:
    decisions = json.loads(path.read_text())["decisions"]
    level = alpha / family  # the single step judged as validate-gate judges it
    print(f"{path.name}: {len(decisions)} decisions, level {alpha}/{family}")
    logs = [np.log(np.asarray(d["samples"]["candidate"]) / np.asarray(d["samples"]["baseline"])) for d in decisions]
    sds, tails = [x.std(ddof=1) for x in logs], [stats.kurtosis(x) for x in logs]
    print(f"rounds' log ratios: sd {min(sds):.1%}-{max(sds):.1%} a decision, excess kurtosis {min(tails):.1f}-{max(tails):.1f}")
    for threshold in (0.05, 0.10):
        for max_rounds in (40, 80):
            for statistic in ("mean", "trimmed"):
                cells = []
                for kind in ("same", "5%"):
                    runs = [replay(statistic, d["samples"]["baseline"], d["samples"]["candidate"], threshold, level,
                                   max_rounds) for d in decisions if d["kind"] == kind]
                    verdicts = [v for v, _ in runs]
                    cells.append(f"{kind:<4} slower {verdicts.count('slower')}/{len(runs)}, unchanged "
                                 f"{verdicts.count('unchanged')}, inconclusive {verdicts.count('inconclusive')}, "
                                 f"{np.mean([n for _, n in runs]):.0f} rounds")
                print(f"threshold {threshold:.0%}, max {max_rounds} rounds, {statistic:<7}: " + "; ".join(cells))


def record(decisions: int, out: Path) -> None:
    from mgpu_perf.gate.arm import Arm
    from mgpu_perf.gate.compare import Settings, compare
    from mgpu_perf.lab.validate_gate import copy_tree, single_step_spec

    settings = Settings(threshold=0.05, min_rounds=80, max_rounds=80)  # no early stop: every round kept
    name, spec, family = single_step_spec()
    kept = []
    with tempfile.TemporaryDirectory(prefix="mgpu-gate-statistic-") as tmp:
        tmp = Path(tmp)
        baseline = copy_tree(ROOT, tmp / "baseline")
        candidates = {"same": copy_tree(ROOT, tmp / "same"), "5%": copy_tree(ROOT, tmp / "slowed", 0.05)}
        for i in range(decisions):
            for kind, candidate in candidates.items():
                run_dir, arms, began = Path(tempfile.mkdtemp(dir=tmp)), {}, time.perf_counter()
                try:
                    arms["baseline"] = Arm("baseline", baseline, sys.executable, run_dir, require_mgpu=True)
                    arms["candidate"] = Arm("candidate", candidate, sys.executable, run_dir, require_mgpu=True)
                    result = compare(name, spec, arms, settings, family_size=family)
                finally:
                    for arm in arms.values():
                        arm.close()
                    shutil.rmtree(run_dir, ignore_errors=True)
                kept.append({"kind": kind, "samples": result.samples})
                print(f"decision {i + 1} {kind}: {len(result.samples['baseline'])} rounds, "
                      f"{time.perf_counter() - began:.0f} s", flush=True)
                out.write_text(json.dumps({"what": "per-round samples (s) of the single training step",
                                           "decisions": kept}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("analyse")
    a.add_argument("rounds", nargs="?", type=Path, default=ROUNDS)
    r = sub.add_parser("record")
    r.add_argument("--decisions", type=int, default=10, help="decisions per kind")
    r.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "analyse":
        analyse(args.rounds)
    else:
        record(args.decisions, args.out)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
