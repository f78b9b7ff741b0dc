"""Start one process per rank on this machine with torch's elastic agent (what torchrun runs).

    >>> spawn(worker, cfg, nprocs=2)    # worker(cfg) runs in each rank with RANK, WORLD_SIZE, ... set

`spawn` runs `torch.distributed.launcher.api.elastic_launch` in this process: one node, no
restarts, a one-node rendezvous on 127.0.0.1 port 0 (the agent binds free ports itself, for the
rendezvous and for the ranks' MASTER_PORT, so concurrent runs never race for one; see
mgpu/rendezvous.py for why not torch's c10d one), ranks forked
from multiprocessing's fork server, which has imported torch once (see START_METHOD). The ranks see torchrun's environment variables, so the code they run is the code
torchrun runs (MASTER_PORT is a store the agent hosts, TORCHELASTIC_USE_AGENT_STORE=True: a rank
that starts a process group on a port of its own must set that to False). The agent watches the
ranks, stops them all when one fails, and raises ChildFailedError; the rank entry carries
`@record`, so a rank's exception reaches the launcher, which turns the first failure into a
`LaunchError` whose one line names the rank and its error ("rank 1 failed: RuntimeError: ...",
"rank 1 failed: killed by SIGKILL"), followed by the rank's traceback unless it raised an mgpu
error; its fields `rank`, `kind` (the exception's class name, or "signal", "exit", "deadline",
"port") and `message` say the same to callers. The agent's own log lines are kept off the
terminal while it runs. (docs/guide/failures.md, chapter 3.)

What the agent lacks, added here in a few lines each:

* Ranks die with the launcher however it dies (PR_SET_PDEATHSIG=SIGKILL in each rank; torch
  sets SIGINT, which a rank inside a collective cannot act on).
* `deadline_s`: a timer in each rank ends it (exit code DEADLINE_EXIT) at the deadline.
* Signals: the agent turns SIGTERM into SignalException; `spawn` raises `Terminated` (a
  KeyboardInterrupt carrying the signal number) instead. SIGINT is left to Python: Ctrl-C is a
  KeyboardInterrupt, and the agent stops the ranks (SIGTERM, then SIGKILL after
  TERMINATE_GRACE_S; on a torch whose LaunchConfig lacks `shutdown_timeout`, 2.11 for one, after
  torch's own default grace) as it unwinds; torch's own SIGINT handling would send the ranks SIGINT,
  which a rank waiting in a collective ignores until the agent's grace runs out. A launcher
  started with SIGINT ignored (a background job of a script) keeps ignoring it, and so do its
  ranks: only SIGTERM stops it then.
* A rank interrupted by SIGINT exits 130; torch's worker wrapper would have it exit 0 without a
  result, and the agent would then wait for that result for ever.
* The agent names the first rank it sees exit. A rank that only lost a peer (connection reset,
  closed, timed out) waits REPORT_GRACE_S before exiting, so that the cause is named. Without
  it the cause usually exits first anyway (a peer must notice, unwind and tear torch down
  first), but nothing guarantees that order on a busy machine; the grace does.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import os
import pickle
import signal
import socket
import tempfile
import threading
import time
import uuid
from typing import Any, Callable

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record

from mgpu import errors
from mgpu.errors import LaunchError

__all__ = ["free_port", "check_port_free", "spawn", "under_launcher", "is_global_rank_0", "Terminated"]

# After the ranks are told to stop (SIGTERM), they get this long before SIGKILL.
TERMINATE_GRACE_S = 3
# A rank that only lost a peer waits this long before exiting, so that the cause is named.
REPORT_GRACE_S = 0.5
# Exit code of a rank ended by spawn's deadline_s.
DEADLINE_EXIT = errors.EXIT_RANK_DEADLINE
# Ranks are forked from one server process that imported torch when it started (multiprocessing's
# "forkserver"), not started as fresh interpreters ("spawn") that import torch each: a rank then
# costs a fork instead of an import of torch, and later spawns from the same launcher (a test
# session, `mgpu check` over several world sizes) reuse the server. The server is a fresh,
# single-threaded process that never touched CUDA, so forking it is safe.
START_METHOD = "forkserver"
# mgpu/fork_server.py imports torch and what every rank needs, with the garbage collector's care;
# `_server_preload` adds the module of the first spawn's rank function where it is mgpu's own.
_SERVER_PRELOAD = ["mgpu.fork_server"]
# The environment this module was imported with. In a rank forked from the server it is the
# server's (the launcher's when the server started), before the agent added RANK, WORLD_SIZE, ...
_ENV_AT_IMPORT = dict(os.environ)

_SECONDARY_WORDS = ("connection", "peer", "closed", "timed out", "timeout", "broken pipe", "reset by")
_AGENT_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")


class Terminated(KeyboardInterrupt):
    """The launcher got SIGTERM: every rank was stopped. `signum` is the signal's number."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


