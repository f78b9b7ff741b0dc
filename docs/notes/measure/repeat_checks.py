"""How often check-script calls a correct script wrong: the same check run R times, the verdicts counted.

    python docs/notes/measure/repeat_checks.py --repeats 20 SCRIPT [ARGS...]

Each repeat draws run B's random signs anew (MGPU_CHECK_PERTURB_SEED = the repeat's index): on one
machine a check is deterministic, so the draw is what a repeat changes, as another machine's rounding
would. Prints one line per run (verdict, first divergence if any, the worst error/allowed of each kind, seconds)
and a summary: passed R' of R. Used for docs/notes/check-runs.md, "False alarms over repeated checks".
"""

import argparse
import json
import os
import sys
import time

from mgpu.scriptcheck import run_check_script
from mgpu.check.script.launch import PERTURB_SEED_VARIABLE


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--json", default=None)
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    ranks = tuple(int(r) for r in a.ranks.split(","))
    rows = []
    for i in range(a.repeats):
        os.environ[PERTURB_SEED_VARIABLE] = str(i)  # each repeat draws run B's random signs anew
        t = time.time()
        report = run_check_script(a.script, a.args, ranks=ranks, steps=a.steps)
        worst = {f"{c.world}{' ' + c.precision if c.precision else ''}": {k: round(w["ratio"], 3) for k, w in c.worst.items()}
                 for c in report.comparisons}
        rows.append({"run": i + 1, "verdict": str(report.verdict), "summary": report.summary()[:200],
                     "worst_ratio": worst, "seconds": round(time.time() - t, 1)})
        print(json.dumps(rows[-1]), flush=True)
    passed = sum(r["verdict"] == "passed" for r in rows)
    print(f"passed {passed} of {len(rows)}: {a.script} {' '.join(a.args)}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"script": a.script, "args": a.args, "ranks": ranks, "steps": a.steps, "runs": rows}, f, indent=1)
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
