"""Start one process per rank on this machine, watch them, and never hang.

    >>> spawn(worker, cfg, nprocs=2)    # worker(cfg) runs in each rank with RANK, WORLD_SIZE, ... set

The ranks see the same environment variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so the code they run is the code torchrun runs.

Failure behaviour (docs/failures.md has the whole story):

* A rank that raises writes its error to a report file and exits 1; a rank that is killed or
  exits non-zero says nothing. Either way the launcher notices within `poll_s`, waits
  `REPORT_GRACE_S` for the cause to report (peers that lost the rank often fail a moment
  later with connection errors), terminates the other ranks (SIGTERM, then SIGKILL after
  `TERMINATE_GRACE_S`) and raises `LaunchError` naming the rank that failed first and why.
* Ctrl-C (SIGINT) or SIGTERM to the launcher stops every rank, then raises KeyboardInterrupt
  (`Terminated`, a KeyboardInterrupt carrying the signal number, for SIGTERM).
* Ranks die with the launcher (Linux: PR_SET_PDEATHSIG), so even a SIGKILLed launcher leaves
  no rank behind.
* With no `port` given, each run picks its own free port, and a run that loses the race for it
  to another process (EADDRINUSE) starts again on a new one: concurrent runs never collide.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from mgpu.errors import LaunchError, MgpuError

__all__ = ["free_port", "check_port_free", "spawn", "under_launcher", "Terminated"]

# After one rank fails, the others get this long to stop on SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 3.0
# After the first sign of a failure, wait this long for the failing rank's own report.
REPORT_GRACE_S = 0.5
# Once one rank has finished cleanly, the others must finish within this many seconds.
FINISH_GRACE_S = 60.0
# Attempts to start a run whose automatically chosen port was taken by someone else meanwhile.
PORT_ATTEMPTS = 3

_SECONDARY_WORDS = ("connection", "peer", "closed", "timed out", "timeout", "broken pipe", "reset by")


class Terminated(KeyboardInterrupt):
    """The launcher got SIGTERM: every rank was stopped. `signum` is the signal's number."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


def under_launcher() -> bool:
    """True inside a rank started by torchrun or by `spawn`."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago; each run asks for its own."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """LaunchError when `port` cannot be bound on `host` (someone else listens there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            raise LaunchError(f"port {port} on {host} is already in use: choose another with --port, "
                              "or leave it out to pick a free one") from None


# -- inside a rank ---------------------------------------------------------------------------------

def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this rank when the launcher dies, however it dies."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except Exception:  # no libc prctl: the launcher's own clean-up still applies
            pass
    if os.getppid() != parent_pid:  # the launcher died before prctl took effect
        os._exit(1)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _report(run_dir: str, rank: int, kind: str, message: str, detail: str) -> None:
    try:
        _write_json(Path(run_dir) / f"error-{rank}.json",
                    {"rank": rank, "kind": kind, "message": message, "detail": detail})
    except OSError:  # the launcher still sees the exit code
        pass


def _rank_main(fn: Callable, cfg: Any, rank: int, nprocs: int, port: int, run_dir: str, parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nprocs),
                      LOCAL_WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        result = fn(cfg)
        if rank == 0:  # pickle, not torch.save: this module never imports torch (cheap ranks for cheap work)
            tmp = Path(run_dir) / "result.pkl.tmp"
            with open(tmp, "wb") as f:
                pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, Path(run_dir) / "result.pkl")
    except KeyboardInterrupt:
        _report(run_dir, rank, "KeyboardInterrupt", "interrupted", "")
        raise SystemExit(130)
    except BaseException as e:  # report anything, then exit non-zero
        detail = "" if isinstance(e, MgpuError) else traceback.format_exc()
        message = str(e).strip() or repr(e)
        _report(run_dir, rank, type(e).__name__, message, detail)
        raise SystemExit(1)


# -- in the launcher -------------------------------------------------------------------------------

def _stop(procs) -> None:
    """Terminate every rank still running, then kill the ones that ignore it; signals can't interrupt this."""
    in_main = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
    try:
        for p in procs:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + TERMINATE_GRACE_S
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def spawn(fn: Callable, cfg: Any, nprocs: int, port: int | None = None, deadline_s: float | None = None,
          poll_s: float = 0.05) -> Any:
    """Run fn(cfg) in nprocs fresh processes (ranks 0..nprocs-1); return rank 0's result.

    Raises LaunchError naming the first rank that failed, or saying the run outlived
    `deadline_s` seconds (None: no limit); KeyboardInterrupt (Ctrl-C) or `Terminated` (SIGTERM)
    after stopping all ranks. An explicit `port` already in use is a LaunchError up front.
    """
    if port is not None:
        check_port_free(port)
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    try:
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                return _spawn_once(fn, cfg, nprocs, port if port is not None else free_port(), deadline_s, poll_s)
            except _PortTaken as e:
                if port is not None or attempt == PORT_ATTEMPTS:
                    raise e.error from None
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)


