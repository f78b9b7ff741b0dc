"""The gate keeps working across a renovation of mgpu's folders: `mgpu gate --baseline REF` against the
last commit before mgpu/check/ took in mgpu/parity and mgpu/scriptcheck (2026-11-28) sets up and times
both arms. The baseline's workers run the baseline tree's own code; what the candidate's harness asks of
them (the workload, the protocol) must still be understood there.

    pytest mgpu_perf_tests/test_gate_across_layouts.py
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mgpu_perf_tests.commands import mgpu_in_process

ROOT = Path(__file__).resolve().parent.parent
FIRST_NEW_LAYOUT_FILE = "mgpu/check/model/__init__.py"  # the renovation's first commit added it


def _before_the_renovation() -> str:
    """The parent of the commit that added FIRST_NEW_LAYOUT_FILE; skip where history does not reach it."""
    git = ["git", "-C", str(ROOT)]
    if subprocess.run([*git, "rev-parse", "--git-dir"], capture_output=True).returncode != 0:
        pytest.skip("this folder is not a git checkout: no commit from before the renovation to gate against")
    added = subprocess.run([*git, "log", "--diff-filter=A", "--format=%H", "--", FIRST_NEW_LAYOUT_FILE],
                           capture_output=True, text=True).stdout.split()
    if not added:
        pytest.skip(f"no commit here adds {FIRST_NEW_LAYOUT_FILE}: nothing to gate across")
    parent = subprocess.run([*git, "rev-parse", "--verify", "--quiet", f"{added[-1]}^"], capture_output=True, text=True)
    if parent.returncode != 0:
        pytest.skip("a shallow clone: the commit before the renovation is not here (git fetch --unshallow)")
    return parent.stdout.strip()


@pytest.mark.timeout(300)
def test_the_gate_times_both_arms_against_a_commit_from_before_the_checks_moved(tmp_path):
    baseline = _before_the_renovation()
    assert (ROOT / FIRST_NEW_LAYOUT_FILE).exists()
    assert subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{baseline}:mgpu/parity/check.py"]).returncode == 0, \
        f"{baseline} should hold the old layout (mgpu/parity/check.py)"
    out = tmp_path / "gate"
    # Three rounds of short samples at a 50 % threshold: the point is that both arms set up and time the
    # workload, not a verdict (beside load it may be inconclusive, or even slower: exit 1; or `undecidable`,
    # its three rounds timed but doubted by the round-health checks: a worker busy between them, seen at load 4).
    # The command's main in this process (its workers are processes of their own, one for each arm).
    done = mgpu_in_process("gate", "examples/tiny_lm.py:spec", "--baseline", baseline, "--max-rounds", "3",
                           "--sample-s", "0.05", "--threshold", "50", "--counts", "off", "--out", out, cwd=ROOT)
    assert done.returncode in (0, 1), f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report = json.loads((out / "ab.json").read_text())
    assert report["baseline"].startswith(baseline[:7]), report["baseline"]
    (bench,) = report["benchmarks"]
    assert bench["status"] in ("compared", "undecidable"), f"{bench['status']}: {bench['reason']}"  # not `not comparable`
    samples = bench["host_samples"]
    assert len(samples["baseline"]) == len(samples["candidate"]) == bench["rounds"] >= 3, samples
    assert all(s > 0 for s in samples["baseline"] + samples["candidate"]), samples
