"""One arm of the A/B gate: a long-lived process that imports `mgpu` from its own tree and runs
the candidate's gated workloads when the parent (perf/ab.py) asks.

    python <tmp>/mgpu_ab_worker.py TREE     # started by perf/ab.py, never by hand

The parent copies this file and perf/workloads.py (as `mgpu_ab_workloads`) into a folder of its
own, so that the workloads are the candidate's while `mgpu` is the arm's: TREE comes first on
sys.path, and the check below refuses an `mgpu` imported from anywhere else (an installed copy).
The protocol is one JSON object per line: requests on stdin, answers on the original stdout;
everything the workloads print goes to stderr (a file the parent shows when this process fails).
"""

import json
import os
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


# An API the baseline lacks (a module, a name, an argument the pull request added) makes a workload
# not comparable; any other failure is a failure.
NOT_COMPARABLE = (ImportError, AttributeError, TypeError)


def main() -> int:
    tree = os.path.abspath(sys.argv[1])
    out = _protocol_out()
    sys.path.insert(1, tree)  # after this folder (the workloads), before site-packages
    import mgpu

    where = os.path.abspath(mgpu.__file__)
    if not where.startswith(os.path.join(tree, "")):
        out.write(json.dumps({"error": f"mgpu was imported from {where}, not from {tree}"}) + "\n")
        return 1
    import mgpu_ab_workloads as workloads

    out.write(json.dumps({"ready": True, "versions": versions(), "mgpu": where}) + "\n")
    workload = None
    for line in sys.stdin:
        request = json.loads(line)
        command = request["command"]
        try:
            if command == "setup":
                if workload is not None:
                    workload.close()
                    workload = None
                try:
                    workload = workloads.make_gated(request["spec"])
                except NOT_COMPARABLE as e:
                    answer = {"not_comparable": f"{type(e).__name__}: {e}"}
                else:
                    answer = {"ok": True}
            elif command == "sample":
                times = []
                for _ in range(request["ops"]):
                    start = time.perf_counter()
                    workload.op()
                    times.append(time.perf_counter() - start)
                answer = {"times": times}
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
