"""Round health: what an `unchanged` verdict must also show before it stands. Numbers only, like
gate/stats.py; gate/compare.py applies it where a benchmark's interval says `unchanged`.

A round's log ratio cancels what the machine did only when both arms' samples met the same machine:
taken one after the other (interleaved, not overlapping, not far apart), spent in the step (the
sample's wall window filled by its timed operations), with neither worker busy while the other was
timed, and, where the step runs in the worker's own process on the host clock, given the same share
of a CPU. A loaded machine breaks that: its scheduler may favour the worker that slept while the
other one ran, so that one arm's samples run at a larger CPU share than the other's, round after
round; the wall-time ratio then measures the scheduler, and a 15 % slowdown can read as 1.01 with a
tight interval. `slower` is safe from this (a slowdown shown is tested at the Holm level as ever);
`unchanged` is the verdict that needs positive evidence, so it stands only when (rule):

1. at most MAX_FAULTY of the rounds are faulty (round_faults: not interleaved, timed little, a
   worker busy between its samples where the host clock decides: a round timed by CUDA events on
   the GPU is not lengthened by the other worker's CPU, and on a GPU every worker spends some,
   spinning in its event waits and in CUDA's own threads: docs/notes/gpu-runs.md, 2026-11-28);
2. the healthy rounds alone give an interval inside (1/(1 + T), 1 + T) at the verdict's level;
3. every part of the rounds says so by its own estimate: the rounds each arm ran first, and the
   first and second half (the ratio must not hang on the order or drift within the benchmark);
4. where the CPU time each sample took is known for a step in the worker's process on the host
   clock that is CPU work (cpu_work: not a step that sleeps or waits), the same rounds timed by
   CPU seconds (an operation's wall time times its sample's share of a CPU) have their ratio inside
   the band, and their interval does not show `slower` (above
   1 + T/2): the wall-time ratio must not be the scheduler's doing;
5. for such a step, where each sample has a yardstick beside it (gate/worker.py `yardstick`: the
   same fixed work in both arms' workers, timed right after the sample), the workers' yardsticks
   are within half the threshold of each other, or else the step's ratio in units of it (each
   sample's time over its yardstick's) lies inside the band (the yardstick alone varies by 5-10 %
   with what ran before it, so it does not decide where the workers ran alike): two workers that
   run at different speeds for a whole benchmark (on vCPUs the host shares unequally, one round
   after another) bias every round alike, which no pairing cancels and which a tight interval
   hides (docs/notes/gate-validation.md, 2026-11-26: identical trees read 0.73 under load).

Otherwise the benchmark is `undecidable`, with the reason. The per-round facts come from the
worker's answer to a sample (gate/worker.py: `window`, `cpu_s`, `cpu_between_s`, `yardstick_s`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mgpu_perf.gate import stats as abstats

__all__ = ["MAX_FAULTY", "TIMED_SHARE", "BETWEEN_SHARE", "CPU_WORK", "SampleFacts", "RoundFacts", "sample_facts",
           "round_faults", "cpu_work", "RoundHealth", "check_rounds"]

MAX_FAULTY = 0.2    # the share of faulty rounds an `unchanged` may have: the trimmed mean cuts a fifth at each end
TIMED_SHARE = 0.8   # a sample's timed operations fill at least this share of its wall window
BETWEEN_SHARE = 0.1  # a worker's CPU while the other arm was timed, as a share of that arm's sample: at most this
GAP_S = 1.0         # two samples of a round more than this (and twice the longer sample) apart: not interleaved
CPU_WORK = 0.25     # rules 4 and 5 need a step that is CPU work: some sample of each arm this busy on a CPU


@dataclass(frozen=True)
class SampleFacts:
    """One arm's sample of a round, as its worker reported it (None: not reported, by an older worker)."""
    busy_s: float                      # the operations' timed seconds, summed
    window: tuple | None = None        # (began, ended) on the machine's monotonic clock
    cpu_s: float | None = None         # the worker's CPU seconds during the sample
    cpu_between_s: float | None = None  # its CPU seconds since its previous sample ended
    yardstick_s: float | None = None   # a fixed piece of work beside the sample (worker.yardstick), seconds

    @property
    def wall_s(self) -> float | None:
        return self.window[1] - self.window[0] if self.window else None

    def to_dict(self) -> dict:
        return {"busy_s": self.busy_s, "window": list(self.window) if self.window else None, "cpu_s": self.cpu_s,
                "cpu_between_s": self.cpu_between_s, "yardstick_s": self.yardstick_s}


