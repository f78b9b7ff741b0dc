"""Bad input, everywhere: each wrong way to call the CLI or the API gets one clear line.

CLI: one line on stderr, `mgpu: error: ...`, exit code 2, no traceback. API: a specific
MgpuError subclass (which also derives from the builtin a caller expects, e.g. ValueError).
A mistake both can make gets the same message from both: the CLI only turns text into numbers,
and every rule (and its message) is TrainConfig.validate's.
docs/guide/failures.md lists every case of `CASES` and `API_CASES` by id; a test checks it does.

Every case fails before training starts; the base arguments make a run tiny should one slip through.
"""

from __future__ import annotations

import math
import re
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch

from conftest import gpu_count
from correctness.helpers import write_idx
from correctness.processes import run_to_end
from mgpu import checkpoint
from mgpu.cli import build_parser, config_or_exit, main
from mgpu.comm import split_batch
from mgpu.config import TrainConfig
from mgpu.data import BatchLoader, ImageDataset
from mgpu.devices import devices
from mgpu.errors import (CheckpointError, ConfigError, DataError, DataNotFoundError, DeviceError, LaunchError,
                         MgpuError, OutputDirError, ShapeError)
from mgpu.launch import spawn
from mgpu.run import train

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "guide" / "failures.md"
BASE_ARGS = ["--model", "lenet", "--epochs", "1", "--batch-size", "64", "--train-size", "128", "--test-size", "64",
             "--no-progress"]
BASE_API = dict(model="lenet", epochs=1, batch_size=64, train_size=128, test_size=64, progress=False)


# -- fixtures the cases need: files on disk ---------------------------------------------------------

def _fashion_files(tmp: Path, n_train: int = 100, n_test: int = 20) -> Path:
    raw = tmp / "fm" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", torch.zeros(n, 28, 28, dtype=torch.uint8))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", torch.zeros(n, dtype=torch.uint8))
    return tmp / "fm"


def _corrupt_fashion_files(tmp: Path) -> Path:
    root = _fashion_files(tmp)
    images = root / "FashionMNIST" / "raw" / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:1000])  # a download cut short
    return root


def _a_file(tmp: Path) -> Path:
    (tmp / "a-file").write_text("not a folder")
    return tmp / "a-file"


def _corrupt_checkpoint(tmp: Path) -> Path:
    (tmp / "ckpt").mkdir()
    (tmp / "ckpt" / checkpoint.CHECKPOINT_NAME).write_bytes(b"PK\x03\x04 half a checkpoint")
    return tmp / "ckpt"


def _checkpoint_of(tmp: Path, **settings) -> Path:
    cfg = TrainConfig(**{**BASE_API, **settings})
    checkpoint.save(tmp / "ckpt", cfg=cfg, epoch=1, model_state={}, optimizer_state={}, history=[])
    return tmp / "ckpt"


@pytest.fixture
def busy_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


# -- the cases --------------------------------------------------------------------------------------

@dataclass
class Case:
    id: str
    argv: list[str]             # CLI arguments after `train` and BASE_ARGS; "{tmp}", "{port}" are filled in
    message: str                # regex the one-line error must match, from the CLI and the API alike
    api: dict | None = None     # the same mistake through train(TrainConfig(**BASE_API, **api)); None: CLI only
    error: type = ConfigError   # what the API raises
    setup: Callable[[Path], object] | None = None  # makes the files the case needs in {tmp}
    needs: Callable[[], str | None] = field(default=lambda: None)  # a reason to skip, or None


def _no_gpus(n: int):
    return lambda: f"needs fewer than {n} CUDA devices (found {gpu_count()})" if gpu_count() >= n else None


