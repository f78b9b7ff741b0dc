"""The A/B regression gate: gated benchmarks timed in a baseline and a candidate arm, interleaved
round by round in one job, judged by a paired statistical test (perf/abstats.py).

    pytest perf --ab-baseline origin/main            # a git revision (a temporary worktree)
    pytest perf --ab-baseline ../mgpu-main            # or another checkout of this project
    pytest perf --ab-baseline-python ~/venv-old/bin/python   # same tree, another torch/CUDA/NCCL
    pytest perf --ab-baseline HEAD --ab-threshold 5 --ab-max-rounds 60 --ab-strict

Only benchmarks marked `gate` run; each marker carries a workload spec (perf/workloads.py,
`make_gated`). Each arm is one long-lived worker process (perf/ab_worker.py) importing `mgpu`
from its own tree and the candidate's workloads, so the same benchmark code times both trees.
One arm works at a time. Per benchmark: both arms set up and warm up (untimed), then rounds
alternate the order (A B, B A, A B, ...), each round one sample per arm (the median of a few
operations, about `sample_s` seconds). From `min_rounds` on, every `look_every` rounds the
interval is checked at the strictest Holm level, and the benchmark stops early only when it is
`unchanged` or `faster`; otherwise it runs to `max_rounds`, where `slower` is tested once.

Outcome: the pytest run exits 1 if any gated benchmark is `slower` (`inconclusive` too with
--ab-strict); a worker that crashes, a workload that fails or computes a wrong result in either
arm fails that test: never "unchanged". A workload the baseline cannot even set up (an API the
change added) is skipped as `not comparable` and listed. Reports: a table in the terminal
summary, ab.json in the perf output folder, and each arm's samples in pytest-benchmark's JSON
format (ab-baseline.json, ab-candidate.json: `pytest-benchmark compare` shows them).
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from perf import abstats

__all__ = ["Settings", "Arm", "ArmError", "round_order", "compare", "Comparison", "ABGate", "resolve_baseline"]

PERF_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = PERF_DIR.parent


class ArmError(RuntimeError):
    """A worker could not start, crashed, hung, or a workload failed in it (the message says which)."""


@dataclass(frozen=True)
class Settings:
    threshold: float = 0.10   # the slowdown the gate exists to catch (fraction)
    alpha: float = 0.05       # chance of any false `slower` in a whole run (Holm across benchmarks)
    min_rounds: int = 10
    max_rounds: int = 40
    look_every: int = 5       # rounds between looks at the interval, once min_rounds are in
    warmup: int = 2           # untimed samples per arm before the rounds
    sample_s: float = 0.25    # target duration of one sample (a whole number of operations)
    strict: bool = False      # `inconclusive` fails the run too
    smoke: bool = False       # --benchmark-disable: exercise the machinery, judge nothing


def round_order(i: int) -> tuple[str, str]:
    """Arms of round i (from 0): A B, B A, A B, ... so neither arm always runs first."""
    return ("baseline", "candidate") if i % 2 == 0 else ("candidate", "baseline")


# -- arms ----------------------------------------------------------------------------------------

class Arm:
    """A worker process: `python perf/ab_worker.py TREE`, with the candidate's workloads beside it."""

    def __init__(self, label: str, tree: Path, python: str, workdir: Path, timeout_s: float = 600.0):
        self.label, self.tree, self.python, self.timeout_s = label, Path(tree).resolve(), python, timeout_s
        self.dir = workdir / label
        self.dir.mkdir(parents=True)
        shutil.copy(PERF_DIR / "ab_worker.py", self.dir / "mgpu_ab_worker.py")
        shutil.copy(PERF_DIR / "workloads.py", self.dir / "mgpu_ab_workloads.py")
        self.stderr_path = self.dir / "stderr.log"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        with open(self.stderr_path, "w") as err:
            try:
                # Its own session: killing the worker's group also ends the DDP ranks it started.
                self.proc = subprocess.Popen([python, str(self.dir / "mgpu_ab_worker.py"), str(self.tree)],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                             cwd=self.tree, env=env, bufsize=1, start_new_session=True)
            except OSError as e:
                raise ArmError(f"{label}: cannot start {python}: {e.strerror or e}") from None
        try:
            hello = self._read()
            if "error" in hello:
                raise ArmError(f"{label}: {hello['error']}")
            self.versions = hello["versions"]
        except BaseException:
            self.kill()
            raise

    def _tail(self) -> str:
        try:
            lines = [ln for ln in self.stderr_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-3:])

    def _read(self) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            if not ready:
                raise self._broken(f"worker did not answer within {self.timeout_s:g} s")
            code = self.proc.wait(timeout=10)
            raise ArmError(f"{self.label} worker exited with code {code}: {self._tail() or 'no output'}")
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise self._broken(f"worker answered something that is not a JSON object: {line[:200]!r}")
        return answer

    def _broken(self, what: str) -> ArmError:
        """The exchange with this worker cannot be trusted any more: kill it, return the error to raise."""
        self.kill()
        return ArmError(f"{self.label} {what}")

    def kill(self) -> None:
        """The worker and everything it started (DDP ranks), at once."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        self.proc.wait()

    def request(self, command: str, **fields) -> dict:
        try:
            self.proc.stdin.write(json.dumps({"command": command, **fields}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            code = self.proc.wait(timeout=10)
            raise ArmError(f"{self.label} worker exited with code {code}: {self._tail() or 'no output'}") from None
        answer = self._read()
        if "error" in answer:
            raise ArmError(f"{self.label}: {command} failed: {answer['error']}")
        if command == "sample" and not isinstance(answer.get("times"), list):
            raise self._broken(f"answered {answer!r} to a sample")
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.request("quit")
                self.proc.wait(timeout=30)
            except (ArmError, subprocess.TimeoutExpired, ValueError):
                pass
        self.kill()


# -- one benchmark, both arms ----------------------------------------------------------------------

@dataclass
class Comparison:
    name: str
    spec: dict
    status: str = "compared"            # compared | not comparable
    reason: str = ""
    ops_per_sample: int = 0
    samples: dict = field(default_factory=lambda: {"baseline": [], "candidate": []})  # one per round
    seconds: float = 0.0
    estimate: abstats.Estimate | None = None
    verdict: str = ""
    level: float = 0.0

    def median(self, arm: str) -> float:
        return statistics.median(self.samples[arm]) if self.samples[arm] else math.nan

    def interval(self) -> tuple[float, float]:
        return self.estimate.interval(self.level) if self.estimate else (math.nan, math.nan)

    def to_dict(self) -> dict:
        """For ab.json: strict JSON (no NaN or Infinity: None where a figure does not exist)."""
        def finite(x):
            return x if isinstance(x, (int, float)) and math.isfinite(x) else None

        low, high = (finite(v) for v in self.interval())
        return {"name": self.name, "spec": self.spec, "status": self.status, "reason": self.reason,
                "verdict": self.verdict, "rounds": len(self.samples["baseline"]), "ops_per_sample": self.ops_per_sample,
                "baseline_median_s": finite(self.median("baseline")),
                "candidate_median_s": finite(self.median("candidate")),
                "ratio": finite(self.estimate.ratio) if self.estimate else None, "interval": [low, high],
                "level": self.level, "p_slower": self.estimate.p_slower if self.estimate else None,
                "seconds": self.seconds,
                "samples": self.samples}


def _sample(arm: Arm, ops: int) -> float:
    return statistics.median(arm.request("sample", ops=ops)["times"])


def compare(name: str, spec: dict, arms: dict[str, Arm], settings: Settings, family_size: int = 1,
            log=lambda _: None) -> Comparison:
    """Time one gated workload in both arms, interleaved, until decided or max_rounds."""
    result = Comparison(name, spec)
    start = time.perf_counter()
    answer = arms["baseline"].request("setup", spec=spec)
    if "not_comparable" in answer:
        result.status, result.reason = "not comparable", f"the baseline cannot run it: {answer['not_comparable']}"
        arms["baseline"].request("close")
        return result
    answer = arms["candidate"].request("setup", spec=spec)
    if "not_comparable" in answer:
        raise ArmError(f"candidate: setup failed: {answer['not_comparable']}")
    try:
        if settings.smoke:
            ops = 1
        else:
            # Untimed, at least two each: the first operation of a worker pays one-off costs (on a
            # GPU the CUDA context, cuDNN's first calls, the allocator's first blocks: 1 s against a
            # 10 ms step on an H200), so the samples are sized by each arm's fastest warm-up
            # operation. Sized by a median that included it, the first GPU gate took one-step
            # samples, 40 % apart (docs/gpu.md).
            warm = {label: [_sample(arm, 1) for _ in range(max(settings.warmup, 2))] for label, arm in arms.items()}
            op_s = statistics.fmean(min(v) for v in warm.values())
            ops = max(1, round(settings.sample_s / max(op_s, 1e-6)))
        result.ops_per_sample = ops
        strictest = settings.alpha / family_size
        for i in range(settings.max_rounds):
            for label in round_order(i):
                result.samples[label].append(_sample(arms[label], ops))
            done = i + 1
            if (not settings.smoke and done >= settings.min_rounds and done < settings.max_rounds
                    and (done - settings.min_rounds) % settings.look_every == 0):
                # Only a verdict that cannot be a false `slower` ends a benchmark early: looking
                # for `slower` after every few rounds would test it again and again (a false
                # alarm rate up to 3x the nominal level, simulated). `slower` is judged once, at the end.
                est = abstats.estimate(result.samples["baseline"], result.samples["candidate"], settings.threshold)
                if abstats.verdict(est, settings.threshold, strictest) in ("unchanged", "faster"):
                    break
        for label in ("baseline", "candidate"):
            arms[label].request("check")  # wrong results fail the run, in either arm
    finally:
        for arm in arms.values():  # each arm closed on its own: the first error is the one reported
            try:
                if arm.proc.poll() is None:
                    arm.request("close")
            except ArmError:
                arm.kill()
    result.estimate = abstats.estimate(result.samples["baseline"], result.samples["candidate"], settings.threshold)
    result.seconds = time.perf_counter() - start
    log(f"{name}: {len(result.samples['baseline'])} rounds, ratio {result.estimate.ratio:.3f}")
    return result


def judge(results: list[Comparison], settings: Settings) -> None:
    """Fill verdict and level of every compared benchmark, Holm-corrected across them."""
    compared = [r for r in results if r.status == "compared"]
    for r, (verdict, level) in zip(compared, abstats.decide([r.estimate for r in compared], settings.threshold,
                                                            settings.alpha)):
        r.verdict, r.level = verdict, level
    for r in results:
        if r.status != "compared":
            r.verdict = "not comparable"


# -- the baseline tree -------------------------------------------------------------------------------

def _is_project_checkout(path: Path) -> bool:
    return (path / "mgpu" / "__init__.py").is_file() and (path / "pyproject.toml").is_file() and \
        'name = "mgpu"' in (path / "pyproject.toml").read_text(errors="replace")


def resolve_baseline(ref: str, root: Path = PROJECT_ROOT) -> tuple[Path, Path | None]:
    """(tree, worktree to remove afterwards or None) for a path or a git revision; ValueError if neither."""
    path = Path(ref).expanduser()
    if path.is_dir():
        if not _is_project_checkout(path):
            raise ValueError(f"--ab-baseline {ref}: the folder is not a checkout of mgpu (no mgpu/ and pyproject.toml "
                             "naming mgpu)")
        return path.resolve(), None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                             capture_output=True, text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, OSError):
        raise ValueError(f"--ab-baseline {ref}: neither a folder nor a git revision of {root}") from None
    worktree = Path(tempfile.mkdtemp(prefix="mgpu-ab-baseline-"))
    out = subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", "--force", str(worktree), sha],
                         capture_output=True, text=True)
    if out.returncode != 0:
        shutil.rmtree(worktree, ignore_errors=True)
        raise ValueError(f"--ab-baseline {ref}: git worktree add failed: {out.stderr.strip().splitlines()[-1:]}")
    if not _is_project_checkout(worktree):
        remove_worktree(worktree)
        raise ValueError(f"--ab-baseline {ref}: revision {sha[:12]} holds no mgpu package")
    return worktree, worktree


def remove_worktree(worktree: Path, root: Path = PROJECT_ROOT) -> None:
    subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(worktree)], capture_output=True)
    shutil.rmtree(worktree, ignore_errors=True)
    subprocess.run(["git", "-C", str(root), "worktree", "prune"], capture_output=True)


# -- the pytest plugin -------------------------------------------------------------------------------

def add_options(group) -> None:
    group.addoption("--ab-baseline", default=None, metavar="REF",
                    help="A/B gate: time the `gate` benchmarks against REF, a git revision or another checkout")
    group.addoption("--ab-baseline-python", default=None, metavar="PATH",
                    help="A/B gate: run the baseline arm with this Python (another torch/CUDA/NCCL), same tree "
                         "unless --ab-baseline names another")
    group.addoption("--ab-threshold", default="10", metavar="PERCENT",
                    help="the slowdown the gate exists to catch, in percent (default 10)")
    group.addoption("--ab-max-rounds", default="40", metavar="N", help="most rounds per benchmark (default 40, >= 3)")
    group.addoption("--ab-strict", action="store_true", help="an inconclusive benchmark fails the run too")


def _settings(config) -> Settings:
    text = str(config.getoption("--ab-threshold")).strip().rstrip("%")
    try:
        threshold = float(text)
    except ValueError:
        raise ValueError(f"--ab-threshold must be a percentage in (0, 100), got {text!r}") from None
    if not (math.isfinite(threshold) and 0 < threshold < 100):
        raise ValueError(f"--ab-threshold must be a percentage in (0, 100), got {text!r}")
    try:
        max_rounds = int(config.getoption("--ab-max-rounds"))
    except ValueError:
        raise ValueError(f"--ab-max-rounds must be an integer >= 3, got {config.getoption('--ab-max-rounds')!r}") \
            from None
    if max_rounds < 3:
        raise ValueError(f"--ab-max-rounds must be an integer >= 3, got {max_rounds}")
    smoke = bool(config.getoption("benchmark_disable", False))
    return Settings(threshold=threshold / 100, max_rounds=3 if smoke else max_rounds,
                    min_rounds=min(Settings.min_rounds, max_rounds), strict=config.getoption("--ab-strict"),
                    smoke=smoke)


class ABGate:
    """Registered by perf/conftest.py when --ab-baseline or --ab-baseline-python is given."""

    def __init__(self, config):
        self.config = config
        # The gated tests' bodies are replaced by the A/B pair: their benchmark fixture stays unused.
        config.addinivalue_line("filterwarnings", "ignore:Benchmark fixture was not used")
        self.results: list[Comparison] = []
        self.worktree = None
        self.arms: dict[str, Arm] = {}
        self.workdir = Path(tempfile.mkdtemp(prefix="mgpu-ab-"))
        try:
            self.settings = _settings(config)
            ref = config.getoption("--ab-baseline")
            base_tree, self.worktree = resolve_baseline(ref) if ref else (PROJECT_ROOT, None)
            base_python = config.getoption("--ab-baseline-python") or sys.executable
            if config.getoption("--ab-baseline-python") and not (os.path.isfile(base_python)
                                                                 and os.access(base_python, os.X_OK)):
                raise ValueError(f"--ab-baseline-python {base_python}: not an executable file")
            self.baseline_desc = (ref or "this tree") + (f" with {base_python}" if config.getoption(
                "--ab-baseline-python") else "")
            try:
                self.arms["baseline"] = Arm("baseline", base_tree, base_python, self.workdir)
            except ArmError as e:
                what = f"--ab-baseline-python {base_python} is not a Python with torch and mgpu's needs" \
                    if config.getoption("--ab-baseline-python") else f"the baseline's mgpu ({base_tree}) cannot be imported"
                raise ValueError(f"{what}: {e}") from None
            try:
                self.arms["candidate"] = Arm("candidate", PROJECT_ROOT, sys.executable, self.workdir)
            except ArmError as e:
                raise ValueError(f"the candidate's worker cannot start: {e}") from None
            self.versions_seen = {label: arm.versions for label, arm in self.arms.items()}  # kept if an arm dies
        except ValueError as e:
            self.cleanup()
            raise pytest.UsageError(str(e)) from None
        except BaseException:
            self.cleanup()
            raise

    def cleanup(self) -> None:
        for arm in self.arms.values():
            arm.close()
        self.arms = {}
        if self.worktree is not None:
            remove_worktree(self.worktree)
            self.worktree = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- hooks ---------------------------------------------------------------------------------
    def pytest_collection_modifyitems(self, config, items):
        gated = [item for item in items if item.get_closest_marker("gate")]
        deselected = [item for item in items if not item.get_closest_marker("gate")]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        items[:] = gated
        self.family_size = max(1, len(gated))

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem):
        marker = pyfuncitem.get_closest_marker("gate")
        if marker is None:
            return None
        if set(self.arms) != {"baseline", "candidate"}:
            raise ArmError("a worker of an earlier benchmark failed: this run cannot go on")
        try:
            result = compare(pyfuncitem.nodeid, dict(marker.args[0]), self.arms, self.settings, self.family_size)
        except Exception:
            for arm in self.arms.values():  # a failed arm (or a broken exchange) leaves no state to trust
                arm.kill()
            self.arms = {}
            raise
        self.results.append(result)
        if result.status == "not comparable":
            pytest.skip(f"not comparable: {result.reason}")
        return True

    def pytest_sessionfinish(self, session, exitstatus):
        judge(self.results, self.settings)
        if session.exitstatus == 0:
            session.exitstatus = gate_exit_status(self.results, self.settings)
        self._write_outputs()

    def _out_dir(self) -> Path:
        from perf.sweep import DEFAULT_OUT, ENV_OUT

        return Path(self.config.getoption("--perf-out") or os.environ.get(ENV_OUT) or DEFAULT_OUT)

    def _write_outputs(self) -> None:
        if not self.results:
            return
        out = self._out_dir()
        out.mkdir(parents=True, exist_ok=True)
        s = self.settings
        report = {"baseline": self.baseline_desc, "candidate": str(PROJECT_ROOT), "versions": self.versions_seen,
                  "gpu_clocks": self._gpu_clocks(),
                  "settings": {"threshold": s.threshold, "alpha": s.alpha, "min_rounds": s.min_rounds,
                               "max_rounds": s.max_rounds, "look_every": s.look_every, "sample_s": s.sample_s,
                               "strict": s.strict, "smoke": s.smoke, "correction": "holm"},
                  "benchmarks": [r.to_dict() for r in self.results]}
        (out / "ab.json").write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
        for arm in ("baseline", "candidate"):
            (out / f"ab-{arm}.json").write_text(json.dumps(_benchmark_json(self.results, arm, self.versions_seen.get(arm)),
                                                           indent=2) + "\n")
        self.written = [out / "ab.json", out / "ab-baseline.json", out / "ab-candidate.json"]

    def _gpu_clocks(self) -> list:
        from perf.sweep import CLOCKS_KEY

        return self.config.stash.get(CLOCKS_KEY, [])

    def pytest_terminal_summary(self, terminalreporter):
        from perf.clocks import unlocked_warning

        tr = terminalreporter
        tr.section(f"mgpu A/B gate: baseline {self.baseline_desc} vs this tree")
        for label, v in self.versions_seen.items():
            tr.write_line(f"{label}: torch {v['torch']}, CUDA {v['cuda']}, NCCL {v['nccl']} ({v['python']})")
        warning = unlocked_warning(self._gpu_clocks())
        if warning:  # both arms run on these GPUs in turn, so drift is paired out; noise is not
            tr.write_line(f"WARNING: {warning}")
        for line in format_table(self.results, self.settings):
            tr.write_line(line)
        for path in getattr(self, "written", []):
            tr.write_line(f"wrote {path}")

    def pytest_unconfigure(self, config):
        self.cleanup()


def gate_exit_status(results: list[Comparison], settings: Settings) -> int:
    """1 when a judged benchmark is `slower` (or `inconclusive` under --ab-strict), else 0; a smoke run judges nothing."""
    bad = {"slower"} | ({"inconclusive"} if settings.strict else set())
    return 1 if not settings.smoke and any(r.verdict in bad for r in results) else 0


def format_table(results: list[Comparison], settings: Settings) -> list[str]:
    header = f"{'benchmark':<44}{'baseline':>10}{'candidate':>11}{'ratio':>8}  {'interval':<15}{'rounds':>7}  verdict"
    lines = [header, "-" * len(header)]
    for r in results:
        name = r.name.split("::")[-1][:43]
        if r.status != "compared":
            lines.append(f"{name:<44}{'-':>10}{'-':>11}{'-':>8}  {'-':<15}{'-':>7}  not comparable ({r.reason[:60]})")
            continue
        low, high = r.interval()
        interval = f"{low:.3f}-{high:.3f}" if math.isfinite(high) else "-"
        lines.append(f"{name:<44}{r.median('baseline') * 1e3:>8.1f}ms{r.median('candidate') * 1e3:>9.1f}ms"
                     f"{r.estimate.ratio:>8.3f}  {interval:<15}{len(r.samples['baseline']):>7}  {r.verdict}")
    lines.append(f"threshold {settings.threshold:.0%}: slower = interval above {1 + settings.threshold / 2:.3f}; "
                 f"whole-run false-alarm level {settings.alpha} (Holm)" + ("; SMOKE RUN: verdicts mean nothing"
                                                                             if settings.smoke else ""))
    return lines


def _benchmark_json(results: list[Comparison], arm: str, versions: dict | None) -> dict:
    """One arm's samples in pytest-benchmark's saved-run format (for `pytest-benchmark compare`)."""
    import datetime

    from pytest_benchmark import __version__ as pb_version
    from pytest_benchmark.stats import Stats

    benchmarks = []
    for r in results:
        if r.status != "compared" or not r.samples[arm]:
            continue
        stats = Stats()
        for t in r.samples[arm]:
            stats.update(t)
        as_dict = stats.as_dict()
        as_dict.update(data=list(r.samples[arm]), iterations=1)  # as Metadata.as_dict writes it
        name = r.name.split("::")[-1]
        benchmarks.append({"group": "ab-gate", "name": name, "fullname": r.name, "params": None, "param": None,
                           "extra_info": {"arm": arm, "ops_per_sample": r.ops_per_sample, "spec": r.spec},
                           "options": {"disable_gc": False, "timer": "perf_counter", "min_rounds": 1,
                                       "max_time": 0, "min_time": 0, "warmup": False},
                           "stats": as_dict})
    return {"machine_info": {"arm": arm, **(versions or {})}, "commit_info": {},
            "benchmarks": benchmarks, "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "version": pb_version}
