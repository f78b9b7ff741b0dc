"""The lab (mgpu_perf/lab/: the tools that measure the gate) stays apart from the gate a user's run
goes through: the gate never imports it, at any depth, lazily or not. The lab may import the gate.
(correctness/test_layout.py holds the rules of both packages: no circles, parameters, lines.)"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "mgpu_perf"


def _imports() -> dict[str, set[str]]:
    """Every mgpu_perf module and the mgpu_perf names it imports, anywhere in it (a `from a import b`
    gives both a and a.b: b may be a module)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(("mgpu_perf", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.update([node.module, *(f"{node.module}.{a.name}" for a in node.names)])
        graph[name] = {t for t in found if t.startswith("mgpu_perf")}
    return graph


def test_the_gate_never_imports_the_lab():
    graph = _imports()
    reached, todo = set(), [name for name in graph if name.startswith("mgpu_perf.gate")]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(t for t in graph.get(name, ()) if t in graph)
    lab = sorted(name for name in reached if name.startswith("mgpu_perf.lab"))
    assert not lab, f"the gate reaches the lab: {lab}"
