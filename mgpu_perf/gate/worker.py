"""Inside a worker of the A/B gate: import the code under test from the arm's tree, run the gated
workloads (harness/workloads.py) the parent (gate/arm.py) asks for.

    python -c BOOT DIR TREE [--require-mgpu]     # started by gate/arm.py, never by hand

DIR holds a copy of the candidate's `mgpu_perf` and comes first on sys.path; TREE comes next (and
TREE/src, for a project laid out that way), so the workloads are the candidate's while `mgpu` (in a
checkout of mgpu: --require-mgpu refuses one imported from anywhere else) or the user's model is the
arm's. A user's model imported from outside TREE is refused at setup for the same reason.
The protocol is one JSON object per line: requests on stdin, answers on the original stdout;
everything the workloads print goes to stderr (a file the parent shows when this process fails).
"""

import gc
import json
import os
import statistics
import sys
import time
import traceback


def _protocol_out():
    """The original stdout for answers; fd 1 becomes stderr, so prints (also from C) cannot mix in."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def versions() -> dict:
    import torch

    cuda = torch.version.cuda
    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # a build without nccl
            nccl = None
    return {"python": sys.executable, "python_version": sys.version.split()[0], "torch": torch.__version__,
            "cuda": cuda, "nccl": nccl, "gpus": torch.cuda.device_count()}


def not_comparable_errors() -> tuple:
    """An API the baseline lacks (a module, a name, an argument the pull request added), or a user's
    model it cannot load (mgpu's SpecError: no such file or function in that tree), makes a workload
    not comparable; any other failure is a failure."""
    try:
        from mgpu.errors import SpecError
    except ImportError:  # an mgpu older than the model contract
        return (ImportError, AttributeError, TypeError)
    return (ImportError, AttributeError, TypeError, SpecError)


def time_ops(op, ops: int, device=None, event=None) -> dict:
    """`ops` operations timed one by one: host wall time always and, on a CUDA device in this
    process, the time between two CUDA events recorded on the step's stream around it
    (`device_times`), which leaves out the host's side of the wait (its wake-up after the last
    kernel, a scheduler's delay). `event`: the event class (torch.cuda.Event; a stand-in in tests).
    Without a CUDA device, `clock_note` says why host time decides."""
    import torch

    host, on_device = [], []
    if device is not None and event is None:
        event = torch.cuda.Event
    window, cpu = [time.monotonic()], time.process_time()
    for _ in range(ops):
        if device is not None:
            start, end = event(enable_timing=True), event(enable_timing=True)
            stream = torch.cuda.current_stream(device) if event is torch.cuda.Event else None
            start.record(stream)
        began = time.perf_counter()
        op()
        if device is not None:
            end.record(stream)
            end.synchronize()
        host.append(time.perf_counter() - began)
        if device is not None:
            on_device.append(start.elapsed_time(end) / 1e3)  # ms -> s
    window.append(time.monotonic())
    # What the gate's round health (gate/health.py) checks: the sample's wall window on the machine's
    # monotonic clock (one clock for every process), and the CPU this process spent in it.
    timing = {"times": host, "window": window, "cpu_s": time.process_time() - cpu}
    return {**timing, "device_times": on_device} if device is not None else timing


_YARDSTICK: dict = {}


def yardstick(repeats: int = 3) -> list[float]:
    """Seconds of a fixed piece of work, `repeats` times: a training step of a small convolutional
    network (two 3 x 3 convolutions and a linear layer, a batch of 4 of 16 x 16; about a millisecond
    on one thread), on this worker's threads. It is this harness's code, the same in both arms, so a
    benchmark in which it takes longer in one arm's worker than in the other's ran its two workers
    at different speeds (vCPUs the host shares unequally): what a round's pairing cannot cancel
    when it lasts (gate/health.py). Built once, under its own random state (the workload's stays)."""
    import torch

    if not _YARDSTICK:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            _YARDSTICK["net"] = torch.nn.Sequential(
                torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3, padding=1),
                torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 16 * 16, 10))
            _YARDSTICK["input"] = torch.randn(4, 3, 16, 16)
    net, batch = _YARDSTICK["net"], _YARDSTICK["input"]
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        net.zero_grad(set_to_none=False)
        net(batch).sum().backward()
        times.append(time.perf_counter() - began)
    return times


def _inside(path: str, tree: str) -> bool:
    return os.path.abspath(path).startswith(os.path.join(tree, ""))


