"""The rank's entry: what mgpu.launch.spawn runs in every rank of a check-script run. It makes the
process look as a fresh `python SCRIPT` would, runs the script under the Recorder (recorder.py) up to
step K, and saves the record for the launcher (launch.py)."""

from __future__ import annotations

import os
import random
import runpy
import sys
import time

import torch

from mgpu.check.script.inrank.records import RankTiming
from mgpu.check.script.plan import ScriptRankJob
from mgpu.check.script.inrank.float64 import Float64Lift
from mgpu.check.script.inrank.precision import LiftPrecision
from mgpu.check.script.inrank.recorder import Recorder, StopScript
from mgpu.check.script.inrank.tracer import Tracer

__all__ = ["run_rank"]

# torch's default seed in the releases that seed every fresh process alike (c10's default_rng_seed_val).
FIXED_DEFAULT_SEED = 67280421310721


def _fresh_process_state(job: ScriptRankJob) -> None:
    import multiprocessing

    # A rank forked from the fork server inherits its start method ("forkserver"): a fresh `python
    # SCRIPT` has the platform's default (fork on Linux before Python 3.14), so that a DataLoader's
    # workers are forked from the rank, as under torchrun, not started from the server.
    multiprocessing.set_start_method(None, force=True)
    # A fresh process starts torch's generator from torch's default seed: a fixed one in some releases,
    # drawn from the operating system in others (2.14), and Python's and numpy's from the operating
    # system. A forked rank holds the fork server's states: it gets what a fresh process would have.
    if torch.initial_seed() == FIXED_DEFAULT_SEED:
        torch.manual_seed(FIXED_DEFAULT_SEED)
    else:
        torch.seed()
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if job.threads:
        torch.set_num_threads(job.threads)
    for key, value in job.env:
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if job.exact_gpu_math:
        from mgpu.devices import set_exact_gpu_math

        set_exact_gpu_math()


def _redirect_output(folder: str, tag: str, rank: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, name in ((1, "out"), (2, "err")):
        f = os.open(os.path.join(folder, f"{tag}-rank{rank}.{name}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)


def _leave_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:
            pass


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def run_rank(job: ScriptRankJob) -> dict:
    """Run the script in this rank, recording; save the record; return a summary."""
    rank = int(os.environ.get("RANK", "0"))
    started = time.time()
    _redirect_output(job.folder, job.tag, rank)
    _fresh_process_state(job)
    os.chdir(job.cwd or os.getcwd())  # the launcher's: the fork server's may be older
    user_cwd = os.getcwd()
    if job.workdir:  # --whole-run: this run's own folder (apart.py); TMPDIR is in job.env
        import tempfile

        os.chdir(job.workdir)
        tempfile.tempdir = None
    recorder = Recorder(job)
    if job.module:
        sys.argv = [job.module, *job.args]
        sys.path[0:1] = [user_cwd]  # python -m finds MODULE from the folder check-script was run from
    else:
        sys.argv = [job.script, *job.args]
        sys.path[0:1] = [os.path.dirname(os.path.abspath(job.script))]
    exit_code = 0
    how = "returned"
    lift = LiftPrecision() if job.lift_precision else None
    if lift is not None:
        lift.__enter__()
    wide = Float64Lift() if job.float64 else None  # confirm.py's runs (float64.py)
    if wide is not None:
        wide.__enter__()
    recorder.install()
    tracer = Tracer(job.trace_step) if job.trace_step else None  # locate.py's second run only
    if tracer is not None:
        tracer.install()
    script_start = time.time()
    try:
        if job.module:
            runpy.run_module(job.module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(job.script, run_name="__main__")
    except StopScript:
        how = "stopped after --steps"
    except SystemExit as e:
        exit_code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        how = f"sys.exit({e.code!r})"
        if exit_code:
            if not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
            raise
    finally:
        if tracer is not None:
            tracer.uninstall()
        recorder.uninstall()
        if lift is not None:
            lift.__exit__(None, None, None)
        if wide is not None:
            wide.__exit__(None, None, None)
        sys.stdout.flush()
        sys.stderr.flush()
    script_end = time.time()
    result = recorder.result()
    result.rank, result.world = rank, int(os.environ.get("WORLD_SIZE", "1"))
    result.trace = tracer.trace if tracer is not None else None
    result.lifted = dict(lift.lifted) if lift is not None else {}
    result.timing = RankTiming(started, script_start, script_end, recorder.first_forward, recorder.step_times)
    result.exit = how
    torch.save(result, os.path.join(job.folder, f"{job.tag}-rank{rank}.pt"))
    if recorder.meeting is not None:  # --whole-run at N ranks: wait on files, never in a collective (meeting.py)
        recorder.meeting.ended()
        recorder.meeting.wait_for_all()
        _destroy_process_group()
    else:
        _leave_process_group()
    return {"rank": rank, "steps": len(result.steps)}