def sample_facts(answer: dict) -> SampleFacts:
    """The facts of one worker's answer to a sample."""
    window = answer.get("window")
    return SampleFacts(busy_s=float(sum(answer["times"])), window=tuple(window) if window else None,
                       cpu_s=answer.get("cpu_s"), cpu_between_s=answer.get("cpu_between_s"),
                       yardstick_s=answer.get("yardstick_s"))


@dataclass(frozen=True)
class RoundFacts:
    first: str            # the arm timed first in the round: "baseline" or "candidate"
    baseline: SampleFacts
    candidate: SampleFacts

    def to_dict(self) -> dict:
        return {"first": self.first, "baseline": self.baseline.to_dict(), "candidate": self.candidate.to_dict()}

    @staticmethod
    def from_dict(d: dict) -> "RoundFacts":
        def arm(a):
            return SampleFacts(a["busy_s"], tuple(a["window"]) if a.get("window") else None, a.get("cpu_s"),
                               a.get("cpu_between_s"), a.get("yardstick_s"))
        return RoundFacts(d["first"], arm(d["baseline"]), arm(d["candidate"]))


def round_faults(r: RoundFacts, host_clock: bool = True) -> tuple[str, ...]:
    """Why one round cannot be trusted to cancel the machine (empty: it can). Each fault is a name:
    `not interleaved` (the two samples' windows overlap, or lie more than GAP_S and more than twice
    the longer sample apart: between them only the workers' yardsticks and the exchange of answers
    run, which a loaded machine may stretch to a few tenths of a second), `timed little` (an arm's
    operations filled less than TIMED_SHARE of its window), `busy between` (the worker timed second
    spent more than BETWEEN_SHARE of the first arm's sample on the CPU while that arm was timed: it
    competed with it; only with `host_clock`: times from CUDA events are the GPU's)."""
    faults = []
    a, b = (r.baseline, r.candidate) if r.first == "baseline" else (r.candidate, r.baseline)
    if a.window and b.window:
        gap = b.window[0] - a.window[1]
        if gap < -1e-3 or gap > max(GAP_S, 2 * a.wall_s, 2 * b.wall_s):
            faults.append("not interleaved")
    if any(s.wall_s and s.busy_s < TIMED_SHARE * s.wall_s for s in (a, b)):
        faults.append("timed little")
    if host_clock and b.cpu_between_s is not None and b.cpu_between_s > BETWEEN_SHARE * a.busy_s:
        faults.append("busy between")
    return tuple(faults)


@dataclass(frozen=True)
class RoundHealth:
    """What the rounds of one benchmark show beside their ratio (check_rounds); `doubt` is why an
    `unchanged` cannot stand ("" when it can)."""
    rounds: int
    faulty: int
    faults: tuple = ()     # ((fault, rounds), ...)
    parts: tuple = ()      # ((part, its rounds' ratio), ...): each order, each half
    cpu_ratio: float | None = None          # the rounds' CPU-time ratio (rule 4), where it applies
    yardstick_ratio: float | None = None    # the same fixed work, candidate's worker over baseline's (rule 5)
    measured_ratio: float | None = None     # the step's ratio in units of that work (rule 5)
    cpu_interval: tuple | None = None
    healthy_interval: tuple | None = None   # the healthy rounds' interval (rule 2)
    doubt: str = ""

    def to_dict(self) -> dict:
        finite = (lambda t: [v if math.isfinite(v) else None for v in t] if t else None)
        return {"rounds": self.rounds, "faulty": self.faulty, "faults": dict(self.faults),
                "parts": dict(self.parts), "cpu_ratio": self.cpu_ratio, "cpu_interval": finite(self.cpu_interval),
                "yardstick_ratio": self.yardstick_ratio, "measured_ratio": self.measured_ratio,
                "healthy_interval": finite(self.healthy_interval), "doubt": self.doubt}


def _inside(interval: tuple, threshold: float) -> bool:
    return interval[0] > 1 / (1 + threshold) and interval[1] < 1 + threshold


def _ratio(pairs: list[tuple[float, float]], threshold: float) -> abstats.Estimate | None:
    return abstats.estimate([b for b, _ in pairs], [c for _, c in pairs], threshold) if len(pairs) >= 2 else None


def cpu_work(facts: list[RoundFacts]) -> bool:
    """Whether the step is CPU work in the worker (rules 4 and 5 assume it): in each arm, some
    sample spent at least CPU_WORK of its timed seconds on a CPU. A step that sleeps or waits (on a
    GPU, on another process) spends almost none, even on an idle machine; a CPU step's busiest sample
    keeps a third of a CPU at a load of 20 on 2 cores (2026-11-26)."""
    return all(max((s.cpu_s or 0.0) / s.busy_s for s in arm) >= CPU_WORK
               for arm in ([f.baseline for f in facts], [f.candidate for f in facts]))


