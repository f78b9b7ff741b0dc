"""A step's time limit in `mgpu check` (--step-timeout): a model that hangs in forward or backward
ends the check with CheckTimeout naming the run and the step, instead of hanging it.

    with step_timeout(60.0, "ddp on 2 ranks (rank 0): step 1"):
        ...  # one step: CheckTimeout after 60 s, torch.compile's compiling not counted
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

from mgpu.errors import CheckTimeout

__all__ = ["step_timeout", "RankCompiles"]


@contextlib.contextmanager
def step_timeout(seconds: float | None, what: str, peers: str | None = None):
    """CheckTimeout naming `what` if the block runs longer than `seconds`, not counting the time
    torch.compile spends compiling in it (SIGALRM: main thread only; elsewhere, and with None, no
    limit). A --compile run's first step compiles: with a cold compiler cache (a new machine, a CI
    runner) and other work beside it that takes longer than a step may, and it is not a hang.
    `peers`: a folder the ranks of one run share (RankCompiles). A rank waits at a collective for
    one that still compiles (its pieces of the batch have another shape, so it compiles again when
    this one does not): the time the other ranks compiled while this step ran is left out too.
    A timer that was running when the step began (SIGALRM's handler and its time left) is put back
    when the step ends; one that came due during the step fires then."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return
    clocks = RankCompiles.of(peers) if peers else None
    at_start = clocks.others(time.time()) if clocks else {}
    extended = [0.0]

    def expire(signum, frame):
        if clocks is not None:  # the other ranks' compiling since the step began, not yet added
            now = clocks.others(time.time())
            grown = max((now[k] - at_start.get(k, 0.0) for k in now), default=0.0) - extended[0]
            if grown > 0:
                extended[0] += grown
                signal.setitimer(signal.ITIMER_REAL, grown)
                return
        raise CheckTimeout(f"{what} did not finish within {seconds:g} s: the model hangs in forward or backward "
                           "(or is too slow for --step-timeout; torch.compile's compiling is not counted)")

    old = signal.signal(signal.SIGALRM, expire)
    outer_left, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    began = time.monotonic()
    try:
        with _timer_paused_while_compiling(clocks):
            yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer_left > 0:  # a timer of the caller's (pytest-timeout's backstop, say) runs on; one due meanwhile fires now
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - began), 1e-3), outer_interval)


@contextlib.contextmanager
def _timer_paused_while_compiling(clocks: RankCompiles | None):
    """Stop the step's timer (ITIMER_REAL) when torch compiles and start it again with the time it
    had left when the compile ends (and tell the other ranks, through `clocks`): torch._dynamo's
    compile callbacks, which run around each compilation (a frame traced and compiled, a backward
    compiled lazily at its first use). Without torch._dynamo imported nothing in the block can
    compile (a compiled model imports it)."""
    callback = sys.modules.get("torch._dynamo.callback")
    if callback is None:
        yield
        return
    handler = callback.callback_handler
    left: list[float] = []

    def paused(args) -> None:
        left.append(signal.setitimer(signal.ITIMER_REAL, 0)[0])
        if clocks is not None:
            clocks.compiling(time.time())

    def resumed(args) -> None:
        if clocks is not None:
            clocks.compiled(time.time())
        remaining = left.pop() if left else 0.0
        if remaining > 0:  # 0: the timer had already fired (its CheckTimeout is on its way) or was off
            signal.setitimer(signal.ITIMER_REAL, remaining)

    handler.register_start_callback(paused)
    handler.register_end_callback(resumed)
    try:
        yield
    finally:
        handler.remove_start_callback(paused)
        handler.remove_end_callback(resumed)


class RankCompiles:
    """How long each rank of a run has compiled, in a folder the ranks share: a small file a rank
    (`rank-<pid>`: its compile seconds so far, and when the compile in progress began, if one is),
    replaced whole at each compile's start and end. One object a process and folder (`of`), so the
    seconds add up over the steps."""

    _made: dict[str, "RankCompiles"] = {}

    def __init__(self, folder: str):
        self.folder = Path(folder)
        self.mine = self.folder / f"rank-{os.getpid()}"
        self.total, self.began = 0.0, None

    @classmethod
    def of(cls, folder: str) -> "RankCompiles":
        key = f"{os.getpid()}:{folder}"
        if key not in cls._made:
            cls._made[key] = cls(folder)
        return cls._made[key]

    def compiling(self, now: float) -> None:
        self.began = now
        self._write()

    def compiled(self, now: float) -> None:
        if self.began is not None:
            self.total += now - self.began
        self.began = None
        self._write()

    def others(self, now: float) -> dict[str, float]:
        """Every other rank's compile seconds up to `now` (a compile in progress counted to now)."""
        out = {}
        for path in self.folder.glob("rank-*"):
            if path == self.mine or path.suffix:
                continue
            try:
                total, began = path.read_text().split(" ")
                out[path.name] = float(total) + (max(0.0, now - float(began)) if began else 0.0)
            except (OSError, ValueError):  # a rank that has not written yet, or is gone
                continue
        return out

    def _write(self) -> None:
        part = self.mine.with_suffix(".part")
        part.write_text(f"{self.total!r} {'' if self.began is None else repr(self.began)}")
        os.replace(part, self.mine)
