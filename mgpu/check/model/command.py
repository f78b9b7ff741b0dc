"""`mgpu check`'s command line: its arguments, its options read once into CheckOptions, and the check
core's command ending (mgpu/check/command.py: one-line errors, Ctrl-C, --json, --strict).

    python -m mgpu check examples/tiny_lm.py:spec --json check.json
    python -m mgpu check torchvision.models:resnet18 --input-shape 3,32,32 --classes 10
"""

from __future__ import annotations

import sys

from mgpu.check.command import add_report_arguments, run_check_command
from mgpu.config import AMP_MODES, CHECK_STRATEGIES, DEVICE_KINDS, MODEL_NAMES, CheckOptions
from mgpu.errors import ConfigError, one_line
from mgpu.validators import choices_metavar, float_or_text, int_or_text

__all__ = ["add_arguments", "run_main"]


def add_arguments(p) -> None:
    d = CheckOptions()
    p.add_argument("model", metavar="MODULE:FUNCTION",
                   help="a function (in a module, or a .py file) returning an nn.Module or an mgpu.ModelSpec; "
                        "or resnet18 / lenet")
    p.add_argument("--input-shape", default=None, metavar="C,H,W", help="one input image, for a function returning an nn.Module")
    p.add_argument("--classes", type=int_or_text, default=None, help="class count (default: read off the model's output)")
    p.add_argument("--strategies", default=",".join(d.strategies), metavar="S[,S...]",
                   help=f"strategies to check, from {','.join(CHECK_STRATEGIES)}")
    p.add_argument("--devices", default=",".join(map(str, d.devices)), metavar="N[,N...]",
                   help="device counts (emulated on the CPU when GPUs are short)")
    p.add_argument("--device", metavar=choices_metavar(DEVICE_KINDS), default=d.device,
                   help="auto: GPUs when there are enough for a device count, else the CPU; cpu: every run on the CPU; "
                        "cuda: GPUs or an error")
    p.add_argument("--batch-size", type=int_or_text, default=d.batch_size, help="global batch size of each step")
    p.add_argument("--steps", type=int_or_text, default=d.steps, help="optimizer steps per run")
    p.add_argument("--seed", type=int_or_text, default=d.seed)
    p.add_argument("--accumulate", type=int_or_text, default=d.accumulate, metavar="K",
                   help="micro-steps of the gradient accumulation check")
    p.add_argument("--step-timeout", type=float_or_text, default=d.step_timeout, metavar="S",
                   help="seconds a step may take before the model counts as hanging")
    p.add_argument("--amp", metavar=choices_metavar(AMP_MODES), default=d.amp,
                   help="bf16: every run's forward and loss under bfloat16 autocast, as train --amp bf16 runs them; "
                        "the allowance comes from the single-device bf16 step (docs/design/check-tolerance.md)")
    p.add_argument("--compile", action="store_true",
                   help="every strategy's model under torch.compile (inductor), against the eager single-device "
                        "reference; a compiled run that diverges from eager fails with its first divergence")
    add_report_arguments(p, json_help="write one record per check here",
                         strict_help="findings fail the check too (exit 1)")


def run_main(parser, args) -> int:
    """`python -m mgpu check`: the table on stdout, a progress line per check on stderr, --json;
    the ending (exit codes, one-line errors, Ctrl-C) is the check core's (mgpu/check/command.py)."""
    def int_list(text: str, what: str) -> tuple[int, ...]:
        try:
            return tuple(int(p) for p in text.split(","))
        except ValueError:
            parser.error(f"{what} must be comma-separated integers such as 2,3, got {text!r}")

    try:
        options = CheckOptions(strategies=tuple(p.strip() for p in args.strategies.split(",") if p.strip()),
                               devices=int_list(args.devices, "devices"), batch_size=args.batch_size,
                               steps=args.steps, seed=args.seed, accumulate=args.accumulate,
                               step_timeout=args.step_timeout, device=args.device, amp=args.amp,
                               compile=args.compile).validate()
    except ConfigError as e:
        parser.error(one_line(e))
    from mgpu.check.model.check import run_check
    from mgpu.spec import builtin_spec, load_spec

    def run():
        if ":" not in args.model and args.input_shape is None and args.classes is None and args.model in MODEL_NAMES:
            spec = builtin_spec(args.model, width=16 if args.model == "resnet18" else 64)
        else:
            spec = load_spec(args.model, input_shape=args.input_shape, classes=args.classes)
        return run_check(spec, options, progress=lambda line: print(line, file=sys.stderr, flush=True))

    return run_check_command(parser, args, run)
