"""Proof that the gate's counted verdict (gate/counted.py) catches the changes a step does that
timing cannot call, measured on this machine.

    python -m mgpu_perf validate-counts                         # 10 runs a plant, 20 A/A runs (about 40 minutes)
    python -m mgpu_perf validate-counts --runs 2 --aa-runs 0 --plants host-read,extra-all-reduce
    python -m mgpu_perf validate-counts --runs 0 --aa-runs 0 --overhead 6   # counting's cost only

Run it from a checkout of mgpu with nothing else on the machine; it is not part of CI. It copies
the tree into a temporary folder: `same` (the baseline of every run), `unchanged` (identical to
it), and one copy per plant, each with one small structural regression appended to one of mgpu's
files (PLANTS: an extra copy in the forward, a float64 layer, a host read a step, an extra
all-reduce in ddp, a graph break under --compile, a boolean-mask index, activation checkpointing of a stage, a
checkpoint every step).
Each run is a whole gate decision on the benchmark the plant touches, with fresh workers, as
`pytest perf --ab-baseline` makes it: the timed verdict and the counted one. Required: every plant `slower (counted)` in every run, with the change
named; every A/A run (the unchanged copy, rotated over the plants' benchmarks and fsdp) with no
count difference at all. The timed verdicts are reported beside: the plants are sized so that
timing alone cannot call them here.

`--overhead N`: N pairs of A/A decisions on the single step with counting on and off (`--ab-counts
off`), interleaved on, off, off, on, ...: what counting adds to a gate run. Every decision also
records the seconds its counted step took (`count_s`), its share of the decision beside.

Writes count-validation.json into --out; exits 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, replace
from pathlib import Path

from mgpu.options import Options, at_least, comma_list, option, options_group, whole_number
from mgpu_perf.counts.judge import SAME, SLOWER_COUNTED
from mgpu_perf.errors import GateError
from mgpu_perf.gate.settings import Settings
from mgpu_perf.lab.validate_gate import copy_tree, one_decision


@dataclass(frozen=True)
class Plant:
    file: str          # the file of mgpu it is appended to
    code: str
    strategy: str      # the gated training step it shows in
    devices: int
    compile: bool = False
    what: str = ""


_HEADER = "\n\n# -- planted by mgpu_perf/lab/validate_counts.py: {what}\n"


def _in_resnet18(body: str) -> str:
    """Code for mgpu/models.py: `resnet18` builds the model as before, then `body` changes `model`."""
    return """
_built_resnet18 = resnet18


def resnet18(*args, **kwargs):
    model = _built_resnet18(*args, **kwargs)
""" + textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + """
    return model
"""


def _after_trainer_step(body: str) -> str:
    """Code for mgpu/trainer.py: `Trainer.step` steps as before, then runs `body` (with `self`)."""
    return """
_unplanted_step = Trainer.step


def _planted_step(self, indices, epoch=0, step=0):
    result = _unplanted_step(self, indices, epoch, step)
""" + textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + """
    return result


