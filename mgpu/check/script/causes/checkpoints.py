"""Causes of the checkpoint family (--whole-run): `torch.save` / torch.distributed.checkpoint calls per rank
(SaveCall, recorded by inrank/evaluation.py). More than one rank writing one path with torch.save is a failure
(DCP's per-rank shards in one folder are its design, not one); a run whose optimizer holds state (momentum,
Adam's moments) while it saves the model's weights and never that state is a finding. Saves to a buffer
(io.BytesIO) name no path; a model exported beside a separate optimizer file saves both.

    shared_paths(run)          # ["at world 2, ranks 0 and 1 each torch.save to checkpoint.pt ..."]
    optimizer_unsaved(run)     # "the script saves the model's weights (train.py:60) but never ..." or None
"""

from __future__ import annotations

import re

__all__ = ["shared_paths", "optimizer_unsaved", "shown_path"]

_RUN_FOLDER = re.compile(r"^.*/mgpu-script-[^/]+/[^/]+-cwd/")


def shown_path(path: str) -> str:
    """A path as the script named it: relative to its run's working folder (apart.py) where inside it."""
    return _RUN_FOLDER.sub("", path)


def shared_paths(run) -> list[str]:
    """Each path that more than one rank of the run wrote with torch.save."""
    writers: dict = {}
    for rec in run.ranks:
        for s in rec.saves:
            if s.how == "torch.save" and s.path:
                writers.setdefault(s.path, {}).setdefault(rec.rank, s.where)
    out = []
    for path, ranks in writers.items():
        if len(ranks) < 2:
            continue
        who = sorted(ranks)
        names = ", ".join(map(str, who[:-1])) + f" and {who[-1]}"
        out.append(f"at world {run.world}, ranks {names} each torch.save to {shown_path(path)} "
                   f"({', '.join(sorted(set(ranks.values())))}): writes of one file from several processes race "
                   "(a torn file, or one rank's state over another's); save on rank 0 alone (if dist.get_rank() == "
                   "0: torch.save(...)), then dist.barrier() before any rank reads it; or put the rank in the name "
                   "of each rank's own file")
    return out


def optimizer_unsaved(run) -> str | None:
    """The model's weights saved, an optimizer holding state, and no save holding an optimizer's state."""
    saves = [s for rec in run.ranks for s in rec.saves]
    weights = [s for s in saves if s.weights]
    stateful = sorted({name for rec in run.ranks for name in rec.optimizer_state})
    if not weights or not stateful or any(s.optimizer for s in saves):
        return None
    return (f"the script saves the model's weights ({weights[0].how} at {weights[0].where}, to "
            f"{shown_path(weights[0].path) or 'a buffer'}) but never the state of its optimizer ({', '.join(stateful)}, "
            "which holds momentum or moments): a run resumed from the checkpoint restarts the optimizer from "
            "nothing; save optimizer.state_dict() too (in the checkpoint, or a file of its own)")
