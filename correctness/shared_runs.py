"""The suite's multi-process runs that several tests read, made in the background while the tests run.

Spawning ranks takes seconds, during which the test process only waits; meanwhile the rest of the
suite runs in one process on one core (conftest's `one_thread`) and leaves the machine's other
cores idle. So when the session starts, conftest starts one process, at lower priority, which
imports torch and computes the single-device trajectory while the tests are collected; when
collection ends, conftest hands it the jobs the selected tests need (or ends it, if none), and it
runs them one after the other, writing each result to a file:

* `reference`: the single-device trajectory (helpers.reference_trajectory of
  helpers.weights_config), the session's `single_trajectory`;
* `ranks2`, `ranks3`: the shared ddp and fsdp runs of each world size the selected tests read
  (helpers.spawn_rank_runs from that trajectory's checkpoints), the session's `rank_runs`;
* `parity-lenet-ddp`, `parity-resnet18-w4-fsdp`: the reports of test_parity's rank tests of mgpu's
  own models (shared_jobs.rank_report; not for `--model`, whose model only the test process loads);
* `figures-ddp2`: test_reported_figures' DDP run (shared_jobs.timed_run), its fixture's.

The jobs' code is correctness/shared_jobs.py, which test_parity and test_reported_figures import too:
this module imports no test module (no import circle).

The fixtures read those files, waiting where a test comes first; a run nobody announced is made in
the test process, as before. What the runs compute is unchanged: the same jobs, with the same
code, in ranks forked the same way (mgpu.launch.spawn); only the process that launches them
differs, and it computes as the test process would (one thread, exact GPU math).

    python -c "from correctness.shared_runs import main; main()" FOLDER   # what the process runs
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Priority of the process and its ranks, as test_reliability_ranks' runs have: they overlap the suite.
NICE = int(os.environ.get("MGPU_TEST_NICE", "10"))
# Long enough for every job on a machine no busier than its cores (stretched by the load on a busier one);
# each spawn is bounded by helpers.DDP_DEADLINE_S (stretched alike) itself.
WAIT_S = 280.0
FIGURES_MODULE = "correctness.test_reported_figures"
PARITY_MODULE = "correctness.test_parity"
FIGURES_DDP_JOB = "figures-ddp2"
PARENT_ENV = "MGPU_TEST_SHARED_RUNS_PARENT"  # the test process's pid: the process dies with it


def ranks_job(world_size: int) -> str:
    return f"ranks{world_size}"


def parity_job(test_id: str) -> str:
    """The job of test_parity's rank test with this id ("lenet-ddp")."""
    return f"parity-{test_id}"


def jobs_for(items) -> list[str]:
    """The jobs these test items read, in the order they should come (empty: nothing to start).

    Shared rank runs: the tests that take the `rank_runs` fixture and start processes (marker
    `multiprocess`; test_evaluation's manual cases take the fixture without using it), at their
    parameter `world_size` or `n` (2 where they have neither: every such test reads rank_runs(2));
    worlds of one run in the test process (helpers.run_job_in_this_process). The reported figures'
    DDP run: test_reported_figures' tests marked `multiprocess`. The parity reports: test_parity's
    rank tests, without `--model`. In the order the suite reads them."""
    sizes, parity, figures = set(), [], False
    for item in items:
        if item.get_closest_marker("multiprocess") is None:
            continue
        callspec = getattr(item, "callspec", None)
        params = getattr(callspec, "params", {})
        if "rank_runs" in getattr(item, "fixturenames", ()):
            size = params.get("world_size", params.get("n", 2))
            if isinstance(size, int) and size >= 2:
                sizes.add(size)
        module = getattr(getattr(item, "module", None), "__name__", None)
        figures = figures or module == FIGURES_MODULE
        if module == PARITY_MODULE and "rank_strategy" in params and item.config.getoption("model") is None:
            parity.append(parity_job(callspec.id))
    jobs = ["reference", *(ranks_job(s) for s in sorted(sizes))] if sizes else []
    return jobs + sorted(set(parity)) + ([FIGURES_DDP_JOB] if figures else [])


JOBS_FILE = "jobs.txt"
# Started before the jobs are known: almost every session that starts the process needs this one.
SPECULATIVE_JOB = "reference"