def check_rounds(samples: dict, facts: list[RoundFacts], threshold: float, level: float,
                 cpu_applies: bool = False, clock: str = "host") -> RoundHealth:
    """The rounds' health (the module's rule) for an `unchanged` at `level`: `samples` the deciding
    times {arm: [one a round]}, `facts` each round's (as many, in order; rounds without facts are
    judged by rules 2-3 only). `cpu_applies`: the step runs in the worker's process on the host clock;
    `clock`: the deciding clock (rounds.choose_clock: "host" or "cuda-events")."""
    pairs = list(zip(samples["baseline"], samples["candidate"]))
    n = len(pairs)
    faults = [round_faults(f, clock == "host") for f in facts] if len(facts) == n else [()] * n
    named = sorted({x for fs in faults for x in fs})
    counted = tuple((x, sum(x in fs for fs in faults)) for x in named)
    faulty = sum(bool(fs) for fs in faults)
    doubts = []
    if faulty > MAX_FAULTY * n:
        doubts.append(f"{faulty} of {n} rounds faulty (" + ", ".join(f"{x}: {k}" for x, k in counted) + ")")
    healthy = _ratio([p for p, fs in zip(pairs, faults) if not fs], threshold)
    healthy_interval = healthy.interval(level) if healthy else (0.0, math.inf)
    if faulty and not _inside(healthy_interval, threshold):
        doubts.append(f"the {n - faulty} healthy rounds' interval {healthy_interval[0]:.3f}-{healthy_interval[1]:.3f}"
                      f" is not inside {1 / (1 + threshold):.3f}-{1 + threshold:.3f}")
    parts = []
    if len(facts) == n and n >= 4:
        for arm in ("baseline", "candidate"):
            est = _ratio([p for p, f in zip(pairs, facts) if f.first == arm], threshold)
            if est:
                parts.append((f"{arm} first", est.ratio))
    if n >= 4:
        parts += [("first half", _ratio(pairs[:n // 2], threshold).ratio),
                  ("second half", _ratio(pairs[n // 2:], threshold).ratio)]
    off = [(name, r) for name, r in parts if not 1 / (1 + threshold) < r < 1 + threshold]
    if off:
        doubts.append("the ratio hangs on " + ", ".join(f"{name} {r:.3f}" for name, r in off))
    cpu_ratio = cpu_interval = None
    cpu = [(f.baseline.cpu_s, f.candidate.cpu_s, f.baseline.busy_s, f.candidate.busy_s) for f in facts]
    cpu_applies = cpu_applies and len(facts) == n and n >= 2 and all(b and c for b, c, _, _ in cpu) and \
        cpu_work(facts)
    if cpu_applies:
        # CPU seconds an operation's worth of wall time (a sample's CPU over its timed share)
        est = abstats.estimate([b / wb * t for (b, _, wb, _), (t, _) in zip(cpu, pairs)],
                               [c / wc * t for (_, c, _, wc), (_, t) in zip(cpu, pairs)], threshold)
        cpu_ratio, cpu_interval = est.ratio, est.interval(level)
        if not 1 / (1 + threshold) < cpu_ratio < 1 + threshold or cpu_interval[0] > 1 + threshold / 2:
            doubts.append(f"the same rounds timed by CPU seconds say {cpu_ratio:.3f} "
                          f"({cpu_interval[0]:.3f}-{cpu_interval[1]:.3f}): the machine did not give both arms "
                          "the same share of a CPU")
    yard = [(f.baseline.yardstick_s, f.candidate.yardstick_s) for f in facts]
    yard_ratio = measured = None
    if cpu_applies and all(b and c for b, c in yard):
        yard_ratio = abstats.estimate([b for b, _ in yard], [c for _, c in yard], threshold).ratio
        measured = abstats.estimate([t / y for (t, _), (y, _) in zip(pairs, yard)],
                                    [t / y for (_, t), (_, y) in zip(pairs, yard)], threshold).ratio
        apart = not 1 / (1 + threshold / 2) < yard_ratio < 1 + threshold / 2
        if apart and not 1 / (1 + threshold) < measured < 1 + threshold:
            doubts.append(f"the workers ran at different speeds: the same fixed work took {yard_ratio:.3f} times as "
                          f"long in the candidate's worker, and the step measured in it is {measured:.3f}")
    return RoundHealth(n, faulty, counted, tuple(parts), cpu_ratio=cpu_ratio, cpu_interval=cpu_interval,
                       yardstick_ratio=yard_ratio, measured_ratio=measured,
                       healthy_interval=healthy_interval if faulty else None, doubt="; ".join(doubts))
