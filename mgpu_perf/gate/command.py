"""`python -m mgpu gate MODULE:FUNCTION --baseline REF`: the A/B gate on your model's training step,
without writing a test. Run it in your repository (mgpu installed): the candidate is the working
tree, the baseline is REF (a revision of that repository, or another checkout of it).

    python -m mgpu gate mymodel.py:spec --baseline origin/main
    python -m mgpu gate mymodel.py:spec --baseline HEAD~1 --strategies single,ddp --devices 1,2 --threshold 5

Each (strategy, devices) is one gated benchmark, exactly as an `mgpu_gate` marker with those fields
(docs/guide/gate.md): the same workers, rounds, statistics, verdicts and reports (ab.json in --out).
Exit codes: 0 no benchmark `slower` (nor `inconclusive` with --strict), 1 one is, or a workload
failed in an arm (named); 2 bad input (one line: a bad option, a REF that is not a revision of this
repository, a model the working tree cannot load).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

__all__ = ["gate_cases", "model_in_repository", "run_gate_command"]


def model_in_repository(model: str, root: Path) -> str:
    """`model` as the workers find it from the repository root (their working folder): a .py path
    made relative to `root`; ValueError if the file lies outside the repository."""
    module_part, function = model.rsplit(":", 1)
    if not (module_part.endswith(".py") or "/" in module_part or os.sep in module_part):
        return model
    path = Path(module_part).resolve()
    try:
        relative = path.relative_to(root)
    except ValueError:
        raise ValueError(f"{model}: the file is outside the repository at {root}, so the baseline (a revision of "
                         "that repository) cannot hold it") from None
    return f"{relative.as_posix()}:{function}"


def _as_command_options(message: str) -> str:
    """The gate's messages name the pytest options (--ab-baseline); this command's are --baseline, ..."""
    return message.replace("--ab-", "--")


def gate_cases(model: str, strategies, devices, batch: int, input_shape=None, classes=None) -> list[tuple[str, dict]]:
    """(benchmark name, workload spec) per strategy and device count; single runs on one device only."""
    from mgpu_perf.markers import model_step_spec

    cases = []
    for strategy in strategies:
        for n in devices:
            if strategy == "single" and n != 1:
                continue
            cases.append((f"{strategy}-{n}", model_step_spec(model, strategy, n, batch, input_shape, classes)))
    if not cases:
        raise ValueError("no benchmark to gate: give --strategies and --devices (single runs on 1 device only)")
    return cases


def run_gate_command(options, error: Callable[[str], None]) -> int:
    """The command, from its options (gate/settings.py's GateOptions, read and checked); `error` is
    the parser's (one line, exit 2)."""
    from mgpu.errors import EXIT_FAILED, EXIT_USAGE, MgpuError, one_line
    from mgpu_perf.clocks import gpu_clocks
    from mgpu_perf.errors import GateError
    from mgpu_perf.gate.arm import ArmError
    from mgpu_perf.gate.baseline import read_trees, repository_root
    from mgpu_perf.gate.run import GateRun

    root = repository_root(Path.cwd())
    try:
        model = model_in_repository(options.model, root)
        cases = gate_cases(model, options.strategies, options.devices, options.batch, options.input_shape, options.classes)
        trees = read_trees(root, options.baseline, options.baseline_python)
    except (GateError, ValueError) as e:
        error(_as_command_options(one_line(e)))
    from mgpu.spec import load_spec  # torch: after the checks above, so that bad input there fails at once
    from mgpu_perf.harness.models import module_file

    try:  # the candidate must load it: a typo is bad input here, not a failed arm
        load_spec(model if Path.cwd() == root else options.model, input_shape=options.input_shape, classes=options.classes)
    except MgpuError as e:
        error(f"{options.model}: {one_line(e)}")
    origin = module_file(options.model)
    if origin and not Path(origin).resolve().is_relative_to(root):
        error(f"{options.model}: its module comes from {origin}, outside the repository at {root}: both arms would "
              "time the same code (gate a model defined in this repository)")
    run = GateRun(options.settings, trees, gpu_clocks())
    status = EXIT_FAILED
    try:
        for name, spec in cases:
            print(f"mgpu gate: {name} ...", file=sys.stderr, flush=True)
            result = run.compare(name, spec, len(cases))
            if result.status in ("not comparable", "undecidable"):
                print(f"mgpu gate: {name}: {result.status}: {_as_command_options(result.reason)}", file=sys.stderr,
                      flush=True)
        status = run.finish(Path(options.out))
    except GateError as e:
        print(f"mgpu: error: {_as_command_options(one_line(e))}", file=sys.stderr)
        return EXIT_USAGE
    except ArmError as e:
        run.finish(Path(options.out))
        print(f"mgpu: error: a workload failed: {one_line(e)}", file=sys.stderr)
        status = EXIT_FAILED
    finally:
        print(_as_command_options("\n".join(run.summary_lines())))
        run.close()
    return status
