"""Inside a rank, under `mgpu check-script --whole-run` at N ranks: the collectives each rank enters, in
order, published to the run's folder, and the watcher that ends the run when the ranks have parted: one
rank left the loop or the script (a decision taken on one rank) while the others wait in a collective.

    meeting = Meeting(folder, tag, rank, world, progress); meeting.install()   # the Recorder's
    meeting.ended("returned")   # the script's end, published; wait_for_all() before leaving the group
    parted(states, me)          # the rule, on every rank's published state (also the launcher's, after a crash)

**What is published.** `{tag}-rank{r}.meet`, a small JSON file rewritten at each change: how many
collectives the rank has entered (`seq`), the one it is in (`in`: op, the script's line, seq, the
tensor's shape), its epoch and step (the last optimizer step and the script's line that made it), and
`ended` once its script has returned. The collectives are torch.distributed's (`all_reduce`,
`broadcast`, `barrier`, `all_gather`, ...: the outermost call, as the script makes it) and DDP's
gradient all-reduce, entered by a `loss.backward()` after a training forward of a DDP model that syncs.

**The rule** (`parted`, pure): a rank waiting in its collective number n has been left when another
rank has ended its script after fewer than n collectives, or waits in its own number n, a different
one (another op, or another shape). Both are evidence that the collective can never complete, not a
wait: rank 0 evaluating alone while the others wait in a barrier is no evidence (it has neither ended
nor entered another collective), and the check waits for it. The evidence must hold on two looks
SETTLE_S apart (a rank that has just passed a collective may not yet have said so).

**The watcher** (a daemon thread in each rank of world N) looks every POLL_S; on evidence it writes
`{tag}-parted.json` (the first rank to decide) and ends its rank with PARTED_EXIT: the elastic agent
then stops every rank, and the launcher reads the file (launch.py). The recorder's own end
(`wait_for_all`) waits on these files, not on a collective: it never blocks the rank that left.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time

import torch

from mgpu.errors import EXIT_RANK_PARTED

__all__ = ["Meeting", "parted", "read_states", "PARTED_EXIT", "WAITED", "DDP_ALL_REDUCE"]

PARTED_EXIT = EXIT_RANK_PARTED
POLL_S = 0.2
SETTLE_S = 0.6
DDP_ALL_REDUCE = "DDP's gradient all-reduce (in backward)"
# torch.distributed's collectives a script calls: each one a meeting of every rank of the group.
WAITED = ("all_reduce", "broadcast", "barrier", "all_gather", "all_gather_object", "broadcast_object_list",
          "reduce", "gather", "gather_object", "scatter", "scatter_object_list", "reduce_scatter",
          "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "monitored_barrier")
_SHAPED = ("all_reduce", "broadcast", "reduce")


def state_path(folder: str, tag: str, rank: int) -> str:
    return os.path.join(folder, f"{tag}-rank{rank}.meet")


def parted_path(folder: str, tag: str) -> str:
    return os.path.join(folder, f"{tag}-parted.json")


def read_states(folder: str, tag: str, world: int) -> list:
    """Every rank's published state (None where a rank has published none yet)."""
    out = []
    for r in range(world):
        try:
            with open(state_path(folder, tag, r)) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            out.append(None)
    return out


def parted(states: list, me: int) -> dict | None:
    """The evidence that rank `me`, waiting in a collective, has been left (the module docstring's rule):
    {"left": rank, "how": "ended" | "other", "waiting": me}; None without it."""
    mine = states[me] if me < len(states) else None
    if not mine or not mine.get("in"):
        return None
    n, op, shape = mine["in"]["seq"], mine["in"]["op"], mine["in"].get("shape")
    for r, s in enumerate(states):
        if r == me or not s:
            continue
        if s.get("ended") and s.get("seq", 0) < n:
            return {"left": r, "how": "ended", "waiting": me}
        other = s.get("in")
        if other and other["seq"] == n and (other["op"] != op or (
                shape is not None and other.get("shape") is not None and other["shape"] != shape)):
            left = r if _left(s, mine) else me
            return {"left": left, "how": "other", "waiting": me if left == r else r}
    return None


def _left(a: dict, b: dict) -> bool:
    """Of two ranks in other collectives at one count, rank a is the one that left the training loop: b waits in
    DDP's gradient all-reduce (the loop's own collective) and a does not; else a's training is behind b's
    (fewer epochs or steps; at a tie, a)."""
    in_loop = (a["in"]["op"] == DDP_ALL_REDUCE, b["in"]["op"] == DDP_ALL_REDUCE)
    if in_loop[0] != in_loop[1]:
        return in_loop[1]
    return (a.get("epoch") or 0, a.get("step") or 0) <= (b.get("epoch") or 0, b.get("step") or 0)