CASES = [
    # names
    Case("unknown-strategy", ["--strategy", "zero3"],
         r"unknown strategy 'zero3': choose one of single, manual, dataparallel, ddp, fsdp$", dict(strategy="zero3")),
    Case("unknown-shard", ["--strategy", "fsdp", "--shard", "layer"], r"unknown shard 'layer': choose one of block, model$",
         dict(strategy="fsdp", shard="layer")),
    Case("unknown-reshard", ["--strategy", "fsdp", "--reshard-after-forward", "yes"],
         r"unknown reshard_after_forward 'yes': choose one of on, off$",
         dict(strategy="fsdp", reshard_after_forward="yes")),
    Case("shard-without-fsdp", ["--strategy", "ddp", "--shard", "model"],
         r"shard \(--shard\) applies to the fsdp strategy only, not 'ddp'$", dict(strategy="ddp", shard="model")),
    Case("reshard-without-fsdp", ["--reshard-after-forward", "off"],
         r"reshard_after_forward \(--reshard-after-forward\) applies to the fsdp strategy only, not 'single'$",
         dict(reshard_after_forward="off")),
    Case("sync-bn-with-fsdp", ["--strategy", "fsdp", "--devices", "2", "--sync-bn"],
         r"sync_bn \(--sync-bn\) is not supported with the fsdp strategy", dict(strategy="fsdp", devices=2, sync_bn=True)),
    Case("unknown-model", ["--model", "vgg16"], r"unknown model 'vgg16': choose one of resnet18, lenet",
         dict(model="vgg16")),
    Case("unknown-data", ["--data", "cifar10"], r"unknown data 'cifar10': choose one of synthetic, fashion-mnist",
         dict(data="cifar10")),
    Case("unknown-amp", ["--amp", "fp16"], r"unknown amp 'fp16': choose one of off, bf16$", dict(amp="fp16")),
    Case("unknown-device", ["--device", "gpu"], r"unknown device 'gpu': choose one of auto, cpu, cuda$", dict(device="gpu")),
    Case("device-cpu-and-require-gpus", ["--device", "cpu", "--require-gpus"],
         r"require_gpus \(--require-gpus\) and device cpu \(--device cpu\) contradict each other: give one$",
         dict(device="cpu", require_gpus=True)),
    Case("unknown-option", ["--epoks", "3"], r"unrecognized arguments: --epoks 3"),
    Case("missing-command", [], r"the following arguments are required: command"),
    # numbers: wrong type or range of every numeric option
    Case("epochs-zero", ["--epochs", "0"], r"epochs must be a positive integer, got 0$", dict(epochs=0)),
    Case("epochs-negative", ["--epochs", "-3"], r"epochs must be a positive integer, got -3$", dict(epochs=-3)),
    Case("epochs-not-integer", ["--epochs", "2.5"], r"epochs must be a positive integer, got 2\.5$", dict(epochs=2.5)),
    Case("batch-size-zero", ["--batch-size", "0"], r"batch size must be a positive integer, got 0$", dict(batch_size=0)),
    Case("batch-size-text", ["--batch-size", "lots"], r"batch size must be a positive integer, got 'lots'$",
         dict(batch_size="lots")),
    Case("lr-zero", ["--lr", "0"], r"lr must be a finite number > 0, got 0\.0$", dict(lr=0.0)),
    Case("lr-negative", ["--lr", "-0.1"], r"lr must be a finite number > 0, got -0\.1$", dict(lr=-0.1)),
    Case("lr-nan", ["--lr", "nan"], r"lr must be a finite number > 0, got nan$", dict(lr=math.nan)),
    Case("lr-inf", ["--lr", "inf"], r"lr must be a finite number > 0, got inf$", dict(lr=math.inf)),
    Case("lr-text", ["--lr", "fast"], r"lr must be a finite number > 0, got 'fast'$", dict(lr="fast")),
    Case("devices-zero", ["--devices", "0"], r"devices must be a positive integer, got 0$", dict(devices=0)),
    Case("devices-negative", ["--devices", "-2"], r"devices must be a positive integer, got -2$", dict(devices=-2)),
    Case("momentum-one", ["--momentum", "1"], r"momentum must be below 1, got 1\.0$", dict(momentum=1.0)),
    Case("weight-decay-negative", ["--weight-decay", "-0.01"], r"weight decay must be a finite number >= 0, got -0\.01$",
         dict(weight_decay=-0.01)),
    Case("timeout-zero", ["--timeout", "0"], r"timeout must be a finite number > 0, got 0\.0$", dict(timeout=0.0)),
    Case("seed-negative", ["--seed", "-1"], r"seed must be a non-negative integer, got -1$", dict(seed=-1)),
    Case("width-zero", ["--width", "0"], r"width must be a positive integer, got 0$", dict(width=0)),
    Case("resize-zero", ["--resize", "0"], r"resize must be a positive integer, got 0$", dict(resize=0)),
    Case("train-size-zero", ["--train-size", "0"], r"train size must be a positive integer, got 0$", dict(train_size=0)),
    Case("port-out-of-range", ["--port", "70000"], r"port must be an integer in 1\.\.65535, got 70000$",
         dict(port=70000)),
    # settings that contradict each other
    Case("batch-smaller-than-devices", ["--strategy", "manual", "--devices", "4", "--batch-size", "2"],
         r"batch size 2 is smaller than the 4 devices", dict(strategy="manual", devices=4, batch_size=2)),
    Case("train-size-below-one-batch", ["--train-size", "32"],
         r"train size 32 is smaller than one global batch of 64", dict(train_size=32)),
    Case("image-shape-wrong-for-model", ["--resize", "32"], r"model lenet cannot take 1x32x32 images \(from --resize 32\)",
         dict(resize=32), error=ShapeError),
    Case("sync-bn-without-ddp", ["--sync-bn"], r"sync_bn \(--sync-bn\) applies to the ddp strategy only",
         dict(sync_bn=True)),
    Case("resume-without-checkpoint-dir", ["--resume"], r"resume needs a checkpoint directory \(--checkpoint-dir\)",
         dict(resume=True)),
    # data
    Case("data-dir-missing", ["--data", "fashion-mnist", "--data-dir", "{tmp}/nowhere"],
         r"Fashion-MNIST not found in .*nowhere/FashionMNIST/raw \(missing train-images-idx3-ubyte\[\.gz\]",
         dict(data="fashion-mnist", data_dir="{tmp}/nowhere"), error=DataNotFoundError),
    Case("data-file-corrupt", ["--data", "fashion-mnist", "--data-dir", "{tmp}/fm"],
         r"train-images-idx3-ubyte is truncated or corrupt", dict(data="fashion-mnist", data_dir="{tmp}/fm"),
         error=DataError, setup=_corrupt_fashion_files),
    Case("data-empty", ["--data", "fashion-mnist", "--data-dir", "{tmp}/fm"], r"the dataset is empty",
         dict(data="fashion-mnist", data_dir="{tmp}/fm"), error=DataError,
         setup=lambda tmp: _fashion_files(tmp, n_train=0, n_test=0)),
    Case("data-fewer-than-one-batch", ["--data", "fashion-mnist", "--data-dir", "{tmp}/fm"],
         r"10 training examples do not fill one global batch of 64", dict(data="fashion-mnist", data_dir="{tmp}/fm"),
         setup=lambda tmp: _fashion_files(tmp, n_train=10)),
    # folders
    Case("out-under-a-file", ["--out", "{tmp}/a-file/run"], r"output folder .*a-file/run cannot be written",
         dict(out="{tmp}/a-file/run"), error=OutputDirError, setup=_a_file),
    Case("out-is-a-file", ["--out", "{tmp}/a-file"], r"output folder .*a-file cannot be written: it is a file",
         dict(out="{tmp}/a-file"), error=OutputDirError, setup=_a_file),
    Case("checkpoint-dir-under-a-file", ["--checkpoint-dir", "{tmp}/a-file/ckpt"],
         r"checkpoint folder .*a-file/ckpt cannot be written", dict(checkpoint_dir="{tmp}/a-file/ckpt"),
         error=OutputDirError, setup=_a_file),
    # checkpoints
    Case("checkpoint-corrupt", ["--checkpoint-dir", "{tmp}/ckpt", "--resume"],
         r"checkpoint .*ckpt/checkpoint\.pt is truncated or corrupt", dict(checkpoint_dir="{tmp}/ckpt", resume=True),
         error=CheckpointError, setup=_corrupt_checkpoint),
    Case("checkpoint-other-settings", ["--checkpoint-dir", "{tmp}/ckpt", "--resume"],
         r"checkpoint .*checkpoint\.pt was written with other settings \(lr 0\.5 -> 0\.1\)",
         dict(checkpoint_dir="{tmp}/ckpt", resume=True), error=CheckpointError,
         setup=lambda tmp: _checkpoint_of(tmp, lr=0.5)),
    Case("checkpoint-exists-without-resume", ["--checkpoint-dir", "{tmp}/ckpt"],
         r"checkpoint\.pt already exists: pass --resume to continue that run", dict(checkpoint_dir="{tmp}/ckpt"),
         error=CheckpointError, setup=lambda tmp: _checkpoint_of(tmp)),
    # devices and ports
    Case("port-in-use", ["--strategy", "ddp", "--devices", "2", "--port", "{port}"],
         r"port \d+ on 127\.0\.0\.1 is already in use", dict(strategy="ddp", devices=2, port="{port}")),
    Case("gpus-demanded-ddp", ["--strategy", "ddp", "--devices", "2", "--require-gpus"],
         r"2 GPU\(s\) demanded but \d CUDA device\(s\) found", dict(strategy="ddp", devices=2, require_gpus=True),
         error=DeviceError, needs=_no_gpus(2)),
    Case("gpus-demanded-device-cuda", ["--strategy", "fsdp", "--devices", "2", "--device", "cuda"],
         r"2 GPU\(s\) demanded but \d CUDA device\(s\) found", dict(strategy="fsdp", devices=2, device="cuda"),
         error=DeviceError, needs=_no_gpus(2)),
    Case("gpus-demanded-manual", ["--strategy", "manual", "--devices", "2", "--require-gpus"],
         r"2 GPU\(s\) demanded but \d CUDA device\(s\) found", dict(strategy="manual", devices=2, require_gpus=True),
         error=DeviceError, needs=_no_gpus(2)),
    Case("sync-bn-without-gpus", ["--strategy", "ddp", "--devices", "2", "--sync-bn"],
         r"--sync-bn needs a CUDA device per rank", dict(strategy="ddp", devices=2, sync_bn=True),
         error=DeviceError, needs=_no_gpus(2)),
]


