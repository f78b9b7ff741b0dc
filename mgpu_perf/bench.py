"""`python -m mgpu bench MODULE:FUNCTION`: your model's training step under every strategy and
device count, timed interleaved, with samples/s, speed-up, efficiency and (CUDA) peak memory; then
one more step of each counted (mgpu_perf/counts/step.py): FLOPs, achieved FLOP/s (and on a GPU whose
peak is known, the model-FLOPs utilisation), collectives and bytes communicated, host reads.

    python -m mgpu bench examples/tiny_lm.py:spec
    python -m mgpu bench mymodel.py:spec --strategies single,manual,ddp --devices 1,2 --batch 16 --out bench/
    python -m mgpu bench torchvision.models:resnet18 --input-shape 3,32,32 --classes 10 --rounds 20

Weak scaling: every device gets `--batch` examples, so the global batch grows with the devices.
Every case is set up first (DDP and FSDP ranks start once and wait), then each round steps every
case once, the order reversed every other round, so that a machine whose speed drifts slows all
cases alike; the figures are medians over the rounds. Speed-up is samples/s against the `single`
strategy on one device (the first case when single is not run); efficiency is speed-up / devices.
On a CPU, N devices are N emulated devices (manual) or N processes (ddp, fsdp), each with the same
share of the cores at every count (so a speed-up measures parallel execution, not more threads);
`dataparallel` on more than one device needs as many GPUs and is left out without them.
Writes bench.json and bench.png into --out (default perf-results/).
"""

from __future__ import annotations

import json
import statistics
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mgpu.config import AMP_MODES, STRATEGY_NAMES
from mgpu.option_groups import ModelOptions, device_counts, strategy_names
from mgpu.options import at_least, option, whole_number
from mgpu.validators import positive_int

__all__ = ["BenchOptions", "plan_cases", "run_bench", "format_table", "write_outputs"]



@dataclass(frozen=True, kw_only=True)
class BenchOptions(ModelOptions):
    """`mgpu bench`'s options, declared once: its flags (mgpu_perf/cli.py) and what run_bench reads."""

    model: str | None = ModelOptions.option_of("model", None)  # run_bench takes the model on its own too
    strategies: tuple[str, ...] = strategy_names(("single", "manual", "ddp", "fsdp"),
                                                 help=f"strategies to time, from {','.join(STRATEGY_NAMES)}")
    devices: tuple[int, ...] = device_counts((1, 2))
    batch: int = option(32, text=whole_number, check=positive_int, help="examples per device (weak scaling)")
    rounds: int = option(10, text=whole_number, check=at_least(1),
                         help="interleaved rounds: one step of every case each")
    warmup: int = option(2, text=whole_number, check=at_least(0), help="untimed steps of every case first")
    amp: str = option("off", choices=AMP_MODES,
                      help="bf16: the forward and loss under bfloat16 autocast (weights and optimizer fp32)")
    compile: bool = option(False, help="the model under torch.compile (inductor); its compilation happens in the "
                                       "untimed warm-up")
    out: str = option("perf-results", help="folder for bench.json and bench.png")


def plan_cases(options: BenchOptions, gpus: int) -> tuple[list[tuple[str, int]], list[str]]:
    """(strategy, devices) to time, and a note for each one left out (and why)."""
    cases, notes = [], []
    for strategy in options.strategies:
        for n in options.devices:
            if strategy == "single" and n != 1:
                continue  # one device by definition
            if strategy == "dataparallel" and n > 1 and gpus < n:
                notes.append(f"dataparallel on {n} devices left out: it needs {n} CUDA devices (found {gpus}); "
                             "without them nn.DataParallel runs on one")
                continue
            cases.append((strategy, n))
    return cases, notes


def run_bench(model: str, options: BenchOptions, log: Callable[[str], None] = lambda _: None) -> dict:
    """Set up every case, time `rounds` interleaved rounds after `warmup`, check every case trained."""
    import torch

    from mgpu.devices import torch_threads, usable_cores
    from mgpu_perf.counts.step import count_session
    from mgpu_perf.harness.interleave import interleaved_step_times
    from mgpu_perf.harness.models import ModelBench
    from mgpu_perf.harness.ranks import StrategyRankPool, spawns_ranks

    gpus = torch.cuda.device_count()
    cases, notes = plan_cases(options, gpus)
    if not cases:
        raise ValueError("no case to time: " + "; ".join(notes))
    threads = None if gpus else max(1, len(usable_cores()) // max(n for _, n in cases))
    labels = {f"{strategy} on {n} device(s)": (strategy, n) for strategy, n in cases}
    with ExitStack() as stack, torch_threads(threads):
        sessions = {}
        for label, (strategy, n) in labels.items():
            log(f"setting up {label}")
            bench = ModelBench(model, strategy, n, per_device_batch=options.batch, input_shape=options.input_shape,
                               classes=options.classes, threads_per_device=threads, amp=options.amp,
                               compile=options.compile)
            session = StrategyRankPool(bench) if spawns_ranks(strategy) else bench.open()
            stack.callback(session.close)
            sessions[label] = session
        # Raises on a non-finite loss or a case whose weights did not move.
        timed = interleaved_step_times(sessions, options.rounds, options.warmup, alternate=True)
        memory = {labels[label]: session.memory_bytes().get("peak_allocated") for label, session in sessions.items()}
        counted = {labels[label]: count_session(session, session.step)  # after the timing
                   for label, session in sessions.items()}
    times = {labels[label]: ts for label, ts in timed.items()}
    rows = []
    for (strategy, n), ts in times.items():
        median = statistics.median(ts)
        rows.append({"strategy": strategy, "devices": n, "global_batch": options.batch * n, "rounds": len(ts),
                     "step_s_median": median, "step_s_min": min(ts), "step_s_max": max(ts),
                     "samples_per_s": options.batch * n / median, "peak_memory_bytes": memory[(strategy, n)],
                     **_count_fields(counted[(strategy, n)], median, options.amp, gpus)})
    base = next((r for r in rows if (r["strategy"], r["devices"]) == ("single", 1)), rows[0])
    for r in rows:
        r["speedup"] = r["samples_per_s"] / base["samples_per_s"]
        r["efficiency"] = r["speedup"] * base["devices"] / r["devices"]
    return {"model": model, "scaling": "weak (fixed per-device batch)", "per_device_batch": options.batch,
            "rounds": options.rounds, "warmup": options.warmup, "speedup_against": f"{base['strategy']} on "
            f"{base['devices']} device(s)", "gpus": gpus, "threads_per_device": threads,
            "emulated": gpus == 0, "torch": torch.__version__, "amp": options.amp, "compile": options.compile,
            "notes": notes, "rows": rows}


# Dense peak FLOP/s of GPUs whose name holds the key (their data sheets), for the model-FLOPs
# utilisation: fp32 (TF32 off, PyTorch's default for matmuls), tf32, bf16.
PEAK_FLOPS = {"H100 PCIe": {"fp32": 51e12, "tf32": 378e12, "bf16": 756e12},
              "H100": {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989e12},
              "H200": {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989e12},
              "A100": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12}}


