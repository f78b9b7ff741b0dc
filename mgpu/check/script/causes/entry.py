"""Causes of where a divergence enters the model (locate.py traces world 1 and world N again and
compares each module per example; these say what its evidence means): a module's own forward, the
code that calls a module, the loss's reduction (told by the gradient at the model's output, c x world
1's per example, against the optimizer's factor f), what happens after the backward, the optimizer's
step. Each returns (where, words): `where` is the JSON's `entered.where`, the words are said after
what the modules showed; `entered` makes the whole record from the figures traced.py took (EntryFigures).

    record = entered(figures)     # {"world": 2, ..., "where": "loss", "sentence": "every module's output agrees ..."}
"""

from __future__ import annotations

from mgpu.check.script.tensors import FACTOR_AGREE

__all__ = ["entered", "output_gradient", "after_backward", "output_gradient_missing", "output_gradient_agrees", "output_gradient_factor",
           "rank_factors", "forward_factors", "no_output_factor", "module_output", "module_input"]


def _close(x: float | None, y: float) -> bool:
    return x is not None and abs(x - y) <= FACTOR_AGREE * abs(y)


def after_backward(c: float, f: float | None, n: int, kind: str) -> tuple[str, str]:
    """(where, words) from the output gradient's factor c and the optimizer's f."""
    if kind != "gradient":
        return "optimizer", ("; the optimizer's gradients agree with world 1's: it enters in the optimizer's step "
                             "(its settings, state or schedule)")
    if f is None:
        return "after-backward", ("; the optimizer's gradients differ from world 1's by no common factor: it enters "
                                  "after the backward reached the output (a gradient clipped, scaled or reduced per "
                                  "parameter)")
    if _close(f, 1.0) and (_close(c, n) or _close(c, 1.0)):
        return "backward", (f"; {'averaged' if _close(c, n) else 'summed'} over the {n} ranks, that makes the optimizer's "
                            f"gradients {f:.3f} x world 1's: the loss weighs each example as world 1's does (its "
                            "reduction is right); the difference is smaller than any factor and is made in the "
                            "backward's sums over the examples (another summation order) or by a small weight per rank")
    if _close(f, c / n):
        return "loss", (f"; averaged over the {n} ranks (as DDP does), that makes the optimizer's gradients {f:.3f} x "
                        f"world 1's: the loss's reduction (each rank's loss must weigh its examples {n} x as world 1's "
                        "does, as a mean over its own shard does)")
    if _close(f, c):
        return "loss", (f"; summed over the ranks, that makes the optimizer's gradients {f:.3f} x world 1's: the loss's "
                        "reduction (where the ranks' gradients are summed, each rank's loss must weigh its examples as "
                        "world 1's does)")
    return "after-backward", (f"; the optimizer's gradients are {f:.3f} x world 1's, which no average or sum over the "
                              "ranks makes of it: it enters after the backward (the gradients' reduction over the "
                              "ranks, clipping, scaling)")


def output_gradient_missing(truncated: bool) -> tuple[str, str]:
    """No gradient at the output to compare: the trace's budget was spent (truncated), or none was recorded."""
    if truncated:
        return "unknown", ("; the gradient at the output was not kept: the trace had reached its TRACE_NUMEL "
                           "elements a rank before the backward (a model whose outputs are that large)")
    return "unknown", "; the gradient at the output was not recorded (no floating output that needs one)"


def output_gradient_agrees(error: float, allowed: float, f: float | None, n: int, kind: str) -> tuple[str, str]:
    """The gradient at the output is world 1's per example (error within allowed): after_backward's, with c = 1."""
    where, words = after_backward(1.0, f, n, kind)
    return where, (f"; the gradient at the output is world 1's per example (error {error:.1e} of {allowed:.1e} "
                   "allowed)") + words


def output_gradient_factor(c: float, f: float | None, n: int, kind: str) -> tuple[str, str]:
    """The gradient at the output is c x world 1's per example."""
    where, words = after_backward(c, f, n, kind)
    return where, f"; the gradient at the output is {c:.3f} x world 1's per example" + words


def rank_factors(ranks: list, factors: list) -> tuple[str, str]:
    """The gradient at the output has a factor of its own on each rank: the loss normalised per rank."""
    each = ", ".join(f"{c:.3f} x on rank {r}" for r, c in zip(ranks, factors))
    return "loss", (f"; the gradient at the output is {each} (of world 1's, per example): the loss is "
                    "normalised per rank (each rank's own count of tokens or examples): the loss's reduction")


