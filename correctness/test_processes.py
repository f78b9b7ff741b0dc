"""The suite's wait for a process (correctness/processes.py): a process that works is waited for
however slow the machine, one that uses no CPU is a hang, found without waiting out a fixed time."""

import sys
import time

import pytest

from correctness.processes import cpu_seconds, run_to_end


def test_a_process_that_keeps_working_is_waited_for_past_the_idle_limit():
    busy = "import time\nend = time.process_time() + 3\nwhile time.process_time() < end: pass\nprint('done')"
    proc = run_to_end([sys.executable, "-c", busy], idle_s=1.0)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc


def test_a_process_that_uses_no_cpu_is_a_hang_found_within_the_idle_limit():
    began = time.monotonic()
    with pytest.raises(AssertionError, match="no CPU used for 2 s .*: a hang"):
        run_to_end([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"], idle_s=2.0)
    assert time.monotonic() - began < 60, "the hang was found by waiting, not by the process's idleness"


def test_cpu_seconds_counts_the_children_a_process_started():
    import os
    import signal
    import subprocess

    child = "import time\nend = time.process_time() + 1\nwhile time.process_time() < end: pass\ntime.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"],
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while cpu_seconds(parent.pid) < 1.0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert cpu_seconds(parent.pid) >= 1.0, "the child's CPU seconds were not counted with its parent's"
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the child too
        parent.wait()