def _fill(value, tmp: Path, port: int):
    if isinstance(value, str):
        return value.replace("{tmp}", str(tmp)).replace("{port}", str(port))
    return value


def _params(cases):
    return [pytest.param(c, id=c.id) for c in cases]


def _prepare(case: Case, tmp: Path, port: int):
    reason = case.needs()
    if reason:
        pytest.skip(reason)
    if case.setup:
        case.setup(tmp)
    argv = [_fill(a, tmp, port) for a in case.argv]
    return argv


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of `python -m mgpu ...`, run in this process."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse exits on its own
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", _params(CASES))
def test_cli_bad_input_is_one_line_and_exit_code_2(case, tmp_path, busy_port, capsys):
    argv = _prepare(case, tmp_path, busy_port)
    command = [] if case.id == "missing-command" else ["train", *BASE_ARGS, "--out", str(tmp_path / "out"), *argv]
    code, err = run_cli(command, capsys)
    lines = err.strip().splitlines()
    assert code == 2, f"{case.id}: exit code {code}, stderr:\n{err}"
    assert len(lines) == 1 and lines[0].startswith("mgpu: error: "), f"{case.id}: not one error line:\n{err}"
    assert re.search(case.message, lines[0]), f"{case.id}: {lines[0]!r} does not match {case.message!r}"


