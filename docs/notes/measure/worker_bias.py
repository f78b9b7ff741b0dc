"""How much two identical gate workers differ, and whether placement or the hash seed is why.

    python docs/notes/measure/worker_bias.py 10 worker-bias.json     # ~10 minutes here (10 decisions a condition)

Both arms the same tree (two copies of this checkout), fresh workers per decision, 16 rounds each
(no early stop), the single training step as validate-gate times it. Four conditions, interleaved
decision by decision: free placement; both workers pinned to CPU 0; both pinned to CPU 1; and
PYTHONHASHSEED=0 in both. For each it prints the sd of the measured ratio across decisions (the
bias of one pair of processes against another) beside the mean standard error within a decision
(what more rounds would shrink). The figures are in docs/notes/perf.md ("What misses is the pair of
worker processes").
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from mgpu_perf.gate import stats as gate_stats  # noqa: E402
from mgpu_perf.gate.arm import Arm  # noqa: E402
from mgpu_perf.gate.compare import Settings, compare  # noqa: E402
from mgpu_perf.lab.validate_gate import copy_tree, single_step_spec  # noqa: E402

CONDITIONS = {"free": (None, None), "cpu0": ({0}, None), "cpu1": ({1}, None), "hashseed0": (None, "0")}


class PinnedArm(Arm):
    """A worker whose every thread is moved onto `cpus` before each request (threads it made since too)."""

    cpus: set | None = None

    def _pin(self) -> None:
        if self.cpus is None:
            return
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            try:
                os.sched_setaffinity(int(tid), self.cpus)
            except OSError:  # a thread that ended meanwhile
                pass

    def send(self, command, **fields):
        self._pin()
        return super().send(command, **fields)

    def request(self, command, **fields):
        self._pin()
        return super().request(command, **fields)


def one_decision(a: Path, b: Path, tmp: Path, cpus, hash_seed) -> dict:
    name, spec, family = single_step_spec()
    run_dir, arms = Path(tempfile.mkdtemp(dir=tmp)), {}
    saved = os.environ.get("PYTHONHASHSEED")
    if hash_seed is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = hash_seed
    PinnedArm.cpus = cpus
    try:
        arms["baseline"] = PinnedArm("baseline", a, sys.executable, run_dir, require_mgpu=True)
        arms["candidate"] = PinnedArm("candidate", b, sys.executable, run_dir, require_mgpu=True)
        result = compare(name, spec, arms, Settings(threshold=0.05, min_rounds=16, max_rounds=16), family_size=family)
    finally:
        for arm in arms.values():
            arm.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        if saved is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = saved
    est = gate_stats.estimate(result.samples["baseline"], result.samples["candidate"], 0.05)
    return {"samples": result.samples, "log_ratio": est.mean_log_ratio, "se": est.se}


def main() -> None:
    decisions, out = int(sys.argv[1]), Path(sys.argv[2])
    kept = {c: [] for c in CONDITIONS}
    with tempfile.TemporaryDirectory(prefix="mgpu-worker-bias-") as tmp:
        tmp = Path(tmp)
        a, b = copy_tree(ROOT, tmp / "a"), copy_tree(ROOT, tmp / "b")
        for i in range(decisions):
            for condition, (cpus, hash_seed) in CONDITIONS.items():
                d = one_decision(a, b, tmp, cpus, hash_seed)
                kept[condition].append(d)
                print(f"{i + 1:2} {condition:<9} ratio {math.exp(d['log_ratio']):.4f} se {d['se']:.2%}",
                      flush=True)
                out.write_text(json.dumps(kept))
    for condition, ds in kept.items():
        logs = [d["log_ratio"] for d in ds]
        print(f"{condition:<9} sd across decisions {statistics.stdev(logs):.2%}, mean se within one "
              f"{statistics.fmean(d['se'] for d in ds):.2%}, range {min(logs):+.1%}..{max(logs):+.1%}")


if __name__ == "__main__":
    main()