class Meeting:
    """The module docstring's published state and watcher, in one rank."""

    def __init__(self, folder: str, tag: str, rank: int, world: int, progress):
        self.folder, self.tag, self.rank, self.world = folder, tag, rank, world
        self.progress = progress          # () -> (epoch, step, the script's line of the last step)
        self.seq = 0
        self.inside: dict | None = None
        self.is_ended = False
        self.originals: dict = {}
        self.depth = threading.local()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    # -- publishing ------------------------------------------------------------------------------

    def publish(self) -> None:
        epoch, step, step_at = self.progress()
        state = {"rank": self.rank, "seq": self.seq, "in": self.inside, "ended": self.is_ended,
                 "epoch": epoch, "step": step, "step_at": step_at}
        path = state_path(self.folder, self.tag, self.rank)
        with self.lock:
            with open(path + ".tmp", "w") as f:
                json.dump(state, f)
            os.replace(path + ".tmp", path)
        self.state = state

    def enter(self, op: str, where: str, shape=None) -> None:
        self.seq += 1
        epoch, step, _ = self.progress()
        self.inside = {"op": op, "where": where, "seq": self.seq, "shape": shape, "epoch": epoch, "step": step}
        self.publish()

    def leave(self) -> None:
        self.inside = None
        self.publish()

    def ended(self) -> None:
        self.is_ended, self.inside = True, None
        self.publish()

    def wait_for_all(self) -> None:
        """Until every rank has ended its script (the recorder's own end: files, never a collective)."""
        while not all(s and s.get("ended") for s in read_states(self.folder, self.tag, self.world)):
            time.sleep(0.05)

    # -- torch.distributed's collectives -------------------------------------------------------------

    def install(self) -> None:
        import torch.distributed as dist

        if not dist.is_available() or self.world < 2:
            return
        for op in WAITED:
            original = getattr(dist, op, None)
            if original is not None and op not in self.originals:
                self.originals[op] = original
                setattr(dist, op, self._wrap(op, original))
        self.publish()
        self.thread = threading.Thread(target=self._watch, name="mgpu-meeting", daemon=True)
        self.thread.start()

    def uninstall(self) -> None:
        import torch.distributed as dist

        for op, original in self.originals.items():
            setattr(dist, op, original)
        self.originals = {}

    def _wrap(self, op: str, original):
        meeting = self

        @functools.wraps(original)
        def waited(*args, **kwargs):
            if getattr(meeting.depth, "value", 0):  # called by another collective (all_gather_object's all_gather)
                return original(*args, **kwargs)
            shape = None
            if op in _SHAPED:
                t = args[0] if args else kwargs.get("tensor")
                shape = list(t.shape) if isinstance(t, torch.Tensor) else None
            meeting.enter(op, script_line(sys._getframe(1)), shape)
            meeting.depth.value = 1
            try:
                out = original(*args, **kwargs)
            finally:
                meeting.depth.value = 0
            meeting.leave()
            return out
        return waited

    def backward(self, call):
        """A loss.backward() that runs DDP's gradient all-reduce: entered and left around `call`."""
        self.enter(DDP_ALL_REDUCE, script_line(sys._getframe(2)))
        out = call()
        self.leave()
        return out

    # -- the watcher ---------------------------------------------------------------------------------

    def _watch(self) -> None:
        seen = None
        while True:
            time.sleep(POLL_S)
            if self.inside is None:
                seen = None
                continue
            try:
                states = read_states(self.folder, self.tag, self.world)
                states[self.rank] = getattr(self, "state", None)
                evidence = parted(states, self.rank)
            except Exception:  # a state half written: look again
                continue
            if evidence is None:
                seen = None
                continue
            key = json.dumps([states[evidence["left"]], states[evidence["waiting"]]], sort_keys=True)
            if seen is None or seen[0] != key:
                seen = (key, time.time())
                continue
            if time.time() - seen[1] >= SETTLE_S:
                self._decide(evidence, states)

    def _decide(self, evidence: dict, states: list) -> None:
        record = {**evidence, "states": states}
        try:
            fd = os.open(parted_path(self.folder, self.tag), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
        except FileExistsError:
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(PARTED_EXIT)


def script_line(frame) -> str:
    """The script's own line that led here: the first frame outside torch and mgpu (epochs.made_at)."""
    from mgpu.check.script.inrank.epochs import made_at

    return made_at(frame)
