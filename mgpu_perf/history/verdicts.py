"""What a history's change points add up to: the exit code of `mgpu history` and its summary line.

    0  no slowdown: no change point, only faster ones, or every slower one the gate did not confirm
    1  a slowdown confirmed by the A/B gate (--confirm): a change point `slower`, or `creep`
    2  bad input (one line): a storage with no run, no git repository, a bad option
    4  a suspected slowdown: a slower change point no gate has confirmed or cleared (no --confirm,
       or its time budget ran out before reaching it)
"""

from __future__ import annotations

from mgpu.errors import EXIT_FAILED, EXIT_USAGE

__all__ = ["EXIT_NONE", "EXIT_CONFIRMED", "EXIT_USAGE", "EXIT_SUSPECTED", "CONFIRMED_SLOW", "exit_code", "summary"]

EXIT_NONE = 0
EXIT_CONFIRMED = EXIT_FAILED
EXIT_SUSPECTED = 4  # not 3: mgpu's 3 is check's NOT VERIFIED
CONFIRMED_SLOW = ("slower", "creep")


def _suspected_slower(points) -> list:
    return [p for p in points if p.verdict == "suspected" and p.ratio > 1]


def exit_code(points) -> int:
    """The rule in the module's docstring, from the change points' verdicts."""
    if any(p.verdict in CONFIRMED_SLOW for p in points):
        return EXIT_CONFIRMED
    return EXIT_SUSPECTED if _suspected_slower(points) else EXIT_NONE


def summary(points) -> str:
    """One line: what was found and what the exit code means."""
    confirmed = [p for p in points if p.verdict in CONFIRMED_SLOW]
    suspected = _suspected_slower(points)
    faster = [p for p in points if p.ratio < 1 and p.verdict in ("suspected", "faster")]
    cleared = [p for p in points if p.verdict == "unconfirmed"]
    parts = [f"{len(confirmed)} slowdown(s) confirmed"] if confirmed else []
    parts.append(f"{len(suspected)} suspected slowdown(s)")
    parts.append(f"{len(faster)} faster")
    if cleared:
        parts.append(f"{len(cleared)} not confirmed by the gate")
    code = exit_code(points)
    tail = {EXIT_CONFIRMED: "a slowdown is confirmed", EXIT_SUSPECTED: "a slowdown is suspected; --confirm has the "
            "A/B gate confirm it", EXIT_NONE: "no slowdown"}[code]
    return f"{', '.join(parts)}: exit {code} ({tail})"