Trainer.step = _planted_step
"""


PLANTS = {
    # One copy of the input batch in the forward: at width 16 a 0.1 MB copy against a step of tens of ms.
    "copy-in-forward": Plant("mgpu/models.py", _in_resnet18("""
        model[0].register_forward_pre_hook(lambda module, args: (args[0].clone(),))
    """), "single", 1, what="an extra copy of the input in the forward"),
    # The classifier computed in float64: a 10-way linear layer, a sliver of the step's work.
    "float64-layer": Plant("mgpu/models.py", _in_resnet18("""
        head = model[-1]
        head.forward = lambda x: torch.nn.functional.linear(x.double(), head.weight.double(), head.bias.double()).float()
    """), "single", 1, what="the last layer in float64"),
    # One more read of a value by the host a step (on a CPU nearly free; on a GPU a device sync).
    "host-read": Plant("mgpu/trainer.py", _after_trainer_step("""
        next(self.strategy.modules()[0].parameters()).detach().flatten()[0].item()
    """), "single", 1, what="a host read a step"),
    # One more all-reduce of a single number a step.
    "extra-all-reduce": Plant("mgpu/strategies/ddp.py", '''
_unplanted_optimizer_step = DistributedDataParallel.optimizer_step


def _optimizer_step_with_an_all_reduce(self):
    _unplanted_optimizer_step(self)
    dist.all_reduce(torch.ones(1, device=self.devices[0]))


DistributedDataParallel.optimizer_step = _optimizer_step_with_an_all_reduce
''', "ddp", 2, what="an extra all-reduce a step in ddp"),
    # A graph break at the top of the forward: the graph after it is the whole network, as before.
    # (One in a layer's hook, inside nn.Sequential's loop, makes dynamo run the loop eagerly: 1.5
    # times the step under inductor on this CPU, which timing calls.)
    "graph-break": Plant("mgpu/models.py", _in_resnet18("""
        def forward(x):
            torch._dynamo.graph_break()
            return torch.nn.Sequential.forward(model, x)

        model.forward = forward
    """), "single", 1, compile=True, what="a graph break under --compile"),
    # A boolean mask before the classifier that keeps every row: the same logits, but on a GPU the host
    # waits for the mask's count twice a step (the forward's index, the backward's index_put).
    "mask-index": Plant("mgpu/models.py", _in_resnet18("""
        head = model[-1]
        unplanted_head_forward = head.forward
        head.forward = lambda x: unplanted_head_forward(x[x.abs().sum(dim=1) >= 0])
    """), "single", 1, what="a boolean-mask index in the forward (a sync on a GPU)"),
    # Activation checkpointing switched on for the first residual stage: its forward runs again in the
    # backward (torch.utils.checkpoint, non-reentrant), 4 of the 20 convolutions twice; the counters see
    # the recomputation (it runs with the dispatch modes on), FLOPs +8 % at width 16.
    "activation-checkpointing": Plant("mgpu/models.py", _in_resnet18("""
        import torch.utils.checkpoint

        stage = model[3]
        unplanted_stage_forward = stage.forward
        stage.forward = lambda x: torch.utils.checkpoint.checkpoint(unplanted_stage_forward, x, use_reentrant=False)
    """), "single", 1, what="activation checkpointing of a residual stage (its forward recomputed in the backward)"),
    # The model's state saved every step (to memory): no aten op runs on a CPU, only Python's pickling.
    "checkpoint-every-step": Plant("mgpu/trainer.py", _after_trainer_step("""
        import io

        torch.save(self.strategy.modules()[0].state_dict(), io.BytesIO())
    """), "single", 1, what="a checkpoint saved every step"),
}

# The A/A runs rotate over these benchmarks: every plant's, and fsdp's (strategy, devices, compile).
AA_CASES = (("single", 1, False), ("ddp", 2, False), ("fsdp", 2, False), ("manual", 2, False), ("single", 1, True))


def plant(tree: Path, p: Plant) -> Path:
    target = tree / p.file
    target.write_text(target.read_text() + _HEADER.format(what=p.what) + p.code.lstrip("\n"))
    return tree


def benchmark(strategy: str, devices: int, compile: bool) -> tuple[str, dict, int]:
    """The gated training step of (strategy, devices) as the gate runs it, and the gated set's size."""
    from mgpu_perf.gated import Case, case_id, gated_set, train_spec
    from mgpu_perf.sweep import make_sweep

    sweep = make_sweep(None)
    case = Case(strategy, devices)
    spec = train_spec("train-step", case, sweep)
    if compile:
        spec["compile"] = True
    return f"test_train_step[{case_id(case, sweep)}]", spec, len(gated_set(sweep))


def decide(same: Path, candidate: Path, case: tuple, tmp: Path, settings: Settings) -> dict:
    name, spec, family = benchmark(*case)
    d = one_decision(same, candidate, name, spec, family, tmp, settings)
    d.pop("samples", None)
    d.pop("plans", None)
    d["benchmark"] = name + (" --compile" if case[2] else "")
    return d


def _line(kind: str, i: int, d: dict) -> str:
    changes = "; ".join(d["count_changes"][:3]) or d["count_reason"] or "no count difference"
    return (f"   run {i + 1:>2} {kind:<17} counted {d['counted']:<16} timed {d['verdict']:<12} "
            f"ratio {d['ratio']:.3f} {d['rounds']:>3} rounds {d['seconds']:.0f} s (counting {d['count_s']:.1f} s): "
            f"{changes}")


def run_plants(copies: dict, names: list[str], runs: int, aa_runs: int, tmp: Path, settings: Settings,
               partial: Path) -> dict[str, list[dict]]:
    """`runs` decisions per plant and `aa_runs` A/A decisions, interleaved; each written to `partial` as it ends."""
    results: dict[str, list[dict]] = {**{n: [] for n in names}, "A/A": []}
    for i in range(max(runs, aa_runs)):
        jobs = [(n, copies[n], (PLANTS[n].strategy, PLANTS[n].devices, PLANTS[n].compile)) for n in names] if i < runs else []
        if i < aa_runs:
            jobs.append(("A/A", copies["unchanged"], AA_CASES[i % len(AA_CASES)]))
        for kind, candidate, case in jobs:
            d = decide(copies["same"], candidate, case, tmp, settings)
            results[kind].append(d)
            partial.write_text(json.dumps(results) + "\n")
            print(_line(kind, i, d), flush=True)
    return results


