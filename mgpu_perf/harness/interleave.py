"""Interleaving and speed-ups: several things timed in turn, round by round, so that a machine
whose speed drifts (a shared VM) slows them alike; and the one speed-up formula of the harness."""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

__all__ = ["interleaved_ratios", "interleaved_ratio", "interleaved_step_times", "speedups", "scaling_rows"]


def interleaved_ratios(fns: dict[str, Callable[[], float]], reference: str, rounds: int, warmup: int = 2) -> dict:
    """Time every fn in turn each round (the order reversed every other round: a b c, c b a, ...)
    for `rounds` rounds after warm-up; for each fn but `reference`, its throughput relative to the
    reference's per round (time_reference / time_fn), the median and spread, and both median times."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in (names if i % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            loss = fns[name]()
            times[name].append(time.perf_counter() - start)
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss {loss} of {name} in round {i}")
    out = {}
    for name in names:
        if name == reference:
            continue
        ratios = [tr / ta for ta, tr in zip(times[name], times[reference])]
        out[name] = {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "a_median_s": statistics.median(times[name]), "b_median_s": statistics.median(times[reference]),
                     "rounds": rounds,
                     "ratio_of_medians": statistics.median(times[reference]) / statistics.median(times[name])}
    return out


def interleaved_ratio(a: Callable[[], float], b: Callable[[], float], rounds: int, warmup: int = 2) -> dict:
    """Time a() and b() in turn (a b, b a, ...) for `rounds` rounds after warm-up; the throughput of
    a relative to b per round (time_b / time_a), its median and spread, and each side's median time."""
    return interleaved_ratios({"a": a, "b": b}, "b", rounds, warmup)["a"]


# -- scaling -----------------------------------------------------------------------------------

def interleaved_step_times(pools: dict, rounds: int, warmup: int = 0, alternate: bool = False) -> dict:
    """Step times of each pool (keyed by rank count, or by a label), taken in turn: one step at
    every count, then the next round (`alternate`: the order reversed every other round). A machine
    whose speed drifts (a VM whose host is busy for a minute) then slows every count alike, rather
    than whichever count happened to run during the slow minute, so the ratios between counts hold
    even when the absolute times move. Raises on a non-finite loss or a pool whose weights did not move."""
    if not isinstance(rounds, int) or rounds < 1 or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"rounds must be an integer >= 1 and warmup >= 0, got rounds={rounds!r}, warmup={warmup!r}")
    for pool in pools.values():
        for _ in range(warmup):
            pool.step()
    def where(key) -> str:
        return f"{key} ranks" if isinstance(key, int) else str(key)

    times: dict = {n: [] for n in pools}
    order = list(pools)
    for i in range(rounds):
        for n in (order[::-1] if alternate and i % 2 else order):
            start = time.perf_counter()
            loss = pools[n].step()
            times[n].append(time.perf_counter() - start)
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss {loss} at {where(n)} in round {i}")
    for n, pool in pools.items():
        if pool.weights_moved() <= 0:
            raise AssertionError(f"weights did not change at {where(n)}")
    return times


def speedups(rate: float, base_rate: float, devices: int, base_devices: int = 1) -> tuple[float, float]:
    """(speedup, efficiency) of a throughput against a base throughput: the one formula of the suite."""
    speedup = rate / base_rate
    return speedup, speedup * base_devices / devices


def scaling_rows(times: dict[int, list[float]], per_rank_batch: int) -> list[dict]:
    """One row per rank count from its step times: median and fastest step, images/s, and speedup
    and efficiency against the smallest count (normally 1 rank)."""
    rows = []
    for n in sorted(times):
        median = statistics.median(times[n])
        rows.append({"ranks": n, "per_rank_batch": per_rank_batch, "global_batch": per_rank_batch * n,
                     "rounds": len(times[n]), "step_s_median": median, "step_s_min": min(times[n]),
                     "images_per_s": per_rank_batch * n / median})
    base = rows[0]
    for row in rows:
        row["speedup"], row["efficiency"] = speedups(row["images_per_s"], base["images_per_s"], row["ranks"],
                                                     base["ranks"])
        row["speedup (fastest steps)"], _ = speedups(per_rank_batch * row["ranks"] / row["step_s_min"],
                                                     per_rank_batch * base["ranks"] / base["step_s_min"],
                                                     row["ranks"], base["ranks"])
    return rows


