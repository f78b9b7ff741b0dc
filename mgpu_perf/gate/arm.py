"""One arm of the A/B gate, seen from the parent: a long-lived worker process (gate/worker.py)
that imports the code under test from its own tree and runs the gated workloads the parent asks for.

    arm = Arm("baseline", tree, sys.executable, workdir)
    arm.request("setup", spec={...}); arm.request("sample", ops=5)["times"]; arm.close()

The worker runs *this* harness's code whatever its tree holds: the whole `mgpu_perf` package is
copied into the arm's folder, which comes first on the worker's path; the tree comes next, so the
tree's `mgpu` (in a checkout of mgpu) or the user's modules are the arm's own.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
from pathlib import Path

__all__ = ["Arm", "ArmError", "PACKAGE_DIR", "start_workers"]

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # mgpu_perf/, copied whole into every worker's folder

# Started as `python -c BOOT DIR TREE [--require-mgpu]`: DIR (the copied package) first on the path.
BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from mgpu_perf.gate.worker import main; sys.exit(main(sys.argv[2:]))"


class ArmError(RuntimeError):
    """A worker could not start, crashed, hung, or a workload failed in it (the message says which).
    `label`: the arm ("baseline" or "candidate") whose worker failed, where start_workers knows it."""

    label: str = ""


def start_workers(where: dict[str, tuple[Path, str]], count: int, workdir: Path,
                  require_mgpu: bool = False) -> dict[str, list["Arm"]]:
    """`count` workers for each arm, {label: (tree, python)}, all started at once (each imports torch
    and the code under test: seconds), then each waited for. Worker n > 1 of an arm is named
    "label-n". If one cannot start, every worker is killed and its ArmError raised, `label` set."""
    pools: dict[str, list[Arm]] = {}
    label = next(iter(where))
    try:
        for label, (tree, python) in where.items():
            pools[label] = [Arm(label if n == 0 else f"{label}-{n + 1}", tree, python, workdir,
                                require_mgpu=require_mgpu, wait=False) for n in range(count)]
        for label, pool in pools.items():
            for arm in pool:
                arm.wait_ready()
    except ArmError as e:
        for arm in (arm for pool in pools.values() for arm in pool):  # the others are of no use now
            arm.kill()
        e.label = label
        raise
    return pools


class Arm:
    """A worker process importing the code under test from `tree`, with this harness first on its path.

    `require_mgpu`: the tree is a checkout of mgpu, and the worker refuses an `mgpu` imported from
    anywhere else (an installed copy would make both arms time the same code)."""

    def __init__(self, label: str, tree: Path, python: str, workdir: Path, timeout_s: float = 600.0,
                 require_mgpu: bool = False, wait: bool = True):
        self.label, self.tree, self.python, self.timeout_s = label, Path(tree).resolve(), python, timeout_s
        self.dir = workdir / label
        self.dir.mkdir(parents=True)
        shutil.copytree(PACKAGE_DIR, self.dir / "mgpu_perf", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        self.stderr_path = self.dir / "stderr.log"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONHOME"}
        if env.get("PYTHONPATH"):
            # After the harness and the tree (worker.main puts those first), as the parent had it: an
            # mgpu on PYTHONPATH and not installed (make gpu-check) is the one a user's model imports.
            # Absolute, since the worker starts in the tree.
            env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
        with open(self.stderr_path, "w") as err:
            try:
                # Its own session: killing the worker's group also ends the DDP ranks it started.
                self.proc = subprocess.Popen([python, "-c", BOOT, str(self.dir), str(self.tree),
                                              *(["--require-mgpu"] if require_mgpu else [])],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                             cwd=self.tree, env=env, bufsize=1, start_new_session=True)
            except OSError as e:
                raise ArmError(f"{label}: cannot start {python}: {e.strerror or e}") from None
        self.versions = None
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """The worker's first answer (its versions), or ArmError with the reason it cannot work.
        `Arm(..., wait=False)` then `wait_ready()`: several workers import torch and the code at once."""
        if self.versions is not None:
            return
        try:
            hello = self._read()
            if "error" in hello:
                raise ArmError(f"{self.label}: {hello['error']}")
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
        self.send(command, **fields)
        return self.answer(command)

    def send(self, command: str, **fields) -> None:
        """Half a request: the worker starts on it; `answer(command)` waits for its reply."""
        try:
            self.proc.stdin.write(json.dumps({"command": command, **fields}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            code = self.proc.wait(timeout=10)
            raise ArmError(f"{self.label} worker exited with code {code}: {self._tail() or 'no output'}") from None

    def answer(self, command: str) -> dict:
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

