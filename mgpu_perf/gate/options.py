"""The gate's option names that are not its Settings: GRAPH_MODES, --ab-graphs' choices, which
harness/graphs.py takes from here. The gate's own options are declared once, as fields of
gate/settings.py's Settings (mgpu/options.py's `option`); the counted baseline's in counts/options.py.

A leaf: it imports nothing of mgpu or mgpu_perf (the harness's worker side imports it too).
"""

from __future__ import annotations

__all__ = ["GRAPH_MODES"]

GRAPH_MODES = ("auto", "on", "off")  # --ab-graphs (harness/graphs.py takes them from here)