API_CLI_CASES = [c for c in CASES if c.api is not None]


@pytest.mark.parametrize("case", _params(API_CLI_CASES))
def test_api_bad_input_raises_a_specific_error(case, tmp_path, busy_port):
    _prepare(case, tmp_path, busy_port)
    settings = {k: busy_port if v == "{port}" else _fill(v, tmp_path, busy_port) for k, v in case.api.items()}
    cfg = TrainConfig(**{**BASE_API, "out": str(tmp_path / "out"), **settings})
    with pytest.raises(case.error, match=case.message) as info:
        train(cfg)
    assert isinstance(info.value, MgpuError)
    assert "\n" not in str(info.value), f"{case.id}: message must be one line: {info.value}"


@pytest.mark.parametrize("command", ["train", "check"])
def test_fsdp_on_a_torch_without_fully_shard_is_one_line_before_any_rank_starts(command, tmp_path, monkeypatch, capsys):
    """torch < 2.6 has no public fully_shard: the run says which version it needs, and starts no rank."""
    from mgpu import launch
    from mgpu.strategies import fsdp

    monkeypatch.setattr(fsdp, "fully_shard_available", lambda: False)
    monkeypatch.setattr(launch, "spawn", lambda *a, **k: pytest.fail("a rank was started"))
    argv = (["train", *BASE_ARGS, "--strategy", "fsdp", "--devices", "2", "--out", str(tmp_path / "out")]
            if command == "train" else ["check", "lenet", "--strategies", "fsdp", "--devices", "2"])
    code, err = run_cli(argv, capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"mgpu: error: the fsdp strategy needs torch >= 2.6 (torch.distributed.fsdp.fully_shard); "
        f"this is torch {torch.__version__}"], (code, err)