def under_launcher() -> bool:
    """True inside a rank started by torchrun or by `spawn`."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def is_global_rank_0() -> bool:
    """True outside any launcher, and in the rank whose RANK is 0 (on whichever node it runs)."""
    return not under_launcher() or os.environ["RANK"] == "0"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
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
                              "or leave it out to pick a free one", kind="port") from None


# -- inside a rank ---------------------------------------------------------------------------------

def _die_with_parent(launcher_pid: int) -> None:
    """Have the kernel SIGKILL this rank when its parent dies, however it dies: the parent is the
    fork server, which exits when the launcher does."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # no prctl (not Linux): the agent's own clean-up still applies
        pass
    _release_fork_server()
    try:
        os.kill(launcher_pid, 0)
    except ProcessLookupError:  # the launcher died before prctl took effect
        os._exit(1)
    except PermissionError:
        pass


def _release_fork_server() -> None:
    """Close this rank's copy of the fork server's liveness pipe. multiprocessing hands one to
    every process the server forks, so that the server outlives all of them; but the server must
    exit when the launcher does, taking the ranks with it (their parent-death signal). With the
    copy held, a SIGKILLed launcher would leave server and ranks waiting for each other."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None and getattr(server, "_forkserver_pid", None) is None:  # a process the server forked
        try:
            os.close(fd)
        except OSError:
            pass
        server._forkserver_alive_fd = None


def _adopt_environment(launcher_env: dict) -> None:
    """os.environ := the launcher's at spawn time, plus what the agent set for this rank. A rank
    forked from the fork server starts with the server's environment, which is older when the
    launcher changed its own since the server started (a test setting MGPU_FAULT, say)."""
    from_agent = {k: v for k, v in os.environ.items() if _ENV_AT_IMPORT.get(k) != v}
    os.environ.clear()
    os.environ.update(launcher_env)
    os.environ.update(from_agent)


@record
def _rank_main(fn: Callable, cfg_bytes: bytes, launcher_pid: int, end_time: float | None, launcher_env: dict) -> Any:
    # What the fork server imported (torch: hundreds of thousands of objects) goes to the garbage
    # collector's permanent generation: each full collection of the rank then walks only what the
    # rank allocates. (Python's docs advise this after a fork; it also keeps those pages shared.)
    gc.freeze()
    _adopt_environment(launcher_env)
    cfg = pickle.loads(cfg_bytes)
    _die_with_parent(launcher_pid)
    if end_time is not None:
        timer = threading.Timer(max(0.0, end_time - time.time()), os._exit, args=(DEADLINE_EXIT,))
        timer.daemon = True
        timer.start()
    try:
        return fn(cfg)
    except KeyboardInterrupt:
        raise SystemExit(errors.EXIT_SIGNALLED + signal.SIGINT) from None
    except Exception as e:
        if any(w in str(e).lower() for w in _SECONDARY_WORDS):
            time.sleep(REPORT_GRACE_S)  # let the rank that caused this exit first
        raise


# -- in the launcher -------------------------------------------------------------------------------

def _raise_terminated(signum, frame):
    raise Terminated(signum)


@contextlib.contextmanager
def _quiet_agent():
    """Keep the agent's log lines (torch.distributed.elastic, ...) off stderr while it runs."""
    null, loggers = logging.NullHandler(), [logging.getLogger(name) for name in _AGENT_LOGGERS]
    saved = [lg.propagate for lg in loggers]
    for lg in loggers:
        lg.addHandler(null)
        lg.propagate = False
    try:
        yield
    finally:
        for lg, propagate in zip(loggers, saved):
            lg.removeHandler(null)
            lg.propagate = propagate


def _server_preload(fn: Callable) -> list[str]:
    """What the fork server imports when it starts: _SERVER_PRELOAD, and the module of the rank function
    when it is mgpu's own (check-script's recorder, `mgpu check`'s ranks, `mgpu train`'s job). Each rank
    imports that module anyway, to unpickle `fn`; imported in the server, the ranks forked from it
    inherit it (check-script's recorder and its modules: 20-80 ms of CPU a rank). mgpu's modules only:
    they start no thread and touch no CUDA at import, which the server must not (another package's
    module, a test's, might: a `torch.cuda.is_available()` in a skip mark). Only the spawn that starts
    the server decides; later ones with another function import theirs in each rank, as before."""
    module = getattr(fn, "__module__", None) or ""
    return _SERVER_PRELOAD + ([module] if module.startswith("mgpu.") and module not in _SERVER_PRELOAD else [])


