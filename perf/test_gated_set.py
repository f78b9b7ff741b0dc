"""The gated set (mgpu_perf/gated.py) against what this suite marks `mgpu_gate`: the A/B gate times
exactly the benchmarks its rates were measured on.

    pytest perf
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgpu_perf.gated import gated_set


def test_the_suite_gates_exactly_the_gated_set(request, sweep):
    """mgpu_perf/gated.py is the one definition: the benchmarks this session collected with an `mgpu_gate`
    marker are its set, with its specs (a benchmark marked elsewhere, or a spec that differs from
    the one validate-gate measures the rates with, fails here)."""
    items = request.session.items
    if not {"test_training.py", "test_kernels.py"} <= {Path(str(item.path)).name for item in items}:
        pytest.skip("needs the whole perf folder collected (pytest perf)")
    collected = {item.name for item in items}
    if any(name not in collected for name, _ in gated_set(sweep)):
        pytest.skip("a -k or -m selection left part of the gated set out")
    marked = {(item.name, json.dumps(item.get_closest_marker("mgpu_gate").args[0], sort_keys=True))
              for item in items if item.get_closest_marker("mgpu_gate")}
    expected = {(name, json.dumps(spec, sort_keys=True)) for name, spec in gated_set(sweep)}
    assert marked == expected, f"marked but not in the set: {sorted(marked - expected)}; in the set but not marked: " \
                               f"{sorted(expected - marked)}"