# -- mistakes only the API can make ------------------------------------------------------------------

def _spawn_on_busy_port(port):
    spawn(print, None, nprocs=2, port=port)


API_CASES = {
    "split-batch-x-y-mismatch": (lambda port: split_batch(torch.zeros(8, 3), torch.zeros(7), ["cpu", "cpu"]),
                                 ShapeError, r"X has 8 examples but y has 7"),
    "split-batch-smaller-than-devices": (lambda port: split_batch(torch.zeros(2, 3), torch.zeros(2), ["cpu"] * 3),
                                         ConfigError, r"batch of 2 examples is smaller than the 3 devices"),
    "dataset-images-labels-mismatch": (lambda port: ImageDataset(torch.zeros(5, 28, 28), torch.zeros(4)),
                                       DataError, r"5 images but 4 labels"),
    "dataset-empty": (lambda port: BatchLoader(ImageDataset(torch.zeros(0, 28, 28), torch.zeros(0)), 4),
                      DataError, r"the dataset is empty"),
    "train-not-a-config": (lambda port: train({"epochs": 1}), ConfigError, r"train\(\) needs a TrainConfig, got dict"),
    "spawn-port-in-use": (_spawn_on_busy_port, LaunchError, r"port \d+ on 127\.0\.0\.1 is already in use"),
    "devices-demanded": (lambda port: devices(gpu_count() + 1, require_gpus=True), DeviceError,
                         r"GPU\(s\) demanded but \d+ CUDA device\(s\) found"),
}


@pytest.mark.parametrize("case_id", list(API_CASES))
def test_api_only_bad_input_raises_a_specific_error(case_id, busy_port):
    call, error, message = API_CASES[case_id]
    with pytest.raises(error, match=message):
        call(busy_port)


# -- end to end: a real process prints no traceback ------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], r"^mgpu: error: epochs must be a positive integer, got 0$"),
    (["--data", "fashion-mnist", "--data-dir", "/nonexistent/mgpu"], r"^mgpu: error: Fashion-MNIST not found in "),
], ids=["parser", "train"])
def test_real_process_prints_one_line_and_exits_2(argv, message, tmp_path):
    proc = run_to_end([sys.executable, "-m", "mgpu", "train", *BASE_ARGS, "--out", str(tmp_path), *argv], cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(message, proc.stderr.strip()), proc.stderr


def test_help_and_bad_values_answer_without_importing_torch():
    code = ("import sys\nfrom mgpu.cli import main\n"
            "for argv in (['train', '--help'], ['train', '--epochs', '0'], ['train', '--strategy', 'zero3']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('torch imported:', 'torch' in sys.modules)")
    proc = run_to_end([sys.executable, "-c", code], cwd=ROOT)
    assert proc.stdout.strip().splitlines()[-1] == "torch imported: False", proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == ["mgpu: error: epochs must be a positive integer, got 0",
                                        "mgpu: error: unknown strategy 'zero3': choose one of single, manual, "
                                        "dataparallel, ddp, fsdp"], proc.stderr


def test_config_or_exit_turns_validates_error_into_the_one_line_usage_error(capsys):
    parser = build_parser()
    assert config_or_exit(parser, **BASE_API) == TrainConfig(**BASE_API)
    with pytest.raises(SystemExit) as info:
        config_or_exit(parser, **{**BASE_API, "lr": -1.0})
    assert info.value.code == 2
    assert capsys.readouterr().err == "mgpu: error: lr must be a finite number > 0, got -1.0\n"


def test_failures_doc_lists_every_case():
    text = DOC.read_text()
    missing = [c for c in [*(c.id for c in CASES), *API_CASES] if f"`{c}`" not in text]
    assert not missing, f"{DOC.relative_to(ROOT)} lacks rows for: {', '.join(missing)}"