def _setup(workloads, spec: dict, tree: str, not_comparable: tuple, threads: int | None = None):
    """(the workload of `spec`, the answer): None and `not_comparable` when this tree cannot set it
    up; RuntimeError when the model's code does not come from this arm's tree. `threads`: the
    worker's torch thread count at its start, given back first: a workload may set its own (the
    matmul kernel takes 1, a CPU strategy its share of the cores), and the next one in this worker
    must not inherit it."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    try:
        workload = workloads.make_gated(spec)
    except not_comparable as e:
        return None, {"not_comparable": f"{type(e).__name__}: {e}"}
    origin = getattr(workload, "origin", None)
    if origin and not _inside(origin, tree):
        workload.close()
        raise RuntimeError(f"the model's code was imported from {origin}, not from this arm's tree "
                           f"{tree}: both arms would time the same code (is the project installed "
                           "without being on the path from its own folder?)")
    from mgpu_perf.harness.ranks import spawns_ranks

    # Whether the step runs in this process (its CPU seconds are this process's: gate/health.py)
    in_process = not (spec.get("strategy") and spawns_ranks(spec["strategy"]))
    return workload, {"ok": True, "graphs": getattr(workload, "graphs", {"captured": False, "why": ""}),
                      "in_process": in_process}


def main(argv: list[str]) -> int:
    tree = os.path.abspath(argv[0])
    out = _protocol_out()
    # After the harness's folder, before site-packages.
    sys.path[1:1] = [tree] + ([os.path.join(tree, "src")] if os.path.isdir(os.path.join(tree, "src")) else [])
    import mgpu

    where = os.path.abspath(mgpu.__file__)
    if "--require-mgpu" in argv[1:] and not _inside(where, tree):
        out.write(json.dumps({"error": f"mgpu was imported from {where}, not from {tree}"}) + "\n")
        return 1
    # torch and the code under test imported with the garbage collector paused, then frozen, as
    # mgpu.startup does (not imported from there: the tree under test may be older than it)
    gc.disable()
    try:
        from mgpu_perf.harness import workloads

        NOT_COMPARABLE = not_comparable_errors()
        import torch
    finally:
        gc.freeze()
        gc.enable()

    threads = torch.get_num_threads()  # each workload starts from it (_setup)
    out.write(json.dumps({"ready": True, "versions": versions(), "mgpu": where}) + "\n")
    workload, idle_from, in_process = None, None, False
    for line in sys.stdin:
        request = json.loads(line)
        command = request["command"]
        try:
            if command == "setup":
                if workload is not None:
                    workload.close()
                    workload = None
                workload, answer = _setup(workloads, request["spec"], tree, NOT_COMPARABLE, threads)
                in_process = bool(answer.get("in_process"))
            elif command == "sample":
                # The CPU this process spent since its last sample ended (threads spinning, work left
                # behind by the step): it runs while the other arm is timed.
                between = time.process_time() - idle_from if idle_from is not None else None
                answer = time_ops(workload.op, request["ops"], getattr(workload, "cuda_device", None))
                answer["cpu_between_s"] = between
                if in_process:  # the machine's speed for this worker, right after the sample, its threads
                    # still awake; only where the step runs here: beside ddp's ranks it measures the
                    # worker's idle threads (0.1-0.4 s on a loaded machine), not the step's CPU
                    answer["yardstick_s"] = statistics.median(yardstick())
                if "device_times" not in answer:
                    answer["clock_note"] = getattr(workload, "clock_note", "host wall time")
            elif command == "graphs":
                workload.use_graphs(request["enabled"])
                answer = {"ok": True}
            elif command == "count":
                answer = {"ok": True, "counts": workload.count()}
                # The counters' garbage collected and one plain step after them: the first timed
                # round starts as warm as it would without counting.
                gc.collect()
                workload.op()
            elif command == "check":
                workload.check()
                answer = {"ok": True}
            elif command == "close":
                if workload is not None:
                    workload.close()
                workload = None
                answer = {"ok": True}
            elif command == "quit":
                out.write(json.dumps({"ok": True}) + "\n")
                return 0
            else:
                answer = {"error": f"unknown command {command!r}"}
        except BaseException as e:  # reported, then this arm is done: the parent fails the run
            answer = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        out.write(json.dumps(answer) + "\n")
        idle_from = time.process_time() if command == "sample" else None
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
