"""The suite's own tests run many times under load, counting hangs and reds (`make stress`).

    python -m correctness.stress --runs 10 -- -m reliability correctness/test_reliability_bad_input.py \
        correctness/test_reliability_ranks.py
    python -m correctness.stress --runs 3 --no-burn -- correctness      # the whole folder, no CPU burner

Each run is one `pytest` process over the chosen tests, in the suite's order, started as a
script's background job starts it (SIGINT ignored) while the machine is loaded as a shared CI
runner is: a burner process spinning on every usable core (`--burn`, niced like nothing: it takes
its full share) and a disk writer that writes, fsyncs and deletes files as a `pip install` does
(`--disk`). Nothing is timed against a fixed figure; a run counts as:

* green: pytest exited 0;
* red: pytest exited non-zero and no failure reads as a hang;
* hang: a failure says so (the suite's multi-process tests fail with "a hang" when a run outlives
  its deadline), or the run outlived `--run-timeout` and was killed (its whole process group).

Writes stress.json (per run: exit code, seconds, counts, the failing tests' names, the last
lines of a red run's output) into --out and prints a summary; exits 1 when any run was not green.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"=+ (.*\d+ (?:passed|failed|error).*) in ([\d.]+)s")
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)
HANG_WORDS = ("a hang", "Timeout >", "did not end within", "still going after")


@dataclass
class RunResult:
    run: int
    code: int | None
    seconds: float
    verdict: str                 # green | red | hang
    summary: str = ""            # pytest's last line
    failed: list = field(default_factory=list)
    tail: str = ""               # a red or hung run's last lines


def _burn(stop_at: float) -> None:
    while time.time() < stop_at:
        for _ in range(100_000):
            pass


def _write_disk(folder: str, stop_at: float) -> None:
    """Files written, fsynced and removed in a loop: a pip install's I/O, give or take."""
    block = os.urandom(1 << 20)
    i = 0
    while time.time() < stop_at:
        path = Path(folder) / f"f{i % 8}"
        with open(path, "wb") as f:
            for _ in range(16):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        path.unlink()
        i += 1


class Load:
    """Burner processes (one per usable core) and a disk writer, started and stopped together."""

    def __init__(self, burn: bool, disk: bool, hours: float = 6.0):
        self.procs: list[multiprocessing.Process] = []
        self.folder = tempfile.mkdtemp(prefix="mgpu-stress-disk-")
        stop_at = time.time() + 3600 * hours  # a safety net: the load never outlives a forgotten run
        if burn:
            for _ in os.sched_getaffinity(0):
                self.procs.append(multiprocessing.Process(target=_burn, args=(stop_at,), daemon=True))
        if disk:
            self.procs.append(multiprocessing.Process(target=_write_disk, args=(self.folder, stop_at), daemon=True))
        for p in self.procs:
            p.start()

    def describe(self) -> str:
        return f"{len(self.procs)} load process(es)"

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.join(5)
        subprocess.run(["rm", "-rf", self.folder], check=False)


def _as_background_job() -> None:
    """Runs in the child before exec: SIGINT ignored, as a script's `cmd &` starts it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.setsid()


def one_run(i: int, pytest_args: list[str], timeout_s: float, sigint_ignored: bool) -> RunResult:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_as_background_job if sigint_ignored else os.setsid)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        killed = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        killed = True
    except BaseException:  # stopped itself: the run goes too
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    seconds = time.monotonic() - started
    found = SUMMARY.findall(out)
    failed = FAILED.findall(out)
    hang = killed or any(word in out for word in HANG_WORDS) and proc.returncode != 0
    verdict = "hang" if hang else "green" if proc.returncode == 0 else "red"
    tail = "" if verdict == "green" else "\n".join(out.splitlines()[-60:])
    return RunResult(i, None if killed else proc.returncode, round(seconds, 1), verdict,
                     found[-1][0] if found else "", failed, tail)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m correctness.stress", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--burn", action=argparse.BooleanOptionalAction, default=True,
                        help="a CPU burner on every usable core (default on)")
    parser.add_argument("--disk", action=argparse.BooleanOptionalAction, default=True,
                        help="a disk writer beside (default on)")
    parser.add_argument("--sigint-ignored", action=argparse.BooleanOptionalAction, default=True,
                        help="start pytest with SIGINT ignored, as a background job (default on)")
    parser.add_argument("--run-timeout", type=float, default=900.0,
                        help="seconds after which a run is killed and counted a hang (default 900)")
    parser.add_argument("--out", default="perf-results/stress")
    args = parser.parse_args(own)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    if not pytest_args:
        parser.error("give the tests after --, as pytest takes them (e.g. -- -m reliability correctness)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the load and the run in hand stop with it (finally)
    load = Load(args.burn, args.disk)
    print(f"stress: {args.runs} run(s) of pytest {' '.join(pytest_args)}; {load.describe()} "
          f"(burn {args.burn}, disk {args.disk}), SIGINT ignored: {args.sigint_ignored}", flush=True)
    results: list[RunResult] = []
    try:
        for i in range(1, args.runs + 1):
            r = one_run(i, pytest_args, args.run_timeout, args.sigint_ignored)
            results.append(r)
            print(f"  run {i:>2}: {r.verdict:<5} exit {r.code}, {r.seconds:.0f} s  {r.summary}"
                  + (f"  failed: {', '.join(r.failed)}" if r.failed else ""), flush=True)
            (out / "stress.json").write_text(json.dumps(
                {"pytest_args": pytest_args, "burn": args.burn, "disk": args.disk, "sigint_ignored": args.sigint_ignored,
                 "load_cpus": os.cpu_count(), "runs": [asdict(x) for x in results]}, indent=1) + "\n")
    finally:
        load.stop()
    counts = {v: sum(r.verdict == v for r in results) for v in ("green", "red", "hang")}
    times = [r.seconds for r in results]
    print(f"stress: {counts['green']} green, {counts['red']} red, {counts['hang']} hang(s) of {len(results)}; "
          f"{min(times):.0f}-{max(times):.0f} s a run; {out / 'stress.json'}")
    for r in results:
        if r.verdict != "green":
            print(f"--- run {r.run} ({r.verdict}), last lines:\n{r.tail}")
    return 0 if counts["green"] == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
