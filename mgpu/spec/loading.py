"""Specs from what a user names: `MODULE:FUNCTION` (a module, or a .py file), an image classifier
(`image_spec`, `--input-shape`, `--classes`), or mgpu's own networks (`builtin_spec`)."""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from mgpu.errors import SpecError, one_line
from mgpu.spec.contract import ModelSpec, select_output
from mgpu.spec.validation import describe_output, forward_check
from mgpu.validators import positive_int


# -- specs for images --------------------------------------------------------------------------------

def parse_input_shape(text: str | Sequence[int]) -> tuple[int, int, int]:
    """'C,H,W' (or a sequence of three ints) as a tuple of three positive integers."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    try:
        shape = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        shape = ()
    if len(shape) != 3 or any(s < 1 for s in shape) or (isinstance(text, str) and not all(p.strip().isdigit() for p in parts)):
        raise SpecError(f"input shape must be C,H,W: three positive integers such as 3,32,32, got {text!r}")
    return shape


@dataclass(frozen=True)
class ImageBatches:
    """draw(n, generator) for image classifiers: uniform [0, 1) images and uniform labels."""

    input_shape: tuple[int, int, int]
    classes: int

    def __call__(self, n: int, g: torch.Generator):
        return torch.rand((n, *self.input_shape), generator=g), torch.randint(0, self.classes, (n,), generator=g)


def image_spec(build: Callable[[], nn.Module], input_shape: Sequence[int], classes: int, name: str = "model",
               **kwargs) -> ModelSpec:
    """A spec for a classifier of images: batches of uniform [0, 1) images of `input_shape`
    (C, H, W) with labels 0..classes-1, cross-entropy."""
    shape = parse_input_shape(input_shape)
    positive_int(classes, "classes", error=SpecError)
    return ModelSpec(build=build, draw=ImageBatches(shape, classes), name=name,
                     options={"input_shape": ",".join(map(str, shape)), "classes": classes}, **kwargs)


def builtin_spec(name: str, width: int = 64, num_classes: int = 10) -> ModelSpec:
    """mgpu's own networks as specs: `resnet18` (at `width`) and `lenet`, on 1x28x28 images."""
    from mgpu.models import MODEL_NAMES, build_model

    if name not in MODEL_NAMES:
        raise SpecError(f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)}, or give MODULE:FUNCTION")
    return image_spec(functools.partial(build_model, name, width=width, num_classes=num_classes), (1, 28, 28),
                      num_classes, name=name if name != "resnet18" else f"resnet18 (width {width})")


# -- MODULE:FUNCTION --------------------------------------------------------------------------------

_FILE_IMPORT = threading.RLock()


def _import_file(module_part: str):
    path = Path(module_part)
    if not path.is_file():
        raise SpecError(f"cannot import {module_part}: no such file")
    name = "mgpu_user_" + "".join(c if c.isalnum() else "_" for c in str(path.resolve()))
    if name in sys.modules:
        return sys.modules[name]
    if str(path.resolve().parent) not in sys.path:
        sys.path.insert(0, str(path.resolve().parent))  # so that the file's own imports of its neighbours work
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise SpecError(f"cannot import {module_part}: not a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[name]
        if isinstance(e, (KeyboardInterrupt, SystemExit)) and not isinstance(e, SystemExit):
            raise
        raise SpecError(f"cannot import {module_part}: {one_line(e, with_type=True)}") from None
    return module


def _import(module_part: str):
    if module_part.endswith(".py") or os.sep in module_part or "/" in module_part:
        with _FILE_IMPORT:  # a file is registered in sys.modules before it has run: one thread at a time
            return _import_file(module_part)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # `mgpu check mymodels:net` finds ./mymodels.py, as `python -m` would
    try:
        return importlib.import_module(module_part)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        raise SpecError(f"cannot import {module_part}: {one_line(e, with_type=True)}") from None


def load_spec(target: str, input_shape: str | Sequence[int] | None = None, classes: int | None = None) -> ModelSpec:
    """The ModelSpec behind `MODULE:FUNCTION`: the function's ModelSpec, or an image spec around
    the nn.Module it returns (`input_shape` C,H,W needed; `classes` read off the output if not
    given). Every problem is a SpecError naming it."""
    if not isinstance(target, str) or ":" not in target or target.startswith(":") or target.endswith(":"):
        raise SpecError(f"model must be MODULE:FUNCTION (a module name or a .py file, then the function), got {target!r}")
    module_part, function_name = target.rsplit(":", 1)
    module = _import(module_part)
    fn = getattr(module, function_name, None)
    if fn is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))[:12]
        raise SpecError(f"{module_part} has no function {function_name!r}"
                        + (f" (it has: {', '.join(public)})" if public else ""))
    if not callable(fn):
        raise SpecError(f"{target} is a {type(fn).__name__}, not a function")
    result = _call(fn, target)
    options = {}
    if input_shape is not None:
        options["input_shape"] = ",".join(map(str, parse_input_shape(input_shape)))
    if classes is not None:
        positive_int(classes, "classes", error=SpecError)
        options["classes"] = classes
    if isinstance(result, ModelSpec):
        if options:
            raise SpecError(f"{target} returns a ModelSpec, which says how to draw its batches itself: "
                            "leave out --input-shape and --classes")
        return replace(result, source=target, options={}, name=result.name if result.name != "model" else target)
    if isinstance(result, nn.Module):
        if input_shape is None:
            raise SpecError(f"{target} returns an nn.Module ({type(result).__name__}): give the shape of one input "
                            "image with --input-shape C,H,W (and --classes N), or return an mgpu.ModelSpec")
        shape = parse_input_shape(input_shape)
        if classes is None:
            classes = _classes_of(result, shape, target)
            options["classes"] = classes
        first = [result]

        def build() -> nn.Module:
            # The object already built serves the first call; later calls build anew under the caller's seed.
            return first.pop() if first else _call(fn, target)

        spec = image_spec(build, shape, classes, name=target, source=target)
        return replace(spec, options=options)
    raise SpecError(f"{target} returned {type(result).__name__}: it must return an nn.Module or an mgpu.ModelSpec")


def _call(fn, target: str):
    try:
        return fn()
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        raise SpecError(f"{target} raised {one_line(e, with_type=True)}") from None


def _classes_of(model: nn.Module, shape: tuple[int, int, int], target: str) -> int:
    out = forward_check(copy.deepcopy(model).eval(), (torch.zeros(2, *shape),), f"{target} on 2x{'x'.join(map(str, shape))} images")
    try:
        out = select_output(out)
    except SpecError:
        pass  # named below, as any output that is not (batch, classes) scores
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 2:
        raise SpecError(f"{target} gives {describe_output(out)} for 2 images of {'x'.join(map(str, shape))}: "
                        "an image classifier must give (batch, classes) scores")
    return int(out.shape[1])
