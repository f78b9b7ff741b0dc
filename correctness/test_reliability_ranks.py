"""Failing ranks: real `python -m mgpu train --strategy ddp` (and fsdp) runs with a fault injected into one rank;
the fsdp runs end to end, and both strategies over two torchrun "nodes" on this machine.

Whatever a rank does (raises, is SIGKILLed, hangs in a collective) or the user does (Ctrl-C),
the whole run must exit non-zero within 30 s (on a machine busy with other jobs: within twice
what the run took to start, `Run.exit_bound`), say which rank failed and why, and leave no process
behind. Faults come from the MGPU_FAULT test hook (mgpu/faults.py, `Fault`). Each run carries a
unique environment variable that every process it starts inherits, so leftovers are found by
scanning /proc. A run that uses no CPU for IDLE_S is a hang (Run.working); every run is killed (its whole session) in the end.

Every run starts with SIGINT at its default disposition, whatever the test process inherited (a
background job of a script starts with SIGINT ignored, and Python then installs no
KeyboardInterrupt handler): the tests that send SIGINT test what Ctrl-C does in a terminal.

The launcher's own duties (signals, dying with its launcher, the rendezvous port) are tested
with ranks that run a few lines of plain Python.
"""

from __future__ import annotations

import ast
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest

from correctness.helpers import COMPARISON_KIND, TINY, assert_trained, check_run_outputs, load_stretched, weights_config
from correctness.processes import IDLE_S, cpu_seconds
from mgpu import devices as devmod
from mgpu import launch
from mgpu.config import EXACT_GPU_MATH_ENV
from mgpu.faults import FAULT_ENV

# The module's runs share one fixture (started together). A hang is a run that uses no CPU
# (Run.working, correctness/processes.py), found without a fixed time: beside a CPU burner the niced
# runs take minutes and still work. The timeout is a backstop for the test code itself.
pytestmark = [pytest.mark.reliability, pytest.mark.multiprocess, pytest.mark.timeout(900),
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="finds leftover processes in /proc, and ranks die with their launcher "
                                        "by PR_SET_PDEATHSIG: Linux only")]

ROOT = Path(__file__).resolve().parents[1]
TAG = "MGPU_TEST_RUN_TAG"
EXIT_WITHIN_S = 30.0
# A run whose ranks have all finished (its last line printed) exits within this long, under load too:
# torchrun's agents meet at an exit barrier after their workers end, and a rank that aborts at exit
# (gloo's "terminate called", mended in DistributedDataParallel.teardown) left the others waiting
# out its 300-s timeout.
FINISHED_EXIT_S = 10.0
# The module's runs (and their ranks) run at this niceness: they overlap the rest of the suite, which is
# one process on one core, and would otherwise take that core from it in bursts of several runs at once.
NICE = int(os.environ.get("MGPU_TEST_NICE", "10"))
HANG_TIMEOUT_S = 12  # --timeout of the hang run: long enough for the ranks to meet on a busy machine
# LeNet on two gloo ranks of one thread each, 16 steps an epoch: the settings (TINY) on which
# test_training checks that every strategy learns, so that the reference run checks ddp's case.
TINY_ARGS = ["--model", TINY["model"], "--batch-size", str(TINY["batch_size"]), "--lr", str(TINY["lr"]),
             "--train-size", str(TINY["train_size"]), "--test-size", str(TINY["test_size"])]
DDP_ARGS = ["--strategy", "ddp", "--devices", "2", *TINY_ARGS]
# Runs whose model.pt is compared bitwise with the suite's spawned 2-rank runs of helpers.weights_config
# (LeNet, 4 SGD steps with momentum, batches of 25: 13 + 12 per rank), as command-line options, on the
# suite's device kind (helpers.COMPARISON_KIND). Those runs are compared with single-device training
# step by step (test_weights).
WEIGHTS = weights_config("single")
WEIGHTS_ARGS = ["--model", WEIGHTS.model, "--epochs", str(WEIGHTS.epochs), "--batch-size", str(WEIGHTS.batch_size),
                "--lr", str(WEIGHTS.lr), "--momentum", str(WEIGHTS.momentum), "--weight-decay", str(WEIGHTS.weight_decay),
                "--train-size", str(WEIGHTS.train_size), "--test-size", str(WEIGHTS.test_size), "--seed", str(WEIGHTS.seed),
                "--no-progress", "--device", COMPARISON_KIND]
FSDP_ARGS = ["--strategy", "fsdp", "--devices", "2", *WEIGHTS_ARGS]
# Two torchrun agents as two "nodes" of one rank each, meeting by torchrun's c10d rendezvous.
NODE_STRATEGIES = ("ddp", "fsdp")


