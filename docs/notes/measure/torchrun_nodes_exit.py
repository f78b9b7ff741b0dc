"""Issue 53: the two torchrun "nodes" of test_reliability_ranks N times, as the ranks scenario starts them, beside
whatever load runs (docs/notes/suite-times.md, 2026-11-28): exit codes, seconds from the run's last line to each
node's exit, and ranks that aborted ("terminate called"). TREE: the checkout whose mgpu the nodes run.

    python docs/notes/measure/torchrun_nodes_exit.py fsdp 8 [TREE]
"""
import sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import correctness.test_reliability_ranks as R
strategy, n = sys.argv[1], int(sys.argv[2])
if len(sys.argv) > 3:
    R.ROOT = Path(sys.argv[3])
hangs = aborts = 0
for i in range(n):
    tmp = Path(tempfile.mkdtemp())
    t0 = time.monotonic()
    nodes = R._start_nodes(tmp, strategy)
    res = []
    for name, run in nodes.items():
        try:
            code = run.wait(40)
        except AssertionError:
            code = "HANG"
        res.append(code)
    for run in nodes.values():
        run.leftover = run.leftovers(); run.kill()
    err = "\n".join(r.stderr for r in nodes.values())
    last = [at for r in nodes.values() for at, line in zip(r.out_at, r.out) if "test acc:" in line]
    delay = [round(r.ended - last[0], 1) if last and r.ended else None for r in nodes.values()]
    hangs += "HANG" in res; aborts += "terminate called" in err
    print(f"{i}: exit {res}, exited {delay} s after the last line, {time.monotonic()-t0:.0f} s"
          f"{', a rank aborted: terminate called' if 'terminate called' in err else ''}", flush=True)
print(f"{strategy} nodes from {R.ROOT}: {hangs} hung, {aborts} with an aborted rank, of {n}")
