"""Issue 47, item 6: what each round's two samples met. Times the gate's `single` training step in a
worker of an unchanged copy of this tree (baseline) and of a copy whose step is --plant % slower
(candidate), in the gate's order (A B, B A, ...), and records every sample's answer as the worker
gives it (op times, wall window, CPU seconds in the sample and since the worker's last sample),
with the CPU each worker last ran on. Then the round health (mgpu_perf/gate/health.py) of those
rounds. Figures: docs/notes/gate-validation.md, 2026-11-26.

    .venv/bin/python docs/notes/measure/round_health_probe.py --rounds 20 --plant 15 --out /tmp/probe.json
    .venv/bin/python docs/notes/measure/round_health_probe.py --sleep-plant ...   # the plant sleeps, not busy
    .venv/bin/python docs/notes/measure/round_health_probe.py --decide --pin-nice 10 ...   # a whole gate decision,
        # the baseline's worker pinned to CPU 0 beside a busy loop at that nice, the candidate's to CPU 1

Load it yourself for bursts: `nice -n 0 python -c "while 1: pass" &` (one per core and more).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from mgpu_perf.gate import stats  # noqa: E402
from mgpu_perf.gate.arm import start_workers  # noqa: E402
from mgpu_perf.gate.compare import compare, with_round_health  # noqa: E402
from mgpu_perf.gate.health import RoundFacts, check_rounds, sample_facts  # noqa: E402
from mgpu_perf.gate.rounds import round_order  # noqa: E402
from mgpu_perf.gate.settings import Settings  # noqa: E402
from mgpu_perf.lab.validate_gate import copy_tree, single_step_spec  # noqa: E402

BUSY = "        while _time.perf_counter() < end:  # busy, as real work would be\n            pass"


def last_cpu(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[36])


def probe(pools, spec, rounds: int, sample_s: float) -> list[dict]:
    """`rounds` rounds of raw answers, after set-up, two warm-up operations and the counted step."""
    arms = {label: pool[0] for label, pool in pools.items()}
    for arm in arms.values():
        arm.request("setup", spec=spec)
    fastest = [min(arm.request("sample", ops=1)["times"][0] for _ in range(2)) for arm in arms.values()]
    ops = max(1, round(sample_s / statistics.fmean(fastest)))
    for arm in arms.values():
        arm.request("count")
    out = []
    for i in range(rounds):
        record = {"first": round_order(i)[0], "ops": ops}
        for label in round_order(i):
            answer = arms[label].request("sample", ops=ops)
            record[label] = {**answer, "cpu_last": last_cpu(arms[label].proc.pid)}
        out.append(record)
        b, c = (statistics.median(record[a]["times"]) for a in ("baseline", "candidate"))
        print(f"{i:>3} {record['first'][0]} first  ratio {c / b:.3f}  " + "  ".join(
            f"{a[0]}: {statistics.median(record[a]['times']) * 1e3:.0f} ms, cpu {record[a]['cpu_s'] * 1e3:.0f} ms, "
            f"between {(record[a]['cpu_between_s'] or 0) * 1e3:.0f} ms, on cpu {record[a]['cpu_last']}"
            for a in ("baseline", "candidate")), flush=True)
    return out


def health_of(records: list[dict], threshold: float, level: float) -> dict:
    samples = {a: [statistics.median(r[a]["times"]) for r in records] for a in ("baseline", "candidate")}
    facts = [RoundFacts(r["first"], sample_facts(r["baseline"]), sample_facts(r["candidate"])) for r in records]
    est = stats.estimate(samples["baseline"], samples["candidate"], threshold)
    return {"ratio": est.ratio, "interval": est.interval(level), "verdict": stats.verdict(est, threshold, level),
            "health": check_rounds(samples, facts, threshold, level, cpu_applies=True).to_dict()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--plant", type=float, default=15.0, help="the candidate's slowdown, percent")
    parser.add_argument("--sleep-plant", action="store_true", help="the plant sleeps instead of busy-waiting")
    parser.add_argument("--sample-s", type=float, default=0.25)
    parser.add_argument("--decide", action="store_true", help="a whole gate decision (compare) instead of raw rounds")
    parser.add_argument("--pin-nice", type=int, default=None, help="pin the arms to CPUs 0 and 1, a busy loop on 0")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="round-health-"))
    same, slow = copy_tree(ROOT, tmp / "same"), copy_tree(ROOT, tmp / "slow", args.plant / 100)
    if args.sleep_plant:
        trainer = slow / "mgpu" / "trainer.py"
        trainer.write_text(trainer.read_text().replace(BUSY, "        _time.sleep(max(0.0, end - _time.perf_counter()))"))
    name, spec, family = single_step_spec()
    settings, level = Settings(), Settings().alpha / family
    pools = start_workers({"baseline": (same, sys.executable), "candidate": (slow, sys.executable)}, 1, tmp / "w", True)
    burner = None
    if args.pin_nice is not None:
        for label, cpu in (("baseline", 0), ("candidate", 1)):
            os.sched_setaffinity(pools[label][0].proc.pid, {cpu})
        burner = subprocess.Popen(["taskset", "-c", "0", "nice", "-n", str(args.pin_nice), sys.executable, "-c",
                                   "while 1: pass"])
    began = time.time()
    try:
        if args.decide:
            r = compare(name, spec, pools, settings, family_size=family)
            plain = stats.verdict(r.estimate, settings.threshold, level) if r.status == "compared" else r.status
            judged = with_round_health(r, plain, level, settings.threshold) if r.status == "compared" else r
            result = {"plain": plain, "verdict": judged.verdict, "reason": judged.reason, "ratio": r.estimate.ratio,
                      "rounds": len(r.samples["baseline"]), "samples": r.samples, "facts": r.facts,
                      "health": judged.health.to_dict() if judged.health else None}
        else:
            records = probe(pools, spec, args.rounds, args.sample_s)
            result = {"records": records, **health_of(records, settings.threshold, level)}
    finally:
        if burner is not None:
            burner.kill()
        for arm in (a for pool in pools.values() for a in pool):
            arm.close()
        shutil.rmtree(tmp, ignore_errors=True)
    result.update(plant=args.plant, sleep_plant=args.sleep_plant, pin_nice=args.pin_nice, began=began,
                  load=os.getloadavg())
    Path(args.out).write_text(json.dumps(result, default=lambda x: None if not math.isfinite(x) else x) + "\n")
    print({k: result[k] for k in ("verdict", "ratio", "health") if k in result})


if __name__ == "__main__":
    main()
