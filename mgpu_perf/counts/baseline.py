"""The counted baseline's file: each gated benchmark's counted step (counts/step.py) kept in a JSON
file beside the code, keyed by what the step is and what fixes its counts, and a step checked against it.

    entries = read_file(Path("perf/counts-cpu.json"))
    checked = check_entry(entries, workload_key(spec), environment(), counts)   # counts: each rank's
    checked.status                        # "same" | "changed" | "slower (counted)" | "fewer (counted)" | ...
    write_file(path, merge_entries(entries, [{"workload": key, "environment": env, "test": nodeid,
                                             "counts": counts}]))

The file is {"format": FORMAT, "written_by": ..., "entries": [...]}, an entry
{"workload": key, "environment": env, "test": nodeid, "counts": [rank dicts]}. An entry is keyed by
the workload (`workload_key`: the marker's spec with the fields that follow this machine's core
count left out, and amp and compile always said) and by what fixes the counts (`environment`:
torch's version, and on a GPU the CUDA and cuDNN versions and the device's name). The check,
against the entry of the same workload and environment (counts/judge.py judges the ranks):

* a guarded count (host reads, collectives, FLOPs, bytes, ...) that grew: `slower (counted)`, a
  failure naming it as the gate does (`host reads 1 → 2 a step`);
* a guarded count that fell: `fewer (counted)`, a failure too, with the command that updates the
  file (a ratchet: the file keeps the best the code has done);
* op counts, CUDA kernels and peak memory: reported, never failed;
* an entry of the workload recorded under another environment only, or with another rank count:
  `not comparable`;
* no entry of the workload at all: `no entry`.

What pytest does with each status (fail, skip, exit code) is counts/plugin.py's.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from mgpu_perf.counts.judge import FAILING, NO_ENTRY, NOT_COMPARABLE, judge_ranks, ratchet_verdict

__all__ = ["FORMAT", "NOT_KEYS", "workload_key", "describe_workload", "environment", "describe_environment",
           "Checked", "check_entry", "merge_entries", "read_file", "write_file", "update_command"]

FORMAT = 1
# Spec fields that follow this machine's cores (a CPU strategy's share of them) or how a step is timed
# (CUDA graphs: the counted step is the plain one either way): not part of what a step does.
NOT_KEYS = ("threads_per_device", "threads", "graphs")
# The environment's fields an entry must share to be compared (`torch_build` is recorded only).
COMPARED_ENVIRONMENT = ("torch", "device", "cuda", "cudnn")


def workload_key(spec: dict) -> dict:
    """What a step is: the marker's workload spec without NOT_KEYS, amp and compile always said."""
    key = {k: v for k, v in spec.items() if k not in NOT_KEYS}
    key.setdefault("amp", "off")
    key["compile"] = bool(key.get("compile", False))
    return dict(sorted(key.items()))


def describe_workload(key: dict) -> str:
    """One line: `model.py:spec single x1 batch 32` or `train-step ddp x2 batch 32 (width=16, ...)`."""
    first = key.get("model") or key.get("kind", "?")
    main = [first] + ([f"{key['strategy']} x{key.get('devices', 1)}"] if "strategy" in key else []) \
        + ([f"batch {key['batch']}"] if "batch" in key else [])
    rest = [f"{k}={v}" for k, v in key.items() if k not in ("model", "kind", "strategy", "devices", "batch", "amp",
                                                          "compile")]
    options = [f"amp {key['amp']}"] if key.get("amp", "off") != "off" else []
    options += ["compile"] if key.get("compile") else []
    return " ".join(main + options) + (f" ({', '.join(rest)})" if rest else "")


def environment() -> dict:
    """What fixes the counts besides the code: torch's version (its local build label, +cpu or +cu130,
    left out: one torch runs the same ops on a CPU whichever wheel it came in) and the device kind;
    on a GPU also CUDA's and cuDNN's versions, which choose its kernels. `torch_build`: the whole
    version string, recorded, not compared."""
    import torch

    gpu = torch.cuda.is_available()
    env = {"torch": torch.__version__.split("+")[0], "device": torch.cuda.get_device_name(0) if gpu else "cpu",
           "cuda": torch.version.cuda if gpu else None,
           "cudnn": torch.backends.cudnn.version() if gpu and torch.backends.cudnn.is_available() else None,
           "torch_build": torch.__version__}
    return env


def describe_environment(env: dict) -> str:
    """One line: `torch 2.14.1 on cpu` or `torch 2.14.1 on NVIDIA H100 CUDA 13.0, cuDNN 91000`."""
    parts = [f"torch {env.get('torch')}", f"on {env.get('device')}"]
    if env.get("cuda"):
        parts.append(f"CUDA {env['cuda']}, cuDNN {env.get('cudnn')}")
    return " ".join(parts)


@dataclass(frozen=True)
class Checked:
    status: str                                        # a counts/judge.py verdict: same | changed |
    increases: list = field(default_factory=list)      #   slower (counted) | fewer (counted) |
    decreases: list = field(default_factory=list)      #   not comparable | no entry
    reported: list = field(default_factory=list)       # op counts, kernels, peak memory
    reason: str = ""

    @property
    def failed(self) -> bool:
        return self.status in FAILING


def _same_environment(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in COMPARED_ENVIRONMENT)


def check_entry(entries: list[dict], key: dict, env: dict, counts: list[dict]) -> Checked:
    """The counted step `counts` (each rank's) against the file's entry of the same workload and
    environment: see the module's docstring for each status."""
    mine = [e for e in entries if e["workload"] == key]
    entry = next((e for e in mine if _same_environment(e["environment"], env)), None)
    if entry is None:
        if not mine:
            return Checked(NO_ENTRY, reason=f"no entry for {describe_workload(key)}")
        recorded = "; ".join(sorted({describe_environment(e["environment"]) for e in mine}))
        return Checked(NOT_COMPARABLE, reason=f"recorded under {recorded}, this run is {describe_environment(env)}")
    if len(entry["counts"]) != len(counts):
        return Checked(NOT_COMPARABLE, reason=f"{len(entry['counts'])} ranks recorded, {len(counts)} counted")
    judged = judge_ranks(entry["counts"], counts)
    return Checked(ratchet_verdict(judged), list(judged.increases), list(judged.decreases), list(judged.reported))


def merge_entries(old: list[dict], new: list[dict]) -> list[dict]:
    """The file's entries after a save: each new one replaces the old entry of its workload on the
    same device kind (whatever its versions: the update moves that baseline on); entries of other
    device kinds stay. Sorted, so that the file's diff shows what changed."""
    def slot(e):
        return json.dumps(e["workload"], sort_keys=True), e["environment"].get("device")

    kept = {slot(e): e for e in old}
    kept.update({slot(e): e for e in new})
    return [kept[s] for s in sorted(kept)]


def read_file(path: Path) -> list[dict]:
    """The file's entries; ValueError where it is not a counts file of FORMAT."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), list):
        raise ValueError(f"{path}: not a counts file of format {FORMAT} (written by pytest --counts-save)")
    return data["entries"]


def write_file(path: Path, entries: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "written_by": "pytest --counts-save (mgpu_perf/counts/baseline.py)",
            "entries": entries}
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")


def update_command(args: list[str], path: str) -> str:
    """The invocation with --counts-check FILE turned into --counts-save FILE: what updates the file."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--counts-check":
            skip = True
            continue
        if arg.startswith("--counts-check="):
            continue
        out.append(arg)
    return shlex.join(["python", "-m", "pytest", *out, "--counts-save", path])
