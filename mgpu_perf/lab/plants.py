"""The planted slowdowns of `validate-gate` (mgpu_perf/lab/validate_gate.py) and the copies of the
tree they are planted in: a busy-wait appended to a copy's mgpu/trainer.py (every step and
evaluation that much slower) or mgpu/models.py (ResNet-18's forward, in every process); on a GPU,
a spin kernel launched inside ResNet-18's forward (`gpu=`), which a CUDA-graph replay of the step
runs too: a host busy-wait in Trainer.step is never part of a replayed step.

    copy_tree(root, tmp / "slowed", slowdown=0.15)   # a copy whose every training step is 15 % slower
    copy_tree(root, tmp / "slowed", gpu=0.15)        # on a GPU, every training step 15 % longer
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["PLANTED", "PLANTED_FORWARD", "PLANTED_GPU", "SKIP_DIRS", "project_files", "copy_tree"]


# Appended to the slowed copies' mgpu/trainer.py.
PLANTED = '''

# -- planted by mgpu_perf/lab/validate_gate.py: every step and evaluation takes (1 + {fraction}) times its own time
def _planted_slowdown(method, fraction={fraction}):
    import functools
    import time as _time

    @functools.wraps(method)
    def slowed(*args, **kwargs):
        start = _time.perf_counter()
        out = method(*args, **kwargs)
        end = start + (_time.perf_counter() - start) * (1 + fraction)
        while _time.perf_counter() < end:  # busy, as real work would be
            pass
        return out
    return slowed


Trainer.step = _planted_slowdown(Trainer.step)
Trainer.evaluate = _planted_slowdown(Trainer.evaluate)
'''


# Appended to the copy's mgpu/models.py by --set-forward: ResNet-18's forward takes (1 + fraction)
# times its own time, in every process that runs it (the rank processes of ddp and fsdp included).
PLANTED_FORWARD = '''

# -- planted by mgpu_perf/lab/validate_gate.py --set-forward: the forward takes (1 + {fraction}) times its own time
_unplanted_resnet18 = resnet18


def resnet18(*args, **kwargs):
    import time as _time

    model = _unplanted_resnet18(*args, **kwargs)
    began = {{}}

    def start(module, inputs):
        began["t"] = _time.perf_counter()

    def stretch(module, inputs, output):
        end = _time.perf_counter() + (_time.perf_counter() - began["t"]) * {fraction}
        while _time.perf_counter() < end:  # busy, as real work would be
            pass
        return output

    model.register_forward_pre_hook(start)
    model.register_forward_hook(stretch)
    return model
'''


# Appended to the copy's mgpu/models.py by --plant-on gpu: after ResNet-18's forward, a spin kernel
# (torch.cuda._sleep) as long as `fraction` of a training step's GPU time, measured with CUDA events
# from one training forward's start to the next one's over the first eager steps (the shorter of two).
# The kernel is launched on the step's stream, so torch.cuda.graph captures it and every replay runs
# it; its length is fixed by the third step, before the harness captures (it runs 3 eager warm-up
# steps first). An eager step holds launch gaps that a replay does not, so under replay the plant
# is at least `fraction` of the step.
PLANTED_GPU = '''

# -- planted by mgpu_perf/lab/validate_gate.py --plant-on gpu: a spin kernel of {fraction} of a training step
_unplanted_resnet18_gpu = resnet18


def resnet18(*args, **kwargs):
    import torch as _torch

    model = _unplanted_resnet18_gpu(*args, **kwargs)
    state = {{"last": None, "steps": [], "cycles": 0}}

    def training(x):
        return x.is_cuda and _torch.is_grad_enabled()

    def measure(module, inputs):
        if state["cycles"] or not training(inputs[0]) or _torch.cuda.is_current_stream_capturing():
            return
        now = _torch.cuda.Event(enable_timing=True)
        now.record()
        now.synchronize()
        if state["last"] is not None:
            state["steps"].append(state["last"].elapsed_time(now))  # ms, the previous step's
        state["last"] = now
        if len(state["steps"]) == 2:
            # _sleep counts SM cycles: timed on a GPU that idles at a low clock, a cycle seems several times
            # as long as in a busy replay (docs/notes/gpu-runs.md, 2026-11-28). So the clock is raised first
            # by a long spin, and the fastest of three spins is taken.
            _torch.cuda._sleep(100_000_000)
            spans = []
            for _ in range(3):
                a, b = _torch.cuda.Event(enable_timing=True), _torch.cuda.Event(enable_timing=True)
                a.record()
                _torch.cuda._sleep(1_000_000)
                b.record()
                b.synchronize()
                spans.append(a.elapsed_time(b))
            state["cycles"] = int({fraction} * min(state["steps"]) * 1_000_000 / min(spans))

    def spin(module, inputs, output):
        if state["cycles"] and training(output):
            _torch.cuda._sleep(state["cycles"])
        return output

    model.register_forward_pre_hook(measure)
    model.register_forward_hook(spin)
    return model
'''


SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", ".benchmarks", "perf-results", "runs",
             "data"}


def project_files(root: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files: the tree as a clean checkout of it would hold
    (outside a git checkout: every file but the virtualenv, caches and outputs)."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard"], capture_output=True,
                         text=True)
    if out.returncode == 0:
        return [f for f in out.stdout.splitlines() if (root / f).is_file()]
    return [str(p.relative_to(root)) for p in root.rglob("*")
            if p.is_file() and not SKIP_DIRS.intersection(p.relative_to(root).parts)]


def copy_tree(root: Path, dest: Path, slowdown: float | None = None, forward: float | None = None,
              gpu: float | None = None) -> Path:
    """A copy of the tree; `slowdown`: every step and evaluation that much slower (PLANTED);
    `forward`: the model's forward that much slower (PLANTED_FORWARD); `gpu`: a spin kernel of that
    fraction of a training step's GPU time, inside the step (PLANTED_GPU)."""
    for f in project_files(root):
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, target)
    for fraction, file, code in ((slowdown, "trainer.py", PLANTED), (forward, "models.py", PLANTED_FORWARD),
                                 (gpu, "models.py", PLANTED_GPU)):
        if fraction:
            target = dest / "mgpu" / file
            target.write_text(target.read_text() + code.format(fraction=fraction))
    return dest
