"""The scaling table printed at the end of a perf run, and its scaling.json / scaling.png.

Rows come from the training benchmarks (perf/test_training.py): one per strategy, device count and
measure (step, epoch, or interleaved: DDP steps at every rank count taken in turn). Speedup is images/s against the same strategy and measure on 1 device;
efficiency is speedup / devices. Scaling is weak: the per-device batch is fixed.
"""

from __future__ import annotations

import json
from pathlib import Path

from mgpu_perf.harness.interleave import speedups

def add_speedups(rows: list[dict]) -> list[dict]:
    """Fill speedup and efficiency in each row from the 1-device row of its strategy and measure."""
    base = {(r["strategy"], r["measure"]): r["images_per_s"] for r in rows if r["devices"] == 1}
    for r in rows:
        one = base.get((r["strategy"], r["measure"]))
        r["speedup"], r["efficiency"] = speedups(r["images_per_s"], one, r["devices"]) if one else (None, None)
    return rows


def format_table(rows: list[dict]) -> list[str]:
    def cell(v, digits=2):
        return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)

    header = f"{'strategy':<13}{'measure':<12}{'devices':>7}  {'':<15}{'images/s':>9}{'speedup':>9}{'efficiency':>11}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['strategy']:<13}{r['measure']:<12}{r['devices']:>7}  {r['label']:<15}"
                     f"{cell(r['images_per_s'], 1):>9}{cell(r['speedup']):>9}{cell(r['efficiency']):>11}")
    return lines


def write_outputs(rows: list[dict], meta: dict, out_dir: Path) -> list[Path]:
    """scaling.json (rows and how they were measured) and scaling.png (images/s and efficiency
    against devices, one line per strategy and measure)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "scaling.json"
    json_path.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")

    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    fig, (ax_rate, ax_eff) = plt.subplots(1, 2, figsize=(10, 4))
    for key in dict.fromkeys((r["strategy"], r["measure"]) for r in rows):
        series = sorted((r for r in rows if (r["strategy"], r["measure"]) == key), key=lambda r: r["devices"])
        xs = [r["devices"] for r in series]
        style = "-o" if key[1] == "step" else "--s"
        ax_rate.plot(xs, [r["images_per_s"] for r in series], style, label=f"{key[0]} ({key[1]})")
        if any(r["efficiency"] is not None for r in series):
            ax_eff.plot(xs, [r["efficiency"] for r in series], style, label=f"{key[0]} ({key[1]})")
    devices = sorted({r["devices"] for r in rows})
    for ax, title in ((ax_rate, "throughput (images/s)"), (ax_eff, "scaling efficiency (speedup / devices)")):
        ax.set_xlabel("devices" + (" (emulated on the CPU)" if meta.get("emulated") else ""))
        ax.set_xticks(devices)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax_eff.axhline(1.0, color="grey", lw=0.8)
    ax_rate.legend(fontsize=8)
    fig.suptitle(meta.get("title", "weak scaling"), fontsize=10)
    fig.tight_layout()
    png_path = out_dir / "scaling.png"
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return [json_path, png_path]
