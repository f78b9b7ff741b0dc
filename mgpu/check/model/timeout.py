"""A step's time limit in `mgpu check` (--step-timeout): a model that hangs in forward or backward
ends the check with CheckTimeout naming the run and the step, instead of hanging it.

    with step_timeout(60.0, "ddp on 2 ranks (rank 0): step 1"):
        ...  # one step: CheckTimeout after 60 s, torch.compile's compiling not counted
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

from mgpu.errors import CheckTimeout

__all__ = ["step_timeout"]


@contextlib.contextmanager
def step_timeout(seconds: float | None, what: str):
    """CheckTimeout naming `what` if the block runs longer than `seconds`, not counting the time
    torch.compile spends compiling in it (SIGALRM: main thread only; elsewhere, and with None, no
    limit). A --compile run's first step compiles: with a cold compiler cache (a new machine, a CI
    runner) and other work beside it that takes longer than a step may, and it is not a hang."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise CheckTimeout(f"{what} did not finish within {seconds:g} s: the model hangs in forward or backward "
                           "(or is too slow for --step-timeout; torch.compile's compiling is not counted)")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        with _timer_paused_while_compiling():
            yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def _timer_paused_while_compiling():
    """Stop the step's timer (ITIMER_REAL) when torch compiles and start it again with the time it
    had left when the compile ends: torch._dynamo's compile callbacks, which run around each
    compilation (a frame traced and compiled, a backward compiled lazily at its first use).
    Without torch._dynamo imported nothing in the block can compile (a compiled model imports it)."""
    callback = sys.modules.get("torch._dynamo.callback")
    if callback is None:
        yield
        return
    handler = callback.callback_handler
    left: list[float] = []

    def paused(args) -> None:
        left.append(signal.setitimer(signal.ITIMER_REAL, 0)[0])

    def resumed(args) -> None:
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
