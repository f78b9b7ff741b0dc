"""Start one process per rank on this machine, watch them, and never hang.

    >>> spawn(worker, cfg, nprocs=2)    # worker(cfg) runs in each rank with RANK, WORLD_SIZE, ... set

The ranks see the same environment variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so the code they run is the code torchrun runs.
If any rank raises, exits non-zero or is killed, the others are terminated (then killed) and
`LaunchError` names the rank and its error. Ctrl-C stops every rank.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from mgpu.errors import LaunchError, MgpuError

__all__ = ["free_port", "check_port_free", "spawn", "under_launcher"]

# After one rank fails, the others get this long to stop on SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 3.0


def under_launcher() -> bool:
    """True inside a rank started by torchrun or by `spawn`."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago; each run asks for its own."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            raise LaunchError(f"port {port} on {host} is already in use: choose another with --port, "
                              "or leave it out to pick a free one") from None


def _rank_main(fn: Callable, cfg: Any, rank: int, nprocs: int, port: int, result_dir: str, errors) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nprocs),
                      LOCAL_WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        result = fn(cfg)
        if rank == 0:
            tmp = Path(result_dir) / "result.pt.tmp"
            torch.save(result, tmp)
            tmp.rename(Path(result_dir) / "result.pt")
    except KeyboardInterrupt:
        errors.put((rank, "KeyboardInterrupt", "interrupted", ""))
        raise SystemExit(130)
    except BaseException as e:  # report anything, then exit non-zero
        detail = "" if isinstance(e, MgpuError) else traceback.format_exc()
        errors.put((rank, type(e).__name__, str(e), detail))
        raise SystemExit(1)


def _stop(procs) -> None:
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


def spawn(fn: Callable, cfg: Any, nprocs: int, port: int | None = None, deadline_s: float | None = None,
          poll_s: float = 0.05) -> Any:
    """Run fn(cfg) in nprocs fresh processes (ranks 0..nprocs-1); return rank 0's result.

    Raises LaunchError naming the first rank that failed, or saying the run outlived
    `deadline_s` seconds (None: no limit); KeyboardInterrupt after stopping all ranks.
    """
    if port is None:
        port = free_port()
    else:
        check_port_free(port)
    ctx = mp.get_context("spawn")  # fork would copy CUDA and thread-pool state into the ranks
    errors = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="mgpu-ranks-") as result_dir:
        procs = [ctx.Process(target=_rank_main, args=(fn, cfg, r, nprocs, port, result_dir, errors),
                             name=f"mgpu-rank-{r}") for r in range(nprocs)]
        try:
            for p in procs:
                p.start()
            failed = _watch(procs, errors, poll_s, deadline_s)
        except KeyboardInterrupt:
            _stop(procs)
            raise
        if failed is not None:
            _stop(procs)
            raise failed
        result_file = Path(result_dir) / "result.pt"
        if not result_file.exists():
            raise LaunchError("rank 0 finished without a result")
        return torch.load(result_file, weights_only=False)


def _watch(procs, errors, poll_s: float, deadline_s: float | None) -> LaunchError | None:
    """Wait until every rank exits 0 (None) or one fails (its LaunchError)."""
    end = None if deadline_s is None else time.monotonic() + deadline_s
    while True:
        if end is not None and time.monotonic() > end:
            running = [r for r, p in enumerate(procs) if p.is_alive()]
            return LaunchError(f"run exceeded its deadline of {deadline_s:g} s; ranks still running: {running}")
        reports = []
        while not errors.empty():
            reports.append(errors.get())
        if reports:
            rank, kind, message, detail = min(reports, key=_blame_order)
            text = f"rank {rank} failed: {kind}: {message}"
            return LaunchError(text + (f"\n{detail.rstrip()}" if detail else ""))
        codes = [p.exitcode for p in procs]
        for rank, code in enumerate(codes):
            if code is not None and code != 0:
                time.sleep(poll_s)  # its own report may still be on its way
                if not errors.empty():
                    break
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                return LaunchError(f"rank {rank} failed: {how}")
        else:
            if all(code == 0 for code in codes):
                return None
            time.sleep(poll_s)


def _blame_order(report) -> tuple:
    # A rank that raised its own error is the cause; ranks that lost a peer report
    # connection errors afterwards. Prefer the former, then the lowest rank.
    rank, kind, message, _ = report
    secondary = any(w in message.lower() for w in ("connection", "peer", "closed", "timed out", "timeout"))
    return (secondary, rank)
