"""A process run to its end, a hang told by the process, not by a clock: the suite's tests that start
`python -m mgpu ...` wait as long as the process (and every process it started) keeps working, and
call it a hang once it has used no CPU for `idle_s`.

    proc = run_to_end([sys.executable, "-m", "mgpu", "train", "--epochs", "0"], cwd=ROOT)

A fixed timeout is a guess at this machine's speed: on a 2-core runner beside a CPU burner the
import of torch alone took longer than the 50 s such a test once allowed. A process that gets its
share of a CPU, however small, and uses it is working; one that sits in a lock, a collective or a
read with nothing coming uses none. pytest-timeout (pytest.ini) stays the backstop.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

__all__ = ["IDLE_S", "cpu_seconds", "run_to_end"]

IDLE_S = 30.0  # no CPU used by the process or its children for this long: a hang


def _tree(pid: int) -> list[int]:
    """pid and its descendants (from /proc: each process's parent)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def cpu_seconds(pid: int) -> float:
    """CPU seconds of pid and its living descendants, and of the children they have reaped."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for p in _tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / tick


def run_to_end(cmd: list[str], idle_s: float = IDLE_S, **popen) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True, **popen), waiting while the process tree
    uses CPU; AssertionError naming the hang once it used none for `idle_s` (then it is killed)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    last_cpu, last_change = -1.0, time.monotonic()
    while True:
        try:
            out, err = proc.communicate(timeout=1.0)
            return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            pass
        used = cpu_seconds(proc.pid)
        if used > last_cpu:
            last_cpu, last_change = used, time.monotonic()
        elif time.monotonic() - last_change > idle_s:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"{' '.join(cmd[:6])} ...: no CPU used for {idle_s:.0f} s after {used:.1f} s of "
                                 f"CPU: a hang; stdout:\n{out[-2000:]}\nstderr:\n{err[-2000:]}")
