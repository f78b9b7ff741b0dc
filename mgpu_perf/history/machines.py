"""Which machine a run was timed on, read from the run's own `machine_info` (never from the storage
folder's name, which pytest-benchmark derives from the OS and Python alone: two runners of one CI
share it). Runs of different machines are never put in one history.

    machine = machine_of(data["machine_info"])   # Machine(fields=(("node", "vm"), ...), label="vm: ...")
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Machine", "machine_of", "MACHINE_FIELDS", "host_only_note"]

# What makes two runs comparable: the host, its CPU and core count, the architecture, the Python and
# the torch/CUDA build and GPUs (mgpu's conftest adds torch, cuda and gpus to machine_info). Anything
# else in machine_info (the kernel release, CPU flags) is left out: it changes without the timings doing so.
MACHINE_FIELDS = ("node", "cpu", "cores", "arch", "python", "torch", "cuda", "gpus")


@dataclass(frozen=True)
class Machine:
    fields: tuple[tuple[str, str], ...]  # (name, value) per MACHINE_FIELDS, "" where the run did not record it

    @property
    def label(self) -> str:
        """One line a person recognises: 'vm: Intel(R) Xeon(R) Processor x 2, x86_64, CPython 3.11.7, torch 2.14.1'."""
        f = dict(self.fields)
        parts = [f"{f['cpu'] or 'unknown CPU'}" + (f" x {f['cores']}" if f["cores"] else ""), f["arch"], f["python"]]
        parts += [f"{name} {f[name]}" for name in ("torch", "cuda") if f[name]]
        if f["gpus"]:
            parts.append(f["gpus"])
        return f"{f['node'] or 'unknown host'}: " + ", ".join(p for p in parts if p)

    def to_json(self) -> dict:
        return {"label": self.label, **dict(self.fields)}


def machine_of(info: dict) -> Machine:
    """The Machine of one run's machine_info (pytest-benchmark's record, with mgpu's additions)."""
    info = info if isinstance(info, dict) else {}
    cpu = info.get("cpu") if isinstance(info.get("cpu"), dict) else {}
    python = " ".join(str(info.get(k) or "") for k in ("python_implementation", "python_version")).strip()
    gpus = info.get("gpus") or []
    gpu_text = ", ".join(f"{gpus.count(name)} x {name}" for name in dict.fromkeys(map(str, gpus))) if gpus else ""
    values = {"node": info.get("node"), "cpu": cpu.get("brand_raw") or info.get("processor"), "cores": cpu.get("count"),
              "arch": info.get("machine"), "python": python, "torch": info.get("torch"), "cuda": info.get("cuda"),
              "gpus": gpu_text}
    return Machine(tuple((name, "" if values[name] is None else str(values[name])) for name in MACHINE_FIELDS))


def host_only_note(machines, short: int) -> str:
    """A line when several machines differ in their host name alone and `short` of them hold too few
    commits for a change point: a CI that names its runners anew each job (hosted runners) splits one
    kind of machine into histories of a run or two, which nothing can analyse. Empty otherwise."""
    rest = {tuple(item for item in m.fields if item[0] != "node") for m in machines}
    if len(machines) < 2 or len(rest) != 1 or not short:
        return ""
    return (f"the {len(machines)} machines differ only in their host name (machine_info's node), and {short} of them "
            "hold too few commits for a change point: where a CI names its runners anew each job, give them one name "
            "in conftest.py (pytest_benchmark_update_machine_info: machine_info['node'] = 'ci-runner')")