def measure_overhead(copies: dict, pairs: int, tmp: Path, settings: Settings) -> dict:
    """A/A decisions on the single step with counting on and off, interleaved (on, off, off, on, ...).
    A decision's rounds are as many as its noise asks, so whole decisions differ by more than
    counting costs; what counting adds is the time outside the rounds (set-up, warm-up, the counted
    step) and any change in a round's time, each compared between the interleaved arms."""
    runs: dict[str, list[dict]] = {"gate": [], "off": []}
    case = ("single", 1, False)
    for i in range(pairs):
        for mode in (("gate", "off") if i % 2 == 0 else ("off", "gate")):
            d = decide(copies["same"], copies["unchanged"], case, tmp, replace(settings, counts=mode))
            d["outside_rounds_s"] = d["seconds"] - d["rounds"] * d["round_s"]
            runs[mode].append(d)
            print(f"   overhead pair {i + 1:>2} counts {mode:<4} {d['seconds']:.1f} s: {d['rounds']} rounds of "
                  f"{d['round_s']:.3f} s, {d['outside_rounds_s']:.1f} s outside them (counting {d['count_s']:.2f} s)",
                  flush=True)

    def median(mode: str, key: str) -> float:
        return statistics.median(d[key] for d in runs[mode])

    added = median("gate", "outside_rounds_s") - median("off", "outside_rounds_s")
    return {"pairs": pairs, "runs": {m: [{k: d[k] for k in ("seconds", "rounds", "round_s", "outside_rounds_s",
                                                            "count_s")} for d in ds] for m, ds in runs.items()},
            "outside_rounds_on_s": median("gate", "outside_rounds_s"),
            "outside_rounds_off_s": median("off", "outside_rounds_s"),
            "round_s_ratio": median("gate", "round_s") / median("off", "round_s"),
            "decision_off_s": median("off", "seconds"), "added_s": added,
            "ratio": (median("off", "seconds") + added) / median("off", "seconds")}


def summarise(results: dict, overhead: dict | None, settings: Settings, total: float) -> dict:
    plants = {n: rs for n, rs in results.items() if n != "A/A" and rs}
    aa = results.get("A/A", [])
    caught = {n: sum(d["counted"] == SLOWER_COUNTED for d in rs) for n, rs in plants.items()}
    timed = {n: {v: sum(d["verdict"] == v for d in rs) for v in sorted({d["verdict"] for d in rs})}
             for n, rs in {**plants, **({"A/A": aa} if aa else {})}.items()}
    aa_clean = sum(d["counted"] == SAME and not d["count_changes"] for d in aa)
    shares = [d["count_s"] / d["seconds"] for rs in results.values() for d in rs if d["seconds"]]
    return {
        "settings": {"threshold": settings.threshold, "max_rounds": settings.max_rounds, "workers": settings.workers},
        "plants": {n: {"what": PLANTS[n].what, "file": PLANTS[n].file, "caught": f"{caught[n]}/{len(rs)}",
                       "timed": timed[n], "changes": rs[0]["count_changes"] if rs else []} for n, rs in plants.items()},
        "aa": {"runs": len(aa), "no_count_difference": f"{aa_clean}/{len(aa)}", "timed": timed.get("A/A", {})},
        "count_share_of_a_decision": {"median": statistics.median(shares), "max": max(shares)} if shares else None,
        "overhead": overhead, "total_seconds": total, "runs": results,
        "met": {"caught": all(caught[n] == len(rs) for n, rs in plants.items()), "aa": aa_clean == len(aa),
                "overhead": overhead is None or overhead["ratio"] <= 1.10},
    }