def forward_factors(factors: list) -> tuple[str, str]:
    """A factor of its own per forward (micro-batch) and rank: the loss weighted per micro-batch."""
    each = ", ".join(f"{c:.3f} x" for c in factors)
    return "loss", (f"; the gradient at the output has a factor of its own per forward (micro-batch) and rank: "
                    f"{each} (of world 1's, per example; rank by rank, forward by forward): the loss is weighted per "
                    "micro-batch (each its own mean): the loss's reduction")


def no_output_factor(error: float, allowed: float) -> tuple[str, str]:
    """The gradient at the output differs by no factor, even per rank."""
    return "output-gradient", (f"; the gradient at the output differs from world 1's by no factor, even per rank "
                               f"(error {error:.2e}, allowed {allowed:.2e}): the loss weighs examples "
                               "differently at this world size")


def module_output(module: str, has_children: bool, figures: str) -> tuple[str, str]:
    """The first difference is a module's output (module: its label), its input (and submodules) agreeing."""
    inside = "its input and its submodules' outputs agreeing" if has_children else "its input agreeing"
    return "module-output", (f"the first module whose output differs: {module}, {inside} ({figures}): it enters "
                             "in its own forward")


def module_input(module: str, caller: str, figures: str) -> tuple[str, str]:
    """The first difference is a module's input, every module before it agreeing: its caller's code."""
    return "module-input", (f"the first module whose input differs: {module}, every module before it agreeing "
                            f"({figures}): it enters in the forward of {caller}, in its own code before that call")


def output_gradient(g, f: float | None, n: int, kind: str, truncated: bool = False) -> tuple[str, str, dict]:
    """(where, words, record) for the gradient at the model's output, where every module agrees (g: traced.py's
    OutputGradient, None where none was kept): its factors per example, per rank, per forward; f the optimizer's."""
    if g is None:
        return (*output_gradient_missing(truncated), {})
    if g.error <= g.allowed:
        return (*output_gradient_agrees(g.error, g.allowed, f, n, kind), {"output_gradient_factor": 1.0})
    if g.factor is not None:
        return (*output_gradient_factor(g.factor, f, n, kind), {"output_gradient_factor": g.factor})
    if g.rank_factors is not None:
        return (*rank_factors(g.ranks, g.rank_factors), {"rank_factors": g.rank_factors})
    if g.forward_factors is not None:
        return (*forward_factors(g.forward_factors), {"forward_factors": g.forward_factors})
    return (*no_output_factor(g.error, g.allowed), {})


def _label(module: str, kind: str) -> str:
    return f"`{module}` ({kind})" if module else f"the model ({kind})"


def entered(figures) -> dict:
    """The record of where a divergence enters (WorldComparison.entered, less its step), from the figures of the
    traced step (traced.EntryFigures): the first module that differs, else what the gradient at the output shows."""
    record = {"world": figures.world, "modules_compared": figures.modules_compared, "truncated": figures.truncated,
              "gradient_factor": figures.gradient_factor}
    first = figures.first
    if first is not None:
        numbers = f"error {first.error:.2e}, allowed {first.allowed:.2e}, on rank {first.rank}"
        if first.event == "output":
            where, sentence = module_output(_label(first.module, first.module_type), first.has_children, numbers)
        else:
            caller = _label(*first.caller) if first.caller is not None else "the code that calls the model"
            where, sentence = module_input(_label(first.module, first.module_type), caller, numbers)
        record.update(where=where, module=first.module, module_type=first.module_type, error=first.error,
                      allowed=first.allowed, sentence=sentence)
        return record
    agree = figures.agree
    head = (f"every module's output agrees per example (largest error {agree[0]:.1e} of {agree[1]:.1e} allowed, "
            f"{agree[2]} modules)" if agree else "no module output was compared per example")
    where, words, extra = output_gradient(figures.output_gradient, figures.gradient_factor, figures.world,
                                          figures.kind, figures.truncated)
    record.update(extra, where=where)
    record["sentence"] = head + words + (" (the trace was cut short: TRACE_NUMEL)" if figures.truncated else "")
    return record
