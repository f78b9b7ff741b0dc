"""The `mgpu_gate` marker: what turns a test into a gated workload, read into a workload spec.

    @pytest.mark.mgpu_gate(model="mymodel.py:spec", strategy="ddp", devices=2, batch=32)
    def test_step_time(mgpu_workload, benchmark):
        benchmark(mgpu_workload.op)          # a normal run: pytest-benchmark times it

Under `pytest --ab-baseline REF` the test's body does not run: the gate times the marker's workload
in both arms instead (docs/guide/gate.md). mgpu's own suite passes a whole spec: `mgpu_gate({"kind": ...})`.
Cheap on purpose (no torch): the plugin reads markers while collecting.
"""

from __future__ import annotations

__all__ = ["MARKER", "MARKER_HELP", "marker_spec", "model_step_spec", "keep_gated"]

MARKER = "mgpu_gate"
MARKER_HELP = (f"{MARKER}(model='MODULE:FUNCTION', strategy='single', devices=1, batch=32): a gated workload; "
               "under --ab-baseline the gate times it in both arms instead of running the test (docs/guide/gate.md)")
KINDS = ("train-step", "train-epoch", "matmul", "model-step")


def model_step_spec(model: str, strategy: str = "single", devices: int = 1, batch: int = 32,
                    input_shape: str | None = None, classes: int | None = None,
                    threads_per_device: int | None = None) -> dict:
    """The spec of one training step of a user's model (`MODULE:FUNCTION`, mgpu's model contract)
    under `strategy` on `devices` devices, `batch` examples per device. ValueError naming a bad field."""
    from mgpu.names import STRATEGY_NAMES
    from mgpu.validators import positive_int  # no torch

    if not isinstance(model, str) or ":" not in model.strip(":"):
        raise ValueError(f"model must be 'MODULE:FUNCTION' (a module or a .py file, then the function), got {model!r}")
    if strategy not in STRATEGY_NAMES:
        raise ValueError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGY_NAMES)}")
    for name, value in (("devices", devices), ("batch", batch)):
        positive_int(value, name, error=ValueError)
    if threads_per_device is not None:
        positive_int(threads_per_device, "threads_per_device", error=ValueError)
    spec = {"kind": "model-step", "model": model, "strategy": strategy, "devices": devices, "batch": batch}
    if input_shape is not None:
        spec["input_shape"] = input_shape if isinstance(input_shape, str) else ",".join(map(str, input_shape))
    if classes is not None:
        spec["classes"] = classes
    if threads_per_device is not None:
        spec["threads_per_device"] = threads_per_device
    return spec


def marker_spec(marker) -> dict:
    """The workload spec of an `mgpu_gate` marker: keyword fields of a model step, or one whole spec dict."""
    if marker.args:
        if len(marker.args) != 1 or marker.kwargs or not isinstance(marker.args[0], dict):
            raise ValueError(f"{MARKER} takes keyword fields (model=, strategy=, devices=, batch=) or one spec dict")
        spec = dict(marker.args[0])
        if spec.get("kind") not in KINDS:
            raise ValueError(f"{MARKER}: unknown workload kind {spec.get('kind')!r}: one of {', '.join(KINDS)}")
        return spec
    if "model" not in marker.kwargs:
        raise ValueError(f"{MARKER} needs model='MODULE:FUNCTION' (and strategy=, devices=, batch=)")
    try:
        return model_step_spec(**marker.kwargs)
    except TypeError as e:  # a field that does not exist
        raise ValueError(f"{MARKER}: {e}".replace("model_step_spec()", "the marker")) from None


def keep_gated(config, items: list) -> dict:
    """Collection for a run of the gated workloads alone (the A/B gate, the counted baseline): the
    items marked `mgpu_gate` kept, the others deselected (reported as pytest reports a deselection);
    returns nodeid -> workload spec. A marker that reads wrong is a pytest.UsageError naming the test."""
    import pytest

    gated = [item for item in items if item.get_closest_marker(MARKER)]
    specs = {}
    for item in gated:
        try:
            specs[item.nodeid] = marker_spec(item.get_closest_marker(MARKER))
        except ValueError as e:
            raise pytest.UsageError(f"{item.nodeid}: {e}") from None
    deselected = [item for item in items if not item.get_closest_marker(MARKER)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = gated
    return specs