def print_summary(summary: dict, path: Path) -> None:
    print()
    for name, p in summary["plants"].items():
        timed = ", ".join(f"{v} {n}" for v, n in p["timed"].items())
        print(f"{name:<17} slower (counted) {p['caught']}; timed: {timed}; {p['changes'][:2]}")
    if summary["aa"]["runs"]:
        timed = ", ".join(f"{v} {n}" for v, n in summary["aa"]["timed"].items())
        print(f"A/A               no count difference {summary['aa']['no_count_difference']}; timed: {timed}")
    if summary["count_share_of_a_decision"]:
        share = summary["count_share_of_a_decision"]
        print(f"the counted step: median {share['median'] * 100:.1f} % of a decision's time (at most "
              f"{share['max'] * 100:.1f} %)")
    if summary["overhead"]:
        o = summary["overhead"]
        print(f"interleaved, {o['pairs']} pairs (medians): outside the rounds {o['outside_rounds_on_s']:.2f} s with "
              f"counting, {o['outside_rounds_off_s']:.2f} s without; a round's time on/off {o['round_s_ratio']:.3f}; "
              f"counting adds {o['added_s']:.2f} s to a {o['decision_off_s']:.1f}-s decision: ratio {o['ratio']:.3f}")
    print(f"{'as required' if all(summary['met'].values()) else 'NOT as required'}: {summary['met']}; "
          f"total {summary['total_seconds'] / 60:.1f} min; wrote {path}")


def _known_plants(names: tuple[str, ...], flag: str, error: type[Exception]) -> tuple[str, ...]:
    unknown = [n for n in names if n not in PLANTS]
    if unknown:
        raise error(f"unknown plant {unknown[0]!r}: choose from {', '.join(PLANTS)}")
    return names


@dataclass(frozen=True, kw_only=True)
class ValidateCountsOptions(Options):
    """validate-counts' options, and the gate's --threshold (gate/settings.py's Settings, declared there)."""

    error = GateError

    runs: int = option(10, text=whole_number, check=at_least(0), help="gate decisions per plant (default 10)")
    aa_runs: int = option(20, text=whole_number, check=at_least(0), help="A/A gate decisions (default 20)")
    plants: tuple[str, ...] = option(tuple(PLANTS), text=comma_list(str, empty_ok=True), check=_known_plants,
                                     help=f"which plants, comma-separated: {', '.join(PLANTS)}")
    overhead: int = option(0, metavar="PAIRS", text=whole_number, check=at_least(0),
                           help="also time PAIRS A/A decisions with counting on and off, interleaved")
    settings: Settings = options_group(Settings)
    out: str = option("perf-results", help="folder for count-validation.json")
    tree: str = option(".", help="the checkout of mgpu to plant in (default: this folder)")

    @classmethod
    def add_all(cls, add) -> None:
        """Its own options as they always read, the gate's --threshold after --overhead, its default shown."""
        own = [f.name for f, _ in cls.declared()]
        cls.add_to(add, only=own[:own.index("overhead") + 1])
        Settings.add_to(add, only=("threshold",), show_defaults=True)
        cls.add_to(add, only=own[own.index("overhead") + 1:])

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ValidateCountsOptions":
        return cls.from_namespace(args, only=tuple(f.name for f, _ in cls.declared()) + ("threshold",))

    def validate(self) -> "ValidateCountsOptions":
        if self.runs + self.aa_runs + self.overhead == 0:
            raise self.error("--runs, --aa-runs and --overhead must be at least 0, and one of them positive")
        return self


def build_parser() -> argparse.ArgumentParser:
    from mgpu.errors import OneLineParser

    parser = OneLineParser(prog="python -m mgpu_perf validate-counts", description=__doc__.split("\n\n")[0])
    ValidateCountsOptions.add_all(parser.add_argument)
    return parser


def main(argv: list[str] | None = None) -> int:
    from mgpu.errors import one_line

    parser = build_parser()
    try:
        args = ValidateCountsOptions.from_args(parser.parse_args(argv))
    except GateError as e:
        parser.error(one_line(e))
    names, settings = list(args.plants), args.settings
    from mgpu_perf.gate.baseline import is_mgpu_checkout

    root = Path(args.tree).resolve()
    if not is_mgpu_checkout(root):
        parser.error(f"--tree {root} is not a checkout of mgpu (validate-counts plants regressions in its files)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "count-validation.partial.json"
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mgpu-validate-counts-") as tmp:
        tmp = Path(tmp)
        copies = {"same": copy_tree(root, tmp / "same"), "unchanged": copy_tree(root, tmp / "unchanged")}
        for name in names if args.runs else []:
            copies[name] = plant(copy_tree(root, tmp / name), PLANTS[name])
        print(f"{args.runs} runs per plant ({', '.join(names)}), {args.aa_runs} A/A runs, threshold "
              f"{settings.threshold * 100:g} %", flush=True)
        results = run_plants(copies, names, args.runs, args.aa_runs, tmp, settings, partial)
        overhead = measure_overhead(copies, args.overhead, tmp, settings) if args.overhead else None
    summary = summarise(results, overhead, settings, time.perf_counter() - began)
    path = out / "count-validation.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    partial.unlink(missing_ok=True)
    print_summary(summary, path)
    return 0 if all(summary["met"].values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