def peak_flops(amp: str, gpus: int) -> float | None:
    """The first GPU's dense peak for the step's number format, when its name is in PEAK_FLOPS."""
    if not gpus:
        return None
    import torch

    name = torch.cuda.get_device_name(0)
    fmt = "bf16" if amp == "bf16" else ("tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32")
    return next((peaks[fmt] for key, peaks in PEAK_FLOPS.items() if key in name), None)


def _count_fields(ranks: list[dict], step_s: float, amp: str, gpus: int) -> dict:
    """A row's counted figures: the step's FLOPs (every rank), what it communicates, its host reads."""
    flops = sum(r["flops"] for r in ranks)
    first = ranks[0]
    fields = {"flops": flops, "achieved_flops_per_s": flops / step_s if step_s > 0 else None,
              "collectives": sum(c["count"] for c in first["collectives"].values()),
              "bytes_communicated": sum(c["bytes"] for c in first["collectives"].values()),
              "host_reads": first["host_reads"], "counts": ranks}
    peak = peak_flops(amp, gpus)
    devices = max(1, len(ranks)) if len(ranks) > 1 else 1
    fields["mfu"] = fields["achieved_flops_per_s"] / (peak * devices) if peak and fields["achieved_flops_per_s"] else None
    return fields


def format_table(result: dict) -> list[str]:
    header = f"{'strategy':<13}{'devices':>8}{'step ms':>10}{'samples/s':>11}{'speed-up':>10}{'efficiency':>11}" \
             f"{'peak MiB':>10}{'GFLOP':>9}{'GFLOP/s':>9}{'comm MB':>9}{'colls':>6}{'syncs':>6}"
    lines = [header, "-" * len(header)]
    for r in result["rows"]:
        peak = f"{r['peak_memory_bytes'] / 2**20:.0f}" if r["peak_memory_bytes"] else "-"
        counted = (f"{r['flops'] / 1e9:>9.3g}{(r['achieved_flops_per_s'] or 0) / 1e9:>9.3g}"
                   f"{r['bytes_communicated'] / 1e6:>9.3g}{r['collectives']:>6}{r['host_reads']:>6}"
                   if "flops" in r else "")
        lines.append(f"{r['strategy']:<13}{r['devices']:>8}{r['step_s_median'] * 1e3:>10.1f}{r['samples_per_s']:>11.1f}"
                     f"{r['speedup']:>10.2f}{r['efficiency']:>11.2f}{peak:>10}{counted}"
                     + (f"  MFU {r['mfu']:.1%}" if r.get("mfu") else ""))
    devices = "emulated CPU devices (CPU ranks for ddp/fsdp)" if result["emulated"] else f"{result['gpus']} GPU(s)"
    options = [o for o, on in ((f"--amp {result.get('amp')}", result.get("amp", "off") != "off"),
                               ("--compile", result.get("compile"))) if on]
    lines.append(f"{result['model']}: {result['per_device_batch']} samples a device, median of {result['rounds']} "
                 f"interleaved rounds, speed-up against {result['speedup_against']}, on {devices}"
                 + (f"; {' '.join(options)}" if options else ""))
    lines.append("GFLOP: one step's matmul and convolution FLOPs, every device; comm MB, colls, syncs: what rank 0 "
                 "communicates and its host reads, a step (one step counted after the timing)")
    lines += [f"note: {n}" for n in result["notes"]]
    return lines


def write_outputs(result: dict, out: Path) -> list[Path]:
    """bench.json and bench.png (samples/s against devices, one line per strategy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(6, 4))
    for strategy in dict.fromkeys(r["strategy"] for r in result["rows"]):
        rows = [r for r in result["rows"] if r["strategy"] == strategy]
        ax.plot([r["devices"] for r in rows], [r["samples_per_s"] for r in rows], marker="o", label=strategy)
    ax.set_xlabel("devices" + (" (emulated)" if result["emulated"] else ""))
    ax.set_ylabel("samples/s")
    ax.set_title(f"{result['model']}: training step, weak scaling", fontsize=9)
    ax.set_xticks(sorted({r["devices"] for r in result["rows"]}))
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "bench.png", dpi=100)
    plt.close(fig)
    return [out / "bench.json", out / "bench.png"]