def _shutdown_grace(launch_config: type) -> dict:
    """LaunchConfig's grace for ranks between SIGTERM and SIGKILL, where this torch has the field
    (newer than 2.11, which found it missing on the H200 machine); older ones keep their default."""
    fields = getattr(launch_config, "__dataclass_fields__", {})
    return {"shutdown_timeout": TERMINATE_GRACE_S} if "shutdown_timeout" in fields else {}


def spawn(fn: Callable, cfg: Any, nprocs: int, port: int | None = None, deadline_s: float | None = None,
          poll_s: float = 0.1) -> Any:
    """Run fn(cfg) in nprocs fresh processes (ranks 0..nprocs-1); return rank 0's result.

    Raises LaunchError naming the first rank that failed, or saying the run outlived
    `deadline_s` seconds (None: no limit); KeyboardInterrupt (Ctrl-C) or `Terminated` (SIGTERM)
    after stopping all ranks. An explicit `port` (the rendezvous port; default: one the agent
    picks) already in use is a LaunchError up front. `poll_s`: how often the agent looks at the ranks.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from mgpu import rendezvous

    if port is not None:
        check_port_free(port)
    end_time = None if deadline_s is None else time.time() + deadline_s
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    old_env = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")  # launch_agent sets it
    try:
        with tempfile.TemporaryDirectory(prefix="mgpu-ranks-") as logs, _quiet_agent():
            config = LaunchConfig(
                min_nodes=1, max_nodes=1, nproc_per_node=nprocs, run_id=f"mgpu-{uuid.uuid4().hex}",
                rdzv_backend=rendezvous.BACKEND, rdzv_endpoint=f"127.0.0.1:{port or 0}",
                max_restarts=0, monitor_interval=poll_s, start_method=START_METHOD, signals_to_handle="SIGTERM",
                logs_specs=DefaultLogsSpecs(log_dir=logs), **_shutdown_grace(LaunchConfig))
            rendezvous.register()
            multiprocessing.get_context(START_METHOD).set_forkserver_preload(_server_preload(fn))
            # cfg as bytes: multiprocessing would send each tensor in it as a file descriptor, and the
            # fork server takes at most 253 per process (SCM_RIGHTS): a model's state dict has more.
            return elastic_launch(config, _rank_main)(fn, pickle.dumps(cfg), os.getpid(), end_time, dict(os.environ))[0]
    except ChildFailedError as e:
        raise _launch_error(e, deadline_s) from None
    except SignalException as e:
        raise Terminated(e.sigval) from None
    finally:
        if old_env is None:
            os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)
        else:
            os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = old_env
        if in_main:
            signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)


def _mgpu_error_names(cls=errors.MgpuError) -> set[str]:
    return {cls.__name__}.union(*(_mgpu_error_names(sub) for sub in cls.__subclasses__()))


def _launch_error(e: ChildFailedError, deadline_s: float | None) -> LaunchError:
    """'rank R failed: Type: message' (and the rank's traceback unless it raised an mgpu error), with
    the rank, the kind (Type, where the rank raised) and the message in LaunchError's fields."""
    rank, failure = e.get_first_failure()
    if isinstance(failure.message, dict):  # the rank raised: @record wrote its error file
        message = failure.message.get("message", "").strip()  # "Type: message" (torch's ErrorHandler)
        lines = [line for line in message.splitlines() if line.strip()] or ["<no message>"]
        text = f"rank {rank} failed: {lines[0].strip()}"
        if message.split(":")[0] not in _mgpu_error_names():
            text += "\n" + _rank_traceback(failure.message.get("extraInfo", {}).get("py_callstack", ""))
        kind, colon, said = lines[0].strip().partition(":")
        if not (colon and kind.isidentifier()):
            kind, said = None, lines[0]
        return LaunchError(text, rank=rank, kind=kind, message=said.strip())
    if failure.exitcode == DEADLINE_EXIT and deadline_s is not None:
        return LaunchError(f"run exceeded its deadline of {deadline_s:g} s: every rank stopped", kind="deadline")
    if failure.exitcode < 0:
        return LaunchError(f"rank {rank} failed: killed by {failure.signal_name()}", rank=rank, kind="signal",
                           message=f"killed by {failure.signal_name()}")
    return LaunchError(f"rank {rank} failed: exited with code {failure.exitcode}", rank=rank, kind="exit",
                       message=f"exited with code {failure.exitcode}")


def _rank_traceback(callstack: str) -> str:
    """The rank's traceback from its own function on (without the frames of @record and _rank_main)."""
    lines = callstack.rstrip().splitlines()
    at = next((i for i, line in enumerate(lines) if line.endswith(", in _rank_main")), None)
    if at is None:
        return "\n".join(lines)
    rest = next((i for i in range(at + 1, len(lines)) if lines[i].startswith("  File ")), len(lines))
    return "\n".join([lines[0], *lines[rest:]])