@dataclass
class SharedRuns:
    """The process running `jobs` (none until `assign`), writing their results under `folder`."""
    folder: Path
    proc: subprocess.Popen
    jobs: tuple = ()

    @classmethod
    def start(cls, folder: Path) -> "SharedRuns":
        from mgpu.config import EXACT_GPU_MATH_ENV
        from mgpu.faults import FAULT_ENV

        env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, "RANK", "WORLD_SIZE")}
        env[EXACT_GPU_MATH_ENV] = "1"  # started before the suite's fixtures: GPU math as exact as theirs
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        env[PARENT_ENV] = str(os.getpid())
        log = open(folder / "log.txt", "w")
        # A session of its own: its priority (an autogroup's, where the kernel has them) is its own, and
        # stop() ends it with its fork server and ranks.
        proc = subprocess.Popen([sys.executable, "-c", "from correctness.shared_runs import main; main()", str(folder)],
                                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        return cls(folder, proc)

    def assign(self, jobs) -> None:
        """The jobs to run, in order (written whole: the process never reads half a list), after
        SPECULATIVE_JOB, which it runs first in any case."""
        self.jobs = (SPECULATIVE_JOB, *(job for job in jobs if job != SPECULATIVE_JOB))
        path = self.folder / JOBS_FILE
        path.with_suffix(".tmp").write_text("\n".join(self.jobs) + "\n")
        os.replace(path.with_suffix(".tmp"), path)

    def get(self, job: str, wait_s: float | None = None):
        """What `job` returned, once written; an exception naming what went wrong where it failed (the
        job's own error, or the process's log's end when it died without one)."""
        if wait_s is None:
            from correctness.helpers import load_stretched

            wait_s = load_stretched(WAIT_S)
        path, end = self.folder / f"{job}.pkl", time.monotonic() + wait_s
        if not path.exists():
            self._hurry()
        while not path.exists():
            if self.proc.poll() is not None and not path.exists():
                raise RuntimeError(f"the background process ended (exit code {self.proc.returncode}) without "
                                   f"{job}; its log ends:\n{self._log_tail()}")
            if time.monotonic() > end:
                self.stop()
                raise RuntimeError(f"{job} did not come within {wait_s:.0f} s; the background process's log "
                                   f"ends:\n{self._log_tail()}")
            time.sleep(0.05)
        with open(path, "rb") as f:
            outcome = pickle.load(f)
        if isinstance(outcome, str):  # the job's error, as the process caught it
            raise RuntimeError(outcome)
        return outcome

    def _hurry(self) -> None:
        """A test waits for the process: it gets the test process's priority back (raise_priority)."""
        raise_priority(self.proc.pid)

    def stop(self) -> None:
        """End the process, its fork server and its ranks, if they still run (a session stopped early)."""
        import signal

        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join((self.folder / "log.txt").read_text().splitlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"


def raise_priority(pid: int) -> None:
    """The process group of `pid` (a process started in a session of its own, with its fork server
    and ranks) and its session's autogroup get this process's priority back, where this user may
    raise a priority (root); else they keep the lower one, which on a machine busy with other jobs
    only makes a test that waits for them wait longer."""
    try:
        os.setpriority(os.PRIO_PGRP, pid, os.getpriority(os.PRIO_PROCESS, 0))
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(_autogroup_nice())
    except OSError:
        pass


def _autogroup_nice(pid: str = "self") -> str:
    """The niceness of the process's autogroup ("/autogroup-42 nice 0"), "0" where there is none."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return f.read().split()[-1]
    except (OSError, IndexError):
        return "0"


def _die_with_parent() -> None:
    """SIGKILL when the test process ends, however it ends (Linux; its ranks die with it in turn,
    mgpu.launch), or now if it already has."""
    import ctypes
    import signal

    parent = int(os.environ.get(PARENT_ENV, "0"))
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent and os.getppid() != parent:
        os._exit(1)


def _lower_priority() -> None:
    """This process's niceness, and its autogroup's where the kernel groups sessions (niceness then
    weighs only within the group), so that the suite's test process keeps its core."""
    os.nice(NICE)
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(NICE))
    except OSError:
        pass


def _run_job(job: str, folder: Path, done: dict):
    from correctness import helpers

    if job == "reference":
        return helpers.reference_trajectory(helpers.weights_config("single"), folder / "trajectory")
    if job.startswith("ranks"):
        return helpers.spawn_rank_runs(int(job[len("ranks"):]), done["reference"], folder / job)
    if job.startswith("parity-"):
        from correctness.shared_jobs import run_parity_job

        return run_parity_job(job[len("parity-"):])
    if job == FIGURES_DDP_JOB:
        from correctness.shared_jobs import timed_run

        (folder / job).mkdir()
        return timed_run("ddp", 2, folder / job)
    raise ValueError(f"unknown job {job!r}")


def _jobs(folder: Path) -> list[str]:
    """The jobs conftest assigns when collection ends (SharedRuns.assign); it ends this process
    instead when there are none, and this process ends with it in any case (_die_with_parent)."""
    path = folder / JOBS_FILE
    while not path.exists():
        time.sleep(0.05)
    return path.read_text().split()


def main(argv: list[str] | None = None) -> None:
    """FOLDER: SPECULATIVE_JOB, then the jobs of FOLDER/jobs.txt once it is written; each job's result
    into FOLDER/JOB.pkl, written whole (a reader never sees half a file); an error as its text, for
    the tests that read the job to report (and, for `reference`, the rank runs that start from it)."""
    argv = sys.argv[1:] if argv is None else argv
    folder, start = Path(argv[0]), time.monotonic()
    _die_with_parent()
    _lower_priority()
    import torch

    from mgpu import devices as devmod

    torch.set_num_threads(1)  # as the test process computes (conftest's one_thread); ranks choose their own
    devmod.set_exact_gpu_math()  # as the test process does (conftest's _exact_gpu_math)
    done = {}
    _do(SPECULATIVE_JOB, folder, done, start)
    for job in _jobs(folder):
        if job not in done:
            _do(job, folder, done, start)


def _do(job: str, folder: Path, done: dict, start: float) -> None:
    try:
        if job.startswith("ranks") and isinstance(done.get("reference"), str):
            raise RuntimeError(f"no single-device trajectory to start from: {done['reference']}")
        done[job] = _run_job(job, folder, done)
    except Exception as e:  # noqa: BLE001 (reported by every test that reads this job)
        done[job] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    path = folder / f"{job}.pkl"
    with open(path.with_suffix(".tmp"), "wb") as f:
        pickle.dump(done[job], f)
    os.replace(path.with_suffix(".tmp"), path)
    print(f"{job}: {'failed' if isinstance(done[job], str) else 'done'} at {time.monotonic() - start:.1f} s",
          flush=True)