# Lowers the priority of the process and of its session's scheduling group (the kernel's autogroup, where
# it has one: each run has a session of its own, and niceness then weighs only within the group).
NICE_SHIM = ("import os\nos.nice({0})\ntry:\n    with open('/proc/self/autogroup', 'w') as f:\n        f.write('{0}')\n"
             "except OSError:\n    pass\n")
# Runs the rest of its command line with SIGINT's disposition set first (default, or ignored).
SIGINT_SHIM = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_{}); "
               "os.execv(sys.executable, [sys.executable] + sys.argv[1:])")

# The time a finished run's processes are given to exit, on a quiet machine (leftovers() stretches it by the load).
SETTLE_S = 2.0


class Run:
    """`python -m mgpu train ARGS...` (or `python -c CODE ARGS...`) in its own session, its output collected line
    by line, with time stamps. It starts with SIGINT at its default disposition (`sigint_ignored`:
    ignored, as in a background job of a script)."""

    def __init__(self, args: list[str], fault: str | None = None, code: str | None = None,
                 sigint_ignored: bool = False, module: str = "mgpu", cores: set[int] | None = None,
                 env: dict | None = None, niced: bool = True):
        self.tag = uuid.uuid4().hex
        extra, env = env or {}, {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, "RANK", "WORLD_SIZE")}
        env.update(extra)
        env[TAG] = self.tag
        env[EXACT_GPU_MATH_ENV] = "1"  # started before the suite's fixtures: GPU math as exact as theirs
        if fault:
            env[FAULT_ENV] = fault
        self.started = time.monotonic()
        command = ["-c", code, *args] if code else ["-m", module, *(["train"] if module == "mgpu" else []), *args]
        shim = SIGINT_SHIM.format("IGN" if sigint_ignored else "DFL")
        shim = NICE_SHIM.format(0 if _HURRIED or not niced else NICE) + shim
        if cores is not None:  # the run (and everything it starts) may use these cores only
            shim = f"import os; os.sched_setaffinity(0, {sorted(cores)}); {shim}"
        command = [sys.executable, "-c", shim, *command]
        self.proc = subprocess.Popen(command, cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.out: list[str] = []
        self.out_at: list[float] = []  # when each stdout line came
        self.err: list[tuple[float, str]] = []
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, False), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, True), daemon=True)]
        for t in self._readers:
            t.start()
        self.ended: float | None = None  # when the process exited, stamped by a watcher thread
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()
        self.code: int | None = None
        self.problem: str | None = None  # what went wrong while driving the run, if anything
        self.leftover: list[str] = []
        self.signal_at: float | None = None
        self.alive_before_last_signal: bool | None = None  # (STOPS) before its last signal came

    def exit_bound(self, since: float) -> float:
        """How long the run may take to exit after `since` (its fault, or a signal): EXIT_WITHIN_S, or
        twice what it took to get from its start to `since` where that is longer. The runs are
        niced to the bone (NICE, their sessions' groups too), so a machine busy with other jobs gives
        them little CPU, and no fixed bound holds there. Their own start, taken in the same run, says
        how little: stopping costs less than starting (no imports, no rendezvous)."""
        return max(EXIT_WITHIN_S, 2 * (since - self.started))

    def _watch(self) -> None:
        self.proc.wait()
        self.ended = time.monotonic()

    def _read(self, stream, is_err: bool) -> None:
        for line in stream:
            if is_err:
                self.err.append((time.monotonic(), line.rstrip("\n")))
            else:
                self.out_at.append(time.monotonic())
                self.out.append(line.rstrip("\n"))

    @property
    def stderr(self) -> str:
        return "\n".join(line for _, line in self.err)

    def working(self, idle_s: float) -> Callable[[], bool]:
        """A test of whether to go on waiting for this run: true while its processes (launcher, agent,
        ranks) have used CPU within the last idle_s. No fixed time: niced beside a CPU burner a run
        gets a tenth of a core and takes minutes to start, yet it works; a hang uses none."""
        seen = {"cpu": -1.0, "at": time.monotonic()}

        def still() -> bool:
            used = cpu_seconds(self.proc.pid)
            if used > seen["cpu"]:
                seen.update(cpu=used, at=time.monotonic())
            return time.monotonic() - seen["at"] < idle_s
        return still

    def wait_for_stderr(self, text: str, idle_s: float = IDLE_S) -> float:
        """Time stamp of the first stderr line containing text, waiting while the run works (0: look
        only at what came)."""
        still = self.working(idle_s)
        while True:
            for stamp, line in list(self.err):
                if text in line:
                    return stamp
            if not still() or (self.proc.poll() is not None and not any(t.is_alive() for t in self._readers)):
                break
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} on stderr (the run {'ended' if self.proc.poll() is not None else 'used no CPU for'}"
                             f"{'' if self.proc.poll() is not None else f' {idle_s:g} s'}); stderr:\n{self.stderr}")

    def wait(self, idle_s: float = IDLE_S) -> int:
        """The run's exit code, waiting while it works; AssertionError (a hang) once it used no CPU for idle_s."""
        still = self.working(idle_s)
        while True:
            try:
                code = self.proc.wait(0.5)
                break
            except subprocess.TimeoutExpired:
                if not still():
                    stdout = "\n".join(self.out[-20:])  # where a silent hang got to (a node's epochs go to stdout)
                    raise AssertionError(f"run still going, no CPU used for {idle_s:g} s: a hang; stdout (last "
                                         f"lines):\n{stdout}\nstderr:\n{self.stderr}") from None
        for t in [self._watcher, *self._readers]:
            t.join(5)
        return code

    def leftovers(self, settle_s: float | None = None) -> list[str]:
        """Processes of this run still alive after up to settle_s for them to finish exiting: by default
        SETTLE_S stretched by the load (a forkserver wakes to its parent's exit only when scheduled: beside
        a load of 7 per core, one was still alive 2 s after its run had exited)."""
        if settle_s is None:
            settle_s = load_stretched(SETTLE_S)
        end = time.monotonic() + settle_s
        while True:
            found = []
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    environ = Path(f"/proc/{pid}/environ").read_bytes()
                    if f"{TAG}={self.tag}".encode() in environ.split(b"\0"):
                        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200]
                        found.append(f"{pid}: {cmdline.decode(errors='replace')}")
                except OSError:  # gone meanwhile, or not ours to read
                    pass
            if not found or time.monotonic() > end:
                return found
            time.sleep(0.1)

    def kill(self) -> None:
        """Kill the run's session and anything that carries its tag (the test's safety net)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for line in self.leftovers(settle_s=0):
            try:
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
            except OSError:
                pass
        self.proc.wait(10)
        for t in self._readers:  # the pipes end with the process; then close them
            t.join(5)
        if not any(t.is_alive() for t in self._readers):
            self.proc.stdout.close()
            self.proc.stderr.close()


def _assert_failed_fast(run: Run, since: float, expect: str) -> None:
    assert run.code == 1, f"exit code {run.code}; stderr:\n{run.stderr}"
    errors = [line for _, line in run.err if line.startswith("mgpu: error:")]
    assert errors and expect in errors[0], f"first error line should say {expect!r}; stderr:\n{run.stderr}"
    took = run.ended - since
    assert took < run.exit_bound(since), f"the run took {took:.1f} s after the fault to exit (start: {since - run.started:.1f} s)"
    assert "Traceback" not in run.stderr.split("mgpu: error:")[0], "a rank printed a traceback of its own"
    assert not run.leftover, "processes left behind:\n" + "\n".join(run.leftover)


class Scenario:
    """Five runs started at the same moment, each picking its own free port (the 2 cores are
    shared; waiting overlaps): four DDP runs, three with a fault in rank 1 and a reference, and an
    FSDP run whose rank 1 is SIGKILLed. The Ctrl-C run gets SIGINT once its rank 1 hangs; the
    SIGKILLed run is resumed as soon as it has ended (DDP's resume is test_reliability_checkpoint's,
    in the suite's shared ranks). Each run's exit code, output, exit time and leftover processes are
    kept for the tests below. Once the Ctrl-C run has got its signal, the launchers of the tests
    of the launcher itself (`launchers`) start too, overlapping the end of these runs; once every
    run has ended, the torchrun "nodes" (`_start_nodes`) start.

    A driver thread does all that. It starts when the session's collection ends, if any test of
    this module was selected (correctness/conftest.py: the runs then overlap the tests before this
    module, which use one core of two), or else when the `runs` fixture first asks for it."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.args = [*DDP_ARGS, "--epochs", str(TINY["epochs"]), "--no-progress"]
        self.started: dict[str, Run] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._drive, daemon=True)
        self.thread.start()

    def _drive(self) -> None:
        try:
            self._run_all()
        except BaseException as e:  # reported by the fixture, not lost in a thread
            self.error = e

    def _run_all(self) -> None:
        tmp, args = self.tmp, self.args
        hang = "rank=1,epoch=1,step=2,kind=hang"
        # The SIGKILLed run is fsdp's (weights_config's settings): resumed, it is also fsdp's end-to-end run.
        checkpointed = [*FSDP_ARGS, "--out", str(tmp / "resumed"), "--checkpoint-dir", str(tmp / "ckpt")]
        started = self.started
        started.update({
            "raise": Run([*args, "--out", ""], fault="rank=1,epoch=1,step=2,kind=raise"),
            # Rank 0 waits in DDP's gradient allreduce for the hung rank 1 until the process-group timeout.
            "hang": Run([*args, "--out", "", "--timeout", str(HANG_TIMEOUT_S)], fault=hang),
            # Rank 1 hangs, so rank 0 sits inside a collective (the hardest place to interrupt) when Ctrl-C comes.
            "ctrl-c": Run([*args, "--out", "", "--timeout", "300"], fault=hang),
            # With its progress bar: it is also the end-to-end run of `python -m mgpu train --strategy ddp`.
            "reference": Run([*DDP_ARGS, "--epochs", str(TINY["epochs"]), "--out", str(tmp / "reference")]),
            "killed": Run(checkpointed, fault="rank=1,epoch=2,step=1,kind=kill"),
        })

        def wait(run: Run) -> None:
            try:
                run.code = run.wait()
            except AssertionError as e:
                run.problem = str(e)

        try:
            ctrl_c = started["ctrl-c"]
            try:
                ctrl_c.wait_for_stderr("injecting hang at rank 1")
                ctrl_c.signal_at = time.monotonic()
                os.killpg(ctrl_c.proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
            except AssertionError as e:
                ctrl_c.problem = str(e)
            _start_launchers()  # every run is past its rendezvous by now
            try:  # its processes have exited, so its checkpoint is complete (its output is collected below)
                started["killed"].wait()
            except AssertionError:
                pass  # wait() below says it hung
            started["resumed"] = Run([*checkpointed, "--resume"])
            # Then the torchrun "nodes", one pair at a time: two pairs at once race for ports (each
            # agent's rendezvous port is picked free before it binds it): once so far (2026-11-23,
            # make test) an fsdp node hung silently in its rendezvous while the ddp pair started.
            for strategy in NODE_STRATEGIES:
                nodes = _start_nodes(tmp, strategy)
                started.update(nodes)
                for run in nodes.values():
                    wait(run)
            for run in list(started.values()):
                if run.code is None and run.problem is None:
                    wait(run)
        finally:
            for run in list(started.values()):
                run.leftover = run.leftovers()
                run.kill()

    def finish(self) -> dict[str, Run]:
        """The runs, once the driver has seen each end (or found it hung: Run.wait)."""
        _hurry(self)
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.started

    def kill(self) -> None:
        for run in list(self.started.values()):
            run.kill()


def _node_dir(tmp: Path, strategy: str, node: int) -> Path:
    return tmp / f"nodes-{strategy}" / f"node{node}"


def _start_nodes(tmp: Path, strategy: str) -> dict[str, Run]:
    """Two torchrun agents on this machine as two nodes of one rank each (`--nnodes 2 --node-rank
    0|1`, c10d rendezvous on a free port), training `strategy`, each node given its own output and
    checkpoint folders (only the node holding global rank 0 may write into its own) and its own
    half of the cores, as two machines would have (a rank takes the threads of its node's cores: as
    many as each of 2 ranks spawned on this machine takes). Beside GPUs each node sees one GPU of
    its own (CUDA_VISIBLE_DEVICES), or none when the suite compares on the CPU."""
    cores = devmod.usable_cores()
    half = max(1, len(cores) // 2)
    started = {}
    endpoint, run_id = f"127.0.0.1:{launch.free_port()}", f"mgpu-{strategy}-{uuid.uuid4().hex[:8]}"
    for node in (0, 1):
        folder = _node_dir(tmp, strategy, node)
        started[f"{strategy}-node{node}"] = Run(
            ["--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
             # Node 0 hosts the rendezvous store, as the endpoint's machine would. On one machine
             # both nodes match 127.0.0.1 and the first to bind would host. When that was node 1
             # and it left first, node 0 lost the store mid-training and exited 1 (seen in CI).
             "--rdzv-conf", f"join_timeout=60,is_host={'true' if node == 0 else 'false'}",
             "-m", "mgpu", "train", "--strategy", strategy, *WEIGHTS_ARGS,
             "--out", str(folder / "out"), "--checkpoint-dir", str(folder / "ckpt")],
            # Not niced: each node has one core of its own, and its exit is timed (FINISHED_EXIT_S); at +10
            # beside a CPU burner a node took 6-11 s to tear down after its last line.
            module="torch.distributed.run", cores=set(cores[node * half:(node + 1) * half] or cores[:half]), niced=False,
            env={"CUDA_VISIBLE_DEVICES": str(node) if COMPARISON_KIND == "cuda" else ""})
    return started


_SCENARIO: list[Scenario] = []  # the one scenario of this session, once started
_HURRIED: list = []  # not empty once the tests wait for the runs: those started then are not niced


def _hurry(scenario: Scenario) -> None:
    """The tests wait for the runs now: the rest of the suite no longer needs the core they were
    niced to leave it, so the runs still going (and the launchers') get the test process's priority
    back where this user may raise one (shared_runs.raise_priority), and the runs still to come start
    without it. On a machine busy with other jobs, niced runs could otherwise keep the suite waiting
    at its end."""
    from correctness.shared_runs import raise_priority

    _HURRIED.append(True)
    for run in [*scenario.started.values(), *_LAUNCHERS.get("started", {}).values()]:
        raise_priority(run.proc.pid)


def start_scenario(tmp: Path) -> Scenario:
    """Start the module's runs now (once per session); correctness/conftest.py calls it when
    collection ends."""
    if not _SCENARIO:
        _SCENARIO.append(Scenario(tmp))
    return _SCENARIO[0]


def stop_scenario() -> None:
    """At the end of the session: kill whatever still runs (a session stopped early, -x)."""
    if _SCENARIO:
        _SCENARIO[0].kill()
    _finish_launchers()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(folder, common arguments, {name: Run}) of the module's runs: see Scenario."""
    scenario = start_scenario(tmp_path_factory.mktemp("ddp"))
    started = scenario.finish()
    yield scenario.tmp, scenario.args, started
    _finish_launchers()  # when no test used them


def _run(runs, name: str) -> Run:
    run = runs[2][name]
    assert run.problem is None, run.problem
    return run


def test_rank_that_raises_ends_the_run(runs):
    run = _run(runs, "raise")
    fault_at = run.wait_for_stderr("injecting raise at rank 1", 0)
    _assert_failed_fast(run, fault_at, "rank 1 failed: RuntimeError: injected fault (MGPU_FAULT) at epoch 1, step 2")
    assert "Traceback" in run.stderr.split("mgpu: error:")[1], f"no traceback of rank 1's error:\n{run.stderr}"


def test_sigkilled_rank_ends_the_run(runs):
    run = _run(runs, "killed")
    fault_at = run.wait_for_stderr("injecting kill at rank 1", 0)
    _assert_failed_fast(run, fault_at, "rank 1 failed: killed by SIGKILL")


def test_hung_rank_is_ended_by_the_process_group_timeout(runs):
    run = _run(runs, "hang")
    fault_at = run.wait_for_stderr("injecting hang at rank 1", 0)
    _assert_failed_fast(run, fault_at, "rank 0 failed:")
    assert "Timed out" in run.stderr.split("mgpu: error:")[1], run.stderr
    assert run.ended - fault_at >= HANG_TIMEOUT_S - 1, "stopped before the process-group timeout: by what?"


def test_ctrl_c_stops_every_rank(runs):
    run = _run(runs, "ctrl-c")
    assert run.code == 130, f"exit code {run.code}; stderr:\n{run.stderr}"
    assert "mgpu: interrupted: every rank stopped" in run.stderr, run.stderr
    assert run.ended - run.signal_at < run.exit_bound(run.signal_at)
    assert not run.leftover, "processes left behind:\n" + "\n".join(run.leftover)


def test_concurrent_rank_runs_do_not_collide(runs):
    reference, killed = _run(runs, "reference"), _run(runs, "killed")
    assert reference.code == 0, f"the reference run failed next to four others:\n{reference.stderr}"
    assert not reference.leftover
    everything = "\n".join(run.stderr for run in runs[2].values()).lower()
    assert "address already in use" not in everything and "eaddrinuse" not in everything
    assert any(line.startswith("epoch 1/") for line in killed.out), f"a run never trained an epoch:\n{killed.stderr}"


def test_python_dash_m_mgpu_train_ddp_end_to_end(runs):
    """The whole job as users start it, on the settings of test_training (TINY), read from what
    the run wrote: the chapter's line, results.json, accuracy.png, model.pt; it learned."""
    import torch

    run = _run(runs, "reference")
    assert run.code == 0, f"exit {run.code}; stderr:\n{run.stderr}"
    out = runs[0] / "reference"
    data = check_run_outputs(out, "\n".join(run.out), "ddp", epochs=TINY["epochs"])
    assert_trained([e["loss"] for e in data["epochs"]], data["test_acc"], torch.load(out / "model.pt"),
                   data["summary"], "ddp on 2 ranks")
    assert data["devices"] == "[cpu (rank 0), cpu (rank 1)]"
    assert f"epoch 1/{TINY['epochs']}" in run.stderr, "the progress bar goes to stderr"
    assert sum("test acc:" in line for line in run.out) == 1, "only rank 0 prints"


def test_python_dash_m_mgpu_train_fsdp_killed_and_resumed_ends_bitwise_where_it_would_have(runs, rank_runs):
    """`python -m mgpu train --strategy fsdp --devices 2 --checkpoint-dir D`, rank 1 SIGKILLed in epoch 2,
    then `... --resume`: the run ends with the chapter's line, results.json (memory per device
    included), accuracy.png, and a model.pt (the full state gathered from the shards) bitwise equal
    to the uninterrupted fsdp run's (whose steps test_weights compares with single-device training's)."""
    import torch

    tmp = runs[0]
    killed, run = _run(runs, "killed"), _run(runs, "resumed")
    assert killed.code == 1 and "rank 1 failed: killed by SIGKILL" in killed.stderr, killed.stderr
    assert run.code == 0, run.stderr
    assert not run.leftover, "processes left behind:\n" + "\n".join(run.leftover)
    assert any("resuming from" in line and f"after epoch 1 ({WEIGHTS.epochs - 1} epoch(s) left)" in line
               for line in run.out), run.out
    out = tmp / "resumed"
    data = check_run_outputs(out, "\n".join(run.out), "fsdp", epochs=WEIGHTS.epochs)
    assert data["devices"] == "[cpu (rank 0), cpu (rank 1)]" and data["memory_per_device"]["parameters"] > 0, data
    assert any(line.startswith("memory per device: parameters") for line in run.out), run.out
    resumed = torch.load(out / "model.pt", weights_only=True)
    uninterrupted = rank_runs(2).weights["fsdp"].state_dict
    differ = [k for k in uninterrupted if not torch.equal(uninterrupted[k], resumed[k])]
    assert not differ, f"resumed fsdp weights differ from the uninterrupted run's: {differ}"


@pytest.mark.parametrize("strategy", NODE_STRATEGIES)
def test_two_torchrun_nodes_train_what_two_ranks_train_and_only_global_rank_0_writes(runs, strategy, rank_runs):
    """torchrun's multi-node rendezvous, rehearsed on one machine: two agents (`--nnodes 2
    --node-rank 0|1 --rdzv-backend c10d`), one rank each, each on half the cores. The model.pt of
    global rank 0 is bitwise that of the suite's 2-rank run of the same settings (2 ranks, the same
    threads a rank, the same sums: whose steps test_weights compares with single-device training's);
    the other node writes no file, prints no line."""
    import torch

    nodes = [_run(runs, f"{strategy}-node{node}") for node in (0, 1)]
    for node, run in enumerate(nodes):
        assert run.code == 0, f"node {node} exit {run.code}; stderr:\n{run.stderr}"
        assert not run.leftover, f"node {node} left processes behind:\n" + "\n".join(run.leftover)
    folders = [_node_dir(runs[0], strategy, node) for node in (0, 1)]
    writers = [node for node, folder in enumerate(folders) if folder.exists()]
    assert len(writers) == 1, f"{strategy}: nodes {writers} wrote files; only the node of global rank 0 may"
    writer = writers[0]
    assert sorted(p.name for p in folders[writer].iterdir()) == ["ckpt", "out"], list(folders[writer].iterdir())
    printed = [node for node, run in enumerate(nodes) if any("test acc:" in line for line in run.out)]
    assert printed == [writer], f"{strategy}: the chapter's line came from nodes {printed}, files from node {writer}"
    last_line_at = max(at for at, line in zip(nodes[writer].out_at, nodes[writer].out) if "test acc:" in line)
    exited = [run.ended - last_line_at for run in nodes]
    assert max(exited) < FINISHED_EXIT_S, (f"{strategy}: the nodes exited {exited[0]:.1f} s and {exited[1]:.1f} s after "
                                           f"the run's last line (at most {FINISHED_EXIT_S:g} s)")
    data = check_run_outputs(folders[writer] / "out", "\n".join(nodes[writer].out), strategy, epochs=WEIGHTS.epochs)
    assert data["devices"] == "[cpu (rank 0), cpu (rank 1)]", data["devices"]
    saved = torch.load(folders[writer] / "out" / "model.pt", weights_only=True)
    spawned = rank_runs(2).weights[strategy].state_dict
    differ = [k for k in spawned if not torch.equal(spawned[k], saved[k])]
    assert not differ, f"{strategy} over two torchrun nodes (model.pt) vs 2 spawned ranks: tensors differ: {differ}"


# -- the launcher itself, with ranks that run plain Python -------------------------------------------

def _hang_forever(rendezvous_port):
    """Runs in each rank: say so, and which of its MASTER_PORT and the rendezvous port (if given)
    something listens on; then wait to be stopped."""
    held = {}
    for port in (int(os.environ["MASTER_PORT"]), rendezvous_port):
        if port is not None:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                held[port] = s.connect_ex(("127.0.0.1", port)) == 0
    # One write: the ranks share the launcher's stderr, and print() writes a line and its newline apart
    # (stderr is unbuffered), so two ranks' lines could run together ("{...}rank 1 up, ...").
    os.write(2, f"rank {os.environ['RANK']} up, ports held: {held}\n".encode())
    while True:
        time.sleep(1)


# A launcher as the CLI is one: KeyboardInterrupt (and launch.Terminated, for SIGTERM) ends it.
# Its argument, if any, is the rendezvous port.
LAUNCHER = """
import sys
from mgpu import launch
from correctness.test_reliability_ranks import _hang_forever
port = int(sys.argv[1]) if len(sys.argv) > 1 else None
try:
    launch.spawn(_hang_forever, port, nprocs=2, port=port)
except KeyboardInterrupt as e:
    print(f"stopped by signal {getattr(e, 'signum', 2)}", file=sys.stderr)
    sys.exit(128 + getattr(e, "signum", 2))
"""

# How each launcher is stopped once its ranks are up: (signal, to the whole process group?), 1 s apart.
STOPS = {
    # Started with SIGINT ignored (a background job of a script): Ctrl-C first, which it ignores.
    "sigterm": [(signal.SIGINT, True), (signal.SIGTERM, False)],
    # Started with a rendezvous port given (test_ranks_meet_on_ports_the_launcher_already_holds).
    "sigint-to-launcher-only": [(signal.SIGINT, False)],
    "sigkill": [(signal.SIGKILL, False)],
}
GIVEN_PORT = "sigint-to-launcher-only"


def _stop(run: Run, steps) -> None:
    try:
        run.wait_for_stderr("rank 0 up")
        run.wait_for_stderr("rank 1 up")
        for i, (sig, to_group) in enumerate(steps):
            if i:
                time.sleep(1.0)
                run.alive_before_last_signal = run.proc.poll() is None
            run.signal_at = time.monotonic()
            (os.killpg if to_group else os.kill)(run.proc.pid, sig)
        run.code = run.wait()
    except AssertionError as e:
        run.problem = str(e)


_LAUNCHERS: dict = {}  # the launchers of STOPS, while they run


def _start_launchers() -> None:
    """Start the launchers of STOPS, each driven by a thread of its own (once per module: `runs`
    starts them together with its own runs, to overlap)."""
    if not _LAUNCHERS:
        started = {name: Run([str(launch.free_port())] if name == GIVEN_PORT else [], code=LAUNCHER,
                             sigint_ignored=name == "sigterm") for name in STOPS}
        threads = [threading.Thread(target=_stop, args=(started[name], STOPS[name])) for name in STOPS]
        for t in threads:
            t.start()
        _LAUNCHERS.update(started=started, threads=threads, finished=False)


def _finish_launchers() -> None:
    if not _LAUNCHERS or _LAUNCHERS["finished"]:
        return
    try:
        for t in _LAUNCHERS["threads"]:
            t.join()  # each ends once its run has (Run.wait: a run that uses no CPU is a hang)
    finally:
        for run in _LAUNCHERS["started"].values():
            run.leftover = run.leftovers()
            run.kill()
        _LAUNCHERS["finished"] = True


@pytest.fixture(scope="module")
def launchers():
    """The launchers of STOPS, started at the same moment (each one starts Python and torch three
    times: overlapping them saves time; `runs` starts them while its last runs finish), each
    stopped as STOPS says once its ranks are up."""
    _start_launchers()
    _finish_launchers()
    yield _LAUNCHERS["started"]


@pytest.mark.parametrize("name, code", [("sigterm", 143), ("sigint-to-launcher-only", 130), ("sigkill", -9)],
                         ids=list(STOPS))
def test_a_signal_to_the_launcher_alone_stops_every_rank(launchers, name, code):
    """SIGTERM (`timeout`, a CI runner) or SIGINT sent to the launcher only: it stops the ranks
    itself. SIGKILL: it can do nothing, and the kernel kills the ranks (PR_SET_PDEATHSIG)."""
    run = launchers[name]
    assert run.problem is None, run.problem
    assert run.code == code, f"exit code {run.code}; stderr:\n{run.stderr}"
    assert run.ended - run.signal_at < run.exit_bound(run.signal_at)
    assert not run.leftover, "ranks outlived their launcher:\n" + "\n".join(run.leftover)


def test_a_launcher_started_with_sigint_ignored_ignores_ctrl_c_but_not_sigterm(launchers):
    """A background job of a script starts with SIGINT ignored: the launcher and its ranks keep
    ignoring it (Ctrl-C to the group stops nothing, and no rank fails), and SIGTERM still stops
    every rank (exit 143, not 1)."""
    run = launchers["sigterm"]
    assert run.problem is None, run.problem
    assert run.alive_before_last_signal, f"Ctrl-C stopped a launcher that ignores SIGINT; stderr:\n{run.stderr}"
    assert run.code == 143, f"exit code {run.code}; stderr:\n{run.stderr}"
    assert not run.leftover, "ranks outlived their launcher:\n" + "\n".join(run.leftover)


def test_ranks_meet_on_ports_the_launcher_already_holds(launchers):
    """No race for a port between concurrent runs: the launcher binds the rendezvous port (the
    one given, or one the kernel picks) and the ranks' MASTER_PORT (one the kernel picks) before
    any rank starts, so each rank finds both held. (The other runs here leave the choice to the kernel.)"""
    run = launchers[GIVEN_PORT]
    given = int(run.proc.args[-1])
    for rank in (0, 1):
        line = next((line for _, line in run.err if line.startswith(f"rank {rank} up")), "")
        held = ast.literal_eval(line.partition("ports held: ")[2] or "{}")  # the dict the rank printed
        assert len(held) == 2 and given in held and all(held.values()), f"rank {rank}: {line!r}\n{run.stderr}"


def test_cli_reports_sigterm_with_exit_code_143(monkeypatch, capsys):
    from mgpu import cli
    from mgpu import run as run_module

    def stopped(cfg):
        raise launch.Terminated(signal.SIGTERM)

    monkeypatch.setattr(run_module, "train", stopped)
    # A run of seconds, should the patch miss the `train` the command calls: it then ends 0, not 143.
    tiny = ["--model", "lenet", "--epochs", "1", "--batch-size", "8", "--train-size", "8", "--test-size", "8", "--no-progress"]
    assert cli.main(["train", *tiny, "--out", ""]) == 143, "the command did not call the patched mgpu.run.train"
    assert capsys.readouterr().err == "mgpu: terminated: every rank stopped\n"


def _rank_view(_):
    """Runs in each rank: what the test below asks about this rank's process."""
    return {"env": {k: os.environ.get(k) for k in ("MGPU_TEST_ADDED", "MGPU_TEST_REMOVED", "RANK", "WORLD_SIZE")},
            "ppid": os.getppid(), "torch_preloaded": "torch" in sys.modules}


def test_ranks_see_the_launchers_environment_of_the_moment_they_start(monkeypatch):
    """Ranks are forked from a fork server that lives as long as the launcher (mgpu.launch.START_METHOD):
    a variable the launcher set or removed after the server started must reach the ranks as it is
    now (a test that sets MGPU_FAULT before its run, say), beside what the agent sets for each rank."""
    monkeypatch.setenv("MGPU_TEST_REMOVED", "stale")
    first = launch.spawn(_rank_view, None, nprocs=2, deadline_s=60)  # the server starts here, if not before
    assert first["env"]["MGPU_TEST_REMOVED"] == "stale", first
    monkeypatch.delenv("MGPU_TEST_REMOVED")
    monkeypatch.setenv("MGPU_TEST_ADDED", "now")
    second = launch.spawn(_rank_view, None, nprocs=2, deadline_s=60)
    assert second["env"] == {"MGPU_TEST_ADDED": "now", "MGPU_TEST_REMOVED": None, "RANK": "0", "WORLD_SIZE": "2"}, second
    assert second["ppid"] == first["ppid"] != os.getpid(), "the second spawn should fork from the same server"


def _count_tensors(tensors):
    return len(tensors), float(sum(t.sum() for t in tensors.values()))


def test_a_config_with_hundreds_of_tensors_reaches_the_ranks():
    """A rank's argument holding more tensors than one message may carry file descriptors (253:
    multiprocessing would send each tensor's storage as one) still reaches every rank: a state dict
    of MobileNetV3 has 244 tensors, and `mgpu check` sends one to its DDP ranks."""
    import torch

    tensors = {f"t{i}": torch.full((3,), float(i)) for i in range(400)}
    got = launch.spawn(_count_tensors, tensors, nprocs=2, deadline_s=60)
    assert got == (400, 3.0 * sum(range(400))), got


def test_the_ranks_grace_before_sigkill_is_given_only_to_a_torch_that_takes_it():
    # torch 2.11's LaunchConfig has no shutdown_timeout: passing it failed every rank spawn on the
    # H200 machine (a TypeError before any rank started).
    import dataclasses

    @dataclasses.dataclass
    class OlderLaunchConfig:
        min_nodes: int = 1

    @dataclasses.dataclass
    class NewerLaunchConfig:
        min_nodes: int = 1
        shutdown_timeout: int = 30

    assert launch._shutdown_grace(OlderLaunchConfig) == {}
    assert launch._shutdown_grace(NewerLaunchConfig) == {"shutdown_timeout": launch.TERMINATE_GRACE_S}