class _PortTaken(Exception):
    def __init__(self, error: LaunchError):
        super().__init__(str(error))
        self.error = error


def _spawn_once(fn, cfg, nprocs, port, deadline_s, poll_s):
    ctx = mp.get_context("spawn")  # fork would copy CUDA and thread-pool state into the ranks
    with tempfile.TemporaryDirectory(prefix="mgpu-ranks-") as run_dir:
        procs = [ctx.Process(target=_rank_main, args=(fn, cfg, r, nprocs, port, run_dir, os.getpid()),
                             name=f"mgpu-rank-{r}") for r in range(nprocs)]
        try:
            for p in procs:
                p.start()
            failed = _watch(procs, run_dir, poll_s, deadline_s)
        except BaseException:  # Ctrl-C, SIGTERM, or a bug here: no rank may outlive the launcher
            _stop(procs)
            raise
        if failed is not None:
            _stop(procs)
            if "EADDRINUSE" in str(failed) or "address already in use" in str(failed).lower():
                raise _PortTaken(failed)
            raise failed
        result_file = Path(run_dir) / "result.pkl"
        if not result_file.exists():
            raise LaunchError("rank 0 finished without a result")
        with open(result_file, "rb") as f:
            return pickle.load(f)


def _read_reports(run_dir: str) -> dict[int, dict]:
    reports = {}
    for path in Path(run_dir).glob("error-*.json"):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        reports[int(report["rank"])] = report
    return reports


def _watch(procs, run_dir: str, poll_s: float, deadline_s: float | None) -> LaunchError | None:
    """Wait until every rank exits 0 (None) or one fails (its LaunchError)."""
    end = None if deadline_s is None else time.monotonic() + deadline_s
    first_done = None
    while True:
        now = time.monotonic()
        codes = [p.exitcode for p in procs]
        if any(c not in (None, 0) for c in codes) or any(Path(run_dir).glob("error-*.json")):
            time.sleep(REPORT_GRACE_S)  # the cause may still be writing its report
            return _blame([p.exitcode for p in procs], _read_reports(run_dir))
        if all(c == 0 for c in codes):
            return None
        if first_done is None and any(c == 0 for c in codes):
            first_done = now
        if end is not None and now > end:
            running = [r for r, c in enumerate(codes) if c is None]
            return LaunchError(f"run exceeded its deadline of {deadline_s:g} s; ranks still running: {running}")
        if first_done is not None and now - first_done > FINISH_GRACE_S:
            running = [r for r, c in enumerate(codes) if c is None]
            return LaunchError(f"ranks {running} did not finish within {FINISH_GRACE_S:g} s "
                               f"of the others: stopped them")
        time.sleep(poll_s)


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0].strip() if lines else ""


def _is_secondary(report: dict) -> bool:
    # A rank that raised its own error is the cause; ranks that lost a peer report
    # connection errors or timeouts afterwards.
    return any(w in report["message"].lower() for w in _SECONDARY_WORDS)


def _blame(codes: list, reports: dict[int, dict]) -> LaunchError:
    """The rank to blame first: its own error > died without a word > lost a peer (or timed out)."""
    silent = {r: c for r, c in enumerate(codes) if c not in (None, 0) and r not in reports}
    candidates = ([(0, r) for r, rep in reports.items() if not _is_secondary(rep)]
                  + [(1, r) for r in silent]
                  + [(2, r) for r, rep in reports.items() if _is_secondary(rep)])
    _, rank = min(candidates)
    if rank in reports:
        rep = reports[rank]
        text = f"rank {rank} failed: {rep['kind']}: {_first_line(rep['message'])}"
    else:
        code = silent[rank]
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        text = f"rank {rank} failed: {how}"
    others = []
    for r, code in enumerate(codes):
        if r == rank:
            continue
        if r in reports:
            others.append(f"rank {r}: {reports[r]['kind']}: {_first_line(reports[r]['message'])[:200]}")
        elif code is None:
            others.append(f"rank {r}: still running, stopped")
        elif code != 0:
            others.append(f"rank {r}: exit code {code}")
    if others:
        text += "\nthen " + "; ".join(others)
    detail = reports.get(rank, {}).get("detail", "")
    if detail:
        text += "\n" + detail.rstrip()
    return LaunchError(text)
