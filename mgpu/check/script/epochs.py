"""Under --whole-run, what one world's comparison compared in each epoch: world 1's epoch tags on its steps
(StepRecord.epoch, inrank/epochs.py), and the steps each check compared (compare.py's walk).

    per_epoch(walk.seen, ref_steps, walk.stopped)
    # [{"epoch": 1, "steps": "steps 1-4", "compared": ["the data against world 1", ...], "not_compared": [...]}]
"""

from __future__ import annotations

from mgpu.check.script.optimizer import steps_text

__all__ = ["per_epoch"]

_TENSORS = ("gradients", "updates", "weights")


def per_epoch(seen: dict, ref: list, stopped: dict) -> list[dict]:
    """--whole-run: each epoch's steps (world 1's epoch tags), the checks that compared any of them, and the
    checks that compared none of them (with why, where a group stopped; steps past the memory bound keep
    no gradients or weights)."""
    order = list(dict.fromkeys(r.epoch for r in ref))
    out = []
    for e in order:
        steps = [i + 1 for i, r in enumerate(ref) if r.epoch == e]
        light = [s for s in steps if ref[s - 1].light]
        mine = set(steps) | ({0} if 1 in steps else set())
        compared, missing = [], []
        for label, at in seen.items():
            kept = [s for s in at if s in mine and not (s in light and label.split()[0] in _TENSORS)]
            if kept:
                compared.append(label)
            elif any(at):  # a check of before step 1 only belongs to epoch 1
                missing.append(label)
        if light:
            missing.append(f"gradients, updates and weights of {steps_text(light)}: not kept (--whole-run keeps a "
                           "rank's tensors up to a memory bound; the steps after keep their data and settings)")
        out.append({"epoch": e, "steps": steps_text(steps), "compared": compared,
                    "not_compared": missing + [why for why in stopped.values() if why not in missing]})
    return out
