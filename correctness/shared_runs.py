"""The suite's shared rank runs (helpers.spawn_rank_runs), started in the background as collection ends.

Spawning them takes seconds of ranks per world size, during which the test process only waits;
meanwhile the rest of the suite runs in one process on one core (conftest's `one_thread`) and
leaves the machine's other cores idle. So when collection ends, conftest starts one process, at
lower priority, that computes the single-device trajectory they start from (the session's
`single_trajectory`, helpers.reference_trajectory) and then spawns the ranks of each world size
the selected tests use, one world after the other, writing each result to a file. The session
fixtures read those files, waiting where a test comes first; a world size nobody announced is
spawned in the test process, as before.

What the runs compute is unchanged: the same jobs (helpers.spawn_rank_runs) from the reference's
checkpoints, in ranks forked the same way (mgpu.launch.spawn); only the process that launches them
differs. The trajectory is computed as the test process would (one thread, exact GPU math), and the
tests compare the ranks' steps with that very trajectory.

    python -c "from correctness.shared_runs import main; main()" FOLDER 2 3   # what the process runs
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
REFERENCE_FILE = "reference.pkl"
# Long enough for both worlds' spawns on a busy machine, each bounded by helpers.DDP_DEADLINE_S itself.
WAIT_S = 280.0


def world_sizes_of(items) -> list[int]:
    """The world sizes of the shared runs these test items read: the tests that take the `rank_runs`
    fixture and start processes (marker `multiprocess`; test_evaluation's manual cases take the
    fixture without using it), at their parameter `world_size` or `n` (2 where they have neither:
    every such test reads rank_runs(2)). Worlds of one run in the test process (helpers.run_job_in_this_process)."""
    sizes = set()
    for item in items:
        if "rank_runs" not in getattr(item, "fixturenames", ()) or item.get_closest_marker("multiprocess") is None:
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        size = params.get("world_size", params.get("n", 2))
        if isinstance(size, int) and size >= 2:
            sizes.add(size)
    return sorted(sizes)


def _result_file(folder: Path, world_size: int) -> Path:
    return folder / f"ranks{world_size}.pkl"


@dataclass
class BackgroundRankRuns:
    """The process computing the reference trajectory and the shared rank runs of `world_sizes`
    from it, writing them under `folder`."""
    world_sizes: tuple
    folder: Path
    proc: subprocess.Popen

    @classmethod
    def start(cls, world_sizes, folder: Path) -> "BackgroundRankRuns":
        from mgpu.config import EXACT_GPU_MATH_ENV
        from mgpu.faults import FAULT_ENV

        env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, "RANK", "WORLD_SIZE")}
        env[EXACT_GPU_MATH_ENV] = "1"  # started before the suite's fixtures: GPU math as exact as theirs
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        log = open(folder / "log.txt", "w")
        # A session of its own: its priority (an autogroup's, where the kernel has them) is its own, and
        # stop() ends it with its fork server and ranks.
        proc = subprocess.Popen([sys.executable, "-c", "from correctness.shared_runs import main; main()", str(folder),
                                 *map(str, world_sizes)], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return cls(tuple(world_sizes), folder, proc)

    def reference(self, wait_s: float = WAIT_S):
        """The single-device trajectory (helpers.Trajectory) the runs start from."""
        return self._read(self.folder / REFERENCE_FILE, "the single-device trajectory", wait_s)

    def result(self, world_size: int, wait_s: float = WAIT_S):
        """The RankRuns of `world_size`."""
        return self._read(_result_file(self.folder, world_size), f"the runs of {world_size} ranks", wait_s)

    def _read(self, path: Path, what: str, wait_s: float):
        """What the process wrote to `path`, once written; an exception naming what went wrong where it
        failed (its own error, or its log's end when it died without one)."""
        end = time.monotonic() + wait_s
        if not path.exists():
            self._hurry()
        while not path.exists():
            if self.proc.poll() is not None and not path.exists():
                raise RuntimeError(f"the background process ended (exit code {self.proc.returncode}) without "
                                   f"{what}; its log ends:\n{self._log_tail()}")
            if time.monotonic() > end:
                self.stop()
                raise RuntimeError(f"{what} did not come within {wait_s:.0f} s; the background process's log "
                                   f"ends:\n{self._log_tail()}")
            time.sleep(0.05)
        with open(path, "rb") as f:
            outcome = pickle.load(f)
        if isinstance(outcome, str):  # the error, as the process caught it
            raise RuntimeError(outcome)
        return outcome

    def _hurry(self) -> None:
        """A test waits for the process: it (and its fork server and ranks, its process group) gets the
        test process's priority back, where this user may raise a priority (root; else it waits at the
        lower one, which on a machine busy with other jobs may take longer)."""
        try:
            os.setpriority(os.PRIO_PGRP, self.proc.pid, os.getpriority(os.PRIO_PROCESS, 0))
            with open(f"/proc/{self.proc.pid}/autogroup", "w") as f:
                f.write(_autogroup_nice())
        except OSError:
            pass

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


def _autogroup_nice(pid: str = "self") -> str:
    """The niceness of the process's autogroup ("/autogroup-42 nice 0"), "0" where there is none."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return f.read().split()[-1]
    except (OSError, IndexError):
        return "0"


def _lower_priority() -> None:
    """This process's niceness, and its autogroup's where the kernel groups sessions (niceness then
    weighs only within the group), so that the suite's test process keeps its core."""
    os.nice(NICE)
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(NICE))
    except OSError:
        pass


def _write(path: Path, outcome) -> None:
    """`outcome` pickled to `path`, whole: a reader never sees half a file."""
    with open(path.with_suffix(".tmp"), "wb") as f:
        pickle.dump(outcome, f)
    os.replace(path.with_suffix(".tmp"), path)
    print(f"{path.name}: {'failed' if isinstance(outcome, str) else 'written'}", flush=True)


def main(argv: list[str] | None = None) -> None:
    """FOLDER SIZE...: the single-device trajectory into FOLDER/reference.pkl, then each world size's
    RankRuns into FOLDER/ranksSIZE.pkl (an error as its text, for the tests to report)."""
    import torch

    from correctness.helpers import reference_trajectory, spawn_rank_runs, weights_config
    from mgpu import devices as devmod

    argv = sys.argv[1:] if argv is None else argv
    folder, sizes = Path(argv[0]), [int(a) for a in argv[1:]]
    _lower_priority()
    torch.set_num_threads(1)  # as the test process computes (conftest's one_thread); the ranks choose their own
    devmod.set_exact_gpu_math()  # as the test process does (conftest's _exact_gpu_math)
    try:
        reference = reference_trajectory(weights_config("single"), folder / "trajectory")
    except Exception as e:  # noqa: BLE001 (reported by every test that reads it)
        _write(folder / REFERENCE_FILE, f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        return
    _write(folder / REFERENCE_FILE, reference)
    for size in sizes:
        try:
            outcome = spawn_rank_runs(size, reference, folder / f"ranks{size}")
        except Exception as e:  # noqa: BLE001 (reported by every test that reads this world's runs)
            outcome = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        _write(_result_file(folder, size), outcome)
