"""The house rules a newcomer relies on: imports run one way (mgpu never imports mgpu_perf, and no
module imports one that imports it back, at any depth, lazily or not), and the commands mgpu_perf
adds reach mgpu's command line through the hook (mgpu/cli.py, COMMANDS_GROUP / COMMANDS_ENV)."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mgpu", "mgpu_perf")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _parsed(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once for the module's tests (read only: ast.walk)."""
    return ast.parse(path.read_text(), str(path))


@functools.cache
def _imports(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Every module of `packages` (both packages) and the modules of them it imports, anywhere in it
    (computed once: three tests read it, none changes it)."""
    modules = {_module_name(p): p for pkg in packages for p in (ROOT / pkg).rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(_parsed(path)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # `from pkg import name`: the module that holds it
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _is_package(name: str) -> bool:
    return (ROOT / name.replace(".", "/") / "__init__.py").exists()


def _without_package_inits(graph):
    """A package's __init__ re-exporting its modules is not an arrow back from them to it."""
    return {m: {t for t in ts if not (_is_package(t) and m.startswith(t + "."))} for m, ts in graph.items()}


def test_mgpu_never_imports_mgpu_perf():
    offenders = {m: sorted(t for t in ts if t.split(".")[0] == "mgpu_perf")
                 for m, ts in _imports().items() if m.split(".")[0] == "mgpu"}
    offenders = {m: ts for m, ts in offenders.items() if ts}
    assert not offenders, f"mgpu imports mgpu_perf (mgpu_perf adds its commands through mgpu.cli's hook): {offenders}"


CHECKS = ("mgpu.check.model", "mgpu.check.script")  # `mgpu check` and `mgpu check-script`
INRANK = "mgpu.check.script.inrank"


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _core_modules() -> list[str]:
    """The modules at the top of the check core (mgpu/check/*.py), its __init__ aside."""
    return sorted(f"mgpu.check.{p.stem}" for p in (ROOT / "mgpu/check").glob("*.py") if p.stem != "__init__")


def test_the_two_checks_never_import_each_other():
    """`check` (mgpu.check.model) and `check-script` (mgpu.check.script) share only the core at the top of
    mgpu.check: what they share lives there, and the core imports neither."""
    crossings = {m: sorted(t for t in ts if any(_within(t, other) for other in CHECKS if not _within(m, other)))
                 for m, ts in _imports().items() if _within(m, "mgpu.check")}
    crossings = {m: ts for m, ts in crossings.items() if ts}
    assert not crossings, f"a check (or the core) imports the other check: {crossings}"


def test_every_module_at_the_top_of_the_check_core_is_used_by_both_checks():
    """A module that only one check uses belongs in that check's folder, not in the shared core."""
    graph = _imports()
    users = {core: {c for c in CHECKS if any(_within(m, c) and core in ts for m, ts in graph.items())}
             for core in _core_modules()}
    one_sided = {core: sorted(u) for core, u in users.items() if u != set(CHECKS)}
    assert not one_sided, f"core modules not used by both checks (only by these): {one_sided}"


def test_the_code_that_runs_in_the_users_process_imports_nothing_of_the_judging_side():
    """check-script's inrank/ package runs inside every rank of the user's script: it may import itself,
    the plan it is handed (mgpu.check.script.plan), the core and mgpu's own modules; never the judge,
    the comparisons or the causes (which would load them into every rank, and blur which side is which)."""
    allowed = lambda t: (_within(t, INRANK) or t in ("mgpu.check.script.plan", "mgpu.check.script")  # noqa: E731
                         or t in _core_modules() or t == "mgpu.check" or not _within(t, "mgpu.check"))
    offenders = {m: sorted(t for t in ts if not allowed(t)) for m, ts in _imports().items() if _within(m, INRANK)}
    offenders = {m: ts for m, ts in offenders.items() if ts}
    assert not offenders, f"in-rank modules import the judging side: {offenders}"


def test_class_names_are_unique_across_both_packages():
    """One name, one class: a reader who meets `ScriptCheckPlan` never has to ask which one."""
    where: dict[str, list[str]] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(_parsed(path)):
                if isinstance(node, ast.ClassDef):
                    where.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not twice, f"class names defined more than once: {twice}"


def test_every_package_folder_is_in_the_readmes_folder_table():
    readme = (ROOT / "README.md").read_text()
    folders = sorted(str(p.parent.relative_to(ROOT)) + "/" for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py"))
    missing = [f for f in folders if f"`{f}`" not in readme]
    assert not missing, f"package folders README.md's folder table does not name (as `path/`): {missing}"


def test_the_public_faces_only_hand_names_on():
    """mgpu.parity and mgpu.scriptcheck are where users import the checks from (and `python -m
    mgpu.scriptcheck`); the checks live in mgpu/check/, so the faces define nothing of their own."""
    for face in ("mgpu/parity/__init__.py", "mgpu/scriptcheck/__init__.py"):
        defined = [n.name for n in _parsed(ROOT / face).body
                   if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name != "__getattr__"]
        assert not defined, f"{face} defines {defined}: it belongs in mgpu/check/"
    import mgpu.parity
    import mgpu.scriptcheck
    from mgpu.check.model import check_data_parallel
    from mgpu.check.script import check_script

    assert mgpu.parity.check_data_parallel is check_data_parallel and mgpu.scriptcheck.check_script is check_script


def test_no_function_takes_more_than_eight_parameters():
    """A function that needs more is handed an options object (not **kwargs to dodge the count)."""
    crowded = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(_parsed(path)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = node.args
                    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                    count = len(names) + (a.vararg is not None) + (a.kwarg is not None) - (names[:1] in (["self"], ["cls"]))
                    if count > 8:
                        crowded.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({count})")
    assert not crowded, f"functions with more than 8 parameters: {crowded}"


def test_no_module_is_longer_than_400_lines():
    long = [f"{p.relative_to(ROOT)} ({n})" for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 400]
    assert not long, f"modules over 400 lines (split them by job): {long}"


OPTION_ADDERS = ("add_argument", "addoption")  # argparse's and pytest's


def _option_adder_calls(path: Path, root: Path = ROOT) -> list[str]:
    """Each call of a function or method named add_argument or addoption in the module, as path:line
    (a name in a string, such as scriptargs.py's matching of a user's script, is no call)."""
    calls = []
    for node in ast.walk(_parsed(path)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name in OPTION_ADDERS:
                calls.append(f"{path.relative_to(root)}:{node.lineno}")
    return calls


def test_an_option_is_declared_once_only_the_mechanism_calls_add_argument_or_addoption():
    """mgpu's and mgpu_perf's commands, the lab tools and the pytest plugin declare their options on
    their options classes' fields (mgpu/options.py's `option`): no module of mgpu/ or mgpu_perf/ but
    the mechanism calls argparse's add_argument or pytest's addoption itself (examples and conftests
    aside: they are not in these packages)."""
    calls = [call for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
             if p != ROOT / "mgpu" / "options.py" for call in _option_adder_calls(p)]
    assert not calls, f"add_argument/addoption called outside mgpu/options.py (declare the option on a field): {calls}"


def test_the_option_call_finder_finds_a_call_and_not_a_string(tmp_path):
    """The finder above: a method call and a bare call count; the names in a string do not."""
    module = tmp_path / "m.py"
    module.write_text("parser.add_argument('--a')\n"
                      "addoption('--b')\n"
                      "text = 'parser.add_argument(\"--c\")'\n"
                      "group.addoption\n")
    assert _option_adder_calls(module, root=tmp_path) == ["m.py:1", "m.py:2"]


def test_no_import_circles():
    cycle = _cycle(_without_package_inits(_imports()))
    assert cycle is None, f"an import circle: {' -> '.join(cycle)}"


def test_the_correctness_suites_modules_import_no_circle():
    """The suite's helpers (shared_runs, shared_jobs, helpers) import no test module that imports them back."""
    cycle = _cycle(_without_package_inits(_imports(("correctness",))))
    assert cycle is None, (f"an import circle in the correctness suite: {' -> '.join(cycle)} (what a helper and a "
                           "test module both need belongs in a helper module, such as correctness/shared_jobs.py)")


def test_a_command_provider_named_in_the_environment_joins_the_command_line(tmp_path, monkeypatch, capsys):
    """The hook as a checkout without install uses it: a module named in MGPU_COMMANDS adds a command."""
    from mgpu import cli

    (tmp_path / "hello_commands.py").write_text(
        "def add_commands(commands):\n"
        "    p = commands.add_parser('hello')\n"
        "    p.add_argument('--name', default='world')\n"
        "    return {'hello': lambda parser, args: print(f'hello {args.name}') or 3}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(cli.COMMANDS_ENV, "hello_commands, no_such_module_anywhere")
    assert cli.main(["hello", "--name", "mgpu"]) == 3
    assert capsys.readouterr().out == "hello mgpu\n"
    monkeypatch.delenv(cli.COMMANDS_ENV)
    with pytest.raises(SystemExit) as raised:
        cli.main(["hello"])
    assert raised.value.code == 2, "without the provider, the command is unknown: one line, exit 2"
    assert "invalid choice: 'hello'" in capsys.readouterr().err
    sys.modules.pop("hello_commands", None)


def test_bench_and_gate_come_from_mgpu_perf_through_the_hook(monkeypatch):
    from mgpu import cli

    monkeypatch.setenv(cli.COMMANDS_ENV, "mgpu_perf.cli")  # installed or not, the same provider
    mains = cli.build_parser().get_default("command_mains")
    assert set(mains) == {"check", "check-script", "bench", "gate", "history"}, mains
    assert {mains[c].__module__ for c in ("bench", "gate", "history")} == {"mgpu_perf.cli"}


def test_a_provided_command_missing_here_is_one_line_naming_how_to_get_it(monkeypatch, capsys):
    from mgpu import cli

    monkeypatch.setattr(cli, "_command_providers", lambda: [])  # as a checkout used without install
    with pytest.raises(SystemExit) as raised:
        cli.main(["bench", "model.py:spec"])
    err = capsys.readouterr().err
    assert raised.value.code == 2 and err.count("\n") == 1, err
    assert "'bench' is added by mgpu_perf" in err and "python -m mgpu_perf bench" in err, err


def test_mgpu_perf_runs_bench_and_gate_without_the_install(monkeypatch, capsys):
    import importlib.metadata

    from mgpu import cli
    from mgpu_perf.commands import main

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **_: [])  # no install: only the environment
    monkeypatch.delenv(cli.COMMANDS_ENV, raising=False)
    with pytest.raises(SystemExit) as raised:
        main(["gate", "model.py:spec"])
    assert raised.value.code == 2 and "gate needs --baseline" in capsys.readouterr().err


SCRIPT = ROOT / "mgpu/check/script"
CAUSES = "mgpu.check.script.causes"


def _composed(node: ast.expr) -> bool:
    """Text made on the spot: a string literal, an f-string, a concatenation, or an `or`/`if` that holds one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.JoinedStr, ast.BinOp)):
        return True
    if isinstance(node, ast.BoolOp):
        return any(_composed(v) for v in node.values)
    if isinstance(node, ast.IfExp):
        return _composed(node.body) or _composed(node.orelse)
    return False


def test_check_scripts_causes_are_worded_only_in_its_causes_package():
    """A cause's words live in mgpu/check/script/causes/ (one home: the evidence it needs, the words it
    says); the comparing and judging modules hand a `diagnosis=` what a cause there returns, never text
    they compose themselves."""
    composed = []
    for path in sorted(SCRIPT.rglob("*.py")):
        if (SCRIPT / "causes") in path.parents:
            continue
        for node in ast.walk(_parsed(path)):
            if isinstance(node, ast.Call):
                composed += [f"{path.relative_to(ROOT)}:{k.value.lineno}" for k in node.keywords
                             if k.arg == "diagnosis" and _composed(k.value)]
    assert not composed, f"diagnosis= given text composed outside mgpu/check/script/causes/: {composed}"
    assert (SCRIPT / "causes/__init__.py").exists(), "check-script's causes have no home (mgpu/check/script/causes/)"


def test_the_causes_are_loaded_by_the_judging_side_only():
    """causes/ is the judge's: no module that runs in the user's process (inrank/) imports it; a cause
    that needs new evidence has it recorded there, and worded in causes/."""
    assert (SCRIPT / "causes/__init__.py").exists(), "check-script's causes have no home (mgpu/check/script/causes/)"
    offenders = {m: sorted(t for t in ts if _within(t, CAUSES)) for m, ts in _imports().items() if _within(m, INRANK)}
    offenders = {m: ts for m, ts in offenders.items() if ts}
    assert not offenders, f"in-rank modules import the causes: {offenders}"


# A process's exit code is assigned in mgpu/errors.py's table alone. Left out, each for its reason: the gate's
# worker runs against a baseline tree's mgpu, which may predate the table; a rank's os._exit when its launcher
# died, and faults.py's simulated crash, are not a command's answer.
EXIT_CODE_EXEMPT = {"mgpu_perf/gate/worker.py", "mgpu/launch.py:_exit", "mgpu/faults.py:_exit"}


def test_exit_codes_are_assigned_in_mgpu_errors_alone():
    misplaced = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel in ("mgpu/errors.py", *EXIT_CODE_EXEMPT):
                continue
            for node in ast.walk(_parsed(path)):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and type(node.value.value) is int:
                    names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                    misplaced += [f"{rel}:{node.lineno}: {n} = {node.value.value}" for n in names
                                  if n.startswith("EXIT_") or n.endswith("_EXIT")]
                if isinstance(node, ast.FunctionDef) and node.name.endswith(("main", "command")):
                    misplaced += [f"{rel}:{r.lineno}: {node.name} returns {r.value.value}" for r in ast.walk(node)
                                  if isinstance(r, ast.Return) and isinstance(r.value, ast.Constant)
                                  and type(r.value.value) is int]
                if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                        and type(node.args[0].value) is int:
                    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                    if name in ("exit", "SystemExit", "_exit") and f"{rel}:{name}" not in EXIT_CODE_EXEMPT:
                        misplaced.append(f"{rel}:{node.lineno}: {name}({node.args[0].value})")
    assert not misplaced, ("exit codes assigned outside mgpu/errors.py's table (use its EXIT_* names):\n  "
                           + "\n  ".join(misplaced))
