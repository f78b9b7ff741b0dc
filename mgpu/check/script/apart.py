"""Runs kept apart under `mgpu check-script --whole-run`: each run (world 1, its rerun, world N, lifted
runs, a traced rerun) in a working folder of its own, so that what one run writes (checkpoints, logs,
`runs/`, `wandb/`, a resume file it would pick up next time) never reaches another run or the user's files.

    workdir, env = run_folder(folder, "w2N-cpu", "/home/me/project", ("--data", "data/train", "--out", "ckpt"))
    # workdir: folder/w2N-cpu-cwd, holding data/train -> /home/me/project/data/train (a link) and nothing else

The rule (`run_folder`, which copies nothing):
* the run's working folder is a new, empty folder inside the check's temporary folder (removed when the
  check ends); the script runs there (its cwd), so that every relative path it writes lands there;
* each ARGS value that is a relative path to something that exists in the folder check-script was run
  from (`data/train`, `--config=conf.yaml`, hydra's `data.root=data`) is linked into the run's folder at
  the same relative path, so that the script reads it as it would; a path that does not exist yet (an
  output folder, a checkpoint to write) is not linked, and the script makes it in its own folder;
* what is not in ARGS is not linked: a script that reads a file of the user's folder by a path of its own
  (`open("config.yaml")`) gets "no such file" (give it in ARGS, or an absolute path); absolute paths and
  paths relative to the script's own file (`Path(__file__).parent / "ckpt"`) are the user's and are not
  kept apart (what is written there is shared by the runs: the guide says so);
* the environment: WANDB_MODE=disabled (wandb never goes online; WANDB_DIR the run's folder),
  MLFLOW_TRACKING_URI a file store in the run's folder, TMPDIR a folder of the run's own.
"""

from __future__ import annotations

import os

__all__ = ["run_folder", "linked_args", "LOGGER_ENV"]

# Online loggers kept off the network and out of the user's folders ({dir}: the run's working folder).
LOGGER_ENV = (("WANDB_MODE", "disabled"), ("WANDB_DIR", "{dir}"), ("WANDB_SILENT", "true"),
              ("MLFLOW_TRACKING_URI", "file:{dir}/mlruns"), ("NEPTUNE_MODE", "offline"), ("COMET_MODE", "offline"))


def linked_args(args, cwd: str) -> list[str]:
    """The ARGS values (each argument, or the part after `=`) that are relative paths to something that
    exists under `cwd`, without `..`: what run_folder links."""
    out = []
    for arg in args:
        for value in {arg, arg.partition("=")[2]}:
            if not value or os.path.isabs(value) or value.startswith("-"):
                continue
            norm = os.path.normpath(value)
            if norm == "." or norm.split(os.sep)[0] == ".." or norm in out:
                continue
            if os.path.lexists(os.path.join(cwd, norm)):
                out.append(norm)
    return out


def run_folder(folder: str, tag: str, cwd: str, args) -> tuple[str, tuple]:
    """The run's own working folder (made) and the environment its ranks get (the module docstring)."""
    workdir = os.path.join(folder, f"{tag}-cwd")
    os.makedirs(os.path.join(workdir, ".tmp"), exist_ok=True)
    for rel in sorted(linked_args(args, cwd), key=lambda p: p.count(os.sep)):  # a folder before what is in it
        target = os.path.join(workdir, rel)
        if os.path.lexists(target):
            continue
        os.makedirs(os.path.dirname(target) or workdir, exist_ok=True)
        os.symlink(os.path.join(cwd, rel), target)
    env = tuple((k, v.format(dir=workdir)) for k, v in LOGGER_ENV) + (("TMPDIR", os.path.join(workdir, ".tmp")),)
    return workdir, env
