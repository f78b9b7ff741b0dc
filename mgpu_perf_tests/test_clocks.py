"""mgpu_perf/clocks.py: the GPUs' clocks in the machine record and the warning when they are not locked,
with a stand-in nvidia-smi (this machine has none; the H200 run is in docs/notes/gpu-runs.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgpu_perf import clocks

ROOT = Path(__file__).resolve().parents[1]


def fake_nvidia_smi(tmp_path, monkeypatch, output: str, code: int = 0):
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\ncat <<'END'\n{output}\nEND\nexit {code}\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")


def test_an_idle_gpu_below_its_maximum_clock_is_not_locked_and_warned_about(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, "0, NVIDIA H200, 345, 1980\n1, NVIDIA H200, 1980, 1980")
    gpus = clocks.gpu_clocks()
    assert gpus == [{"index": 0, "name": "NVIDIA H200", "sm_mhz": 345, "max_sm_mhz": 1980, "locked": False},
                    {"index": 1, "name": "NVIDIA H200", "sm_mhz": 1980, "max_sm_mhz": 1980, "locked": True}]
    warning = clocks.unlocked_warning(gpus)
    assert warning and "GPU 0 (NVIDIA H200) idles at 345 of 1980 MHz" in warning and "GPU 1" not in warning, warning
    assert clocks.unlocked_warning(gpus[1:]) is None


@pytest.mark.parametrize("output, code", [("garbage", 0), ("", 9), ("0, GPU, [N/A], [N/A]", 0)])
def test_clocks_that_cannot_be_read_are_unknown_never_an_error(tmp_path, monkeypatch, output, code):
    fake_nvidia_smi(tmp_path, monkeypatch, output, code)
    gpus = clocks.gpu_clocks()
    assert all(g["locked"] is None for g in gpus), gpus
    assert clocks.unlocked_warning(gpus) is None


def test_no_nvidia_smi_records_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert clocks.gpu_clocks() == []


def test_the_perf_run_records_the_clocks_and_warns_in_its_header(pytester, tmp_path, monkeypatch):
    """The perf suite's conftest on a tiny benchmark file (pytester), a stand-in GPU idling low."""
    fake_nvidia_smi(tmp_path, monkeypatch, "0, NVIDIA H200, 345, 1980")
    pytester.makeconftest("import sys; sys.path.insert(0, %r)\nfrom perf.conftest import *  # noqa\n" % str(ROOT))
    pytester.makepyfile(test_tiny="def test_one(benchmark):\n    assert benchmark(sum, [1, 2]) == 3\n")
    quick = ("--benchmark-max-time", "0.001", "--benchmark-min-rounds", "1")  # a second of timing each otherwise
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--benchmark-json", str(tmp_path / "b.json"), *quick,
                                           "--perf-out", str(tmp_path / "out"))
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*GPU clocks at start: 0 NVIDIA H200 345/1980 MHz (not locked)*",
                                 "WARNING: GPU clocks are not locked*"])
    quiet = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", "--perf-out", str(tmp_path / "out"), *quick)
    assert quiet.ret == 0 and "WARNING: GPU clocks are not locked" in quiet.stdout.str(), \
        "with -q (no header) the warning must still be printed: " + quiet.stdout.str()
    record = json.loads((tmp_path / "b.json").read_text())["machine_info"]["gpu_clocks"]
    assert record == [{"index": 0, "name": "NVIDIA H200", "max_sm_mhz": 1980, "locked": False}]

