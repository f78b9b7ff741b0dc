"""What a history's change points add up to: the exit code of `mgpu history` and its summary line.

    0  no slowdown: no change point, only faster ones, or every slower one the gate did not confirm
    1  a slowdown confirmed by the A/B gate (--confirm): a change point `slower`, or `creep`
    2  bad input (one line): a storage with no run, no git repository, a bad option
    4  a suspected slowdown: a slower change point no gate has confirmed or cleared (no --confirm,
       or its time budget ran out before a gate could time it: `unchecked`, whatever its verdict says)

With --since REF only the steps after REF count: the earlier ones are `earlier` (history/since.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mgpu.errors import EXIT_FAILED, EXIT_OK, EXIT_SUSPECTED, EXIT_USAGE

__all__ = ["EXIT_NONE", "EXIT_CONFIRMED", "EXIT_USAGE", "EXIT_SUSPECTED", "CONFIRMED_SLOW", "Findings", "exit_code",
           "summary"]

EXIT_NONE = EXIT_OK
EXIT_CONFIRMED = EXIT_FAILED
CONFIRMED_SLOW = ("slower", "creep")


def _suspected_slower(points, unchecked=()) -> list:
    return [p for p in points if p.ratio > 1 and (p.verdict == "suspected" or p in unchecked)]


def exit_code(points, unchecked=()) -> int:
    """The rule in the module's docstring, from the change points' verdicts; `unchecked`: the points
    --confirm had no gate time (its budget spent), suspicions still."""
    if any(p.verdict in CONFIRMED_SLOW for p in points):
        return EXIT_CONFIRMED
    return EXIT_SUSPECTED if _suspected_slower(points, unchecked) else EXIT_NONE


def summary(points, unchecked=()) -> str:
    """One line: what was found and what the exit code means."""
    confirmed = [p for p in points if p.verdict in CONFIRMED_SLOW]
    suspected = _suspected_slower(points, unchecked)
    faster = [p for p in points if p.ratio < 1 and p.verdict in ("suspected", "faster")]  # not `earlier`
    cleared = [p for p in points if p.verdict == "unconfirmed" and p not in unchecked]
    earlier = [p for p in points if p.verdict == "earlier"]
    parts = [f"{len(confirmed)} slowdown(s) confirmed"] if confirmed else []
    parts.append(f"{len(suspected)} suspected slowdown(s)")
    parts.append(f"{len(faster)} faster")
    if cleared:
        parts.append(f"{len(cleared)} not confirmed by the gate")
    if earlier:
        parts.append(f"{len(earlier)} earlier than --since, not judged")
    code = exit_code(points, unchecked)
    tail = {EXIT_CONFIRMED: "a slowdown is confirmed", EXIT_SUSPECTED: "a slowdown is suspected and no gate "
            "has timed it: --confirm, with the budget to reach it", EXIT_NONE: "no slowdown"}[code]
    return f"{', '.join(parts)}: exit {code} ({tail})"


@dataclass(frozen=True)
class Findings:
    """What a run of `mgpu history` found: the change points (after --confirm, with their verdicts),
    what confirming said (a line each), and the points it had no gate time for."""
    points: tuple
    notes: tuple = ()
    unchecked: tuple = ()

    def found_by_gate(self, machine: str, benchmark: str) -> list:
        """The changes --confirm found within a change point's range after the commit it named (no
        detector's point of their own), for one machine's benchmark."""
        return [p for p in self.points if p.found_by == "gate"
                and (p.machine, p.benchmark) == (machine, benchmark)]

    @property
    def exit_code(self) -> int:
        return exit_code(self.points, self.unchecked)

    @property
    def summary(self) -> str:
        return summary(self.points, self.unchecked)
