"""The script's own per-device batch-size argument, read from its source (never run): what the
per-device batch hint names (plan.batch_hint), so that a script is told of a flag it has.

    batch_options("train.py")   # BatchOptions(flags=(("--batch-size", 16),), hydra_keys=(), hf=False)

* argparse (and click): the option strings of `add_argument(...)` / `click.option(...)` calls that
  mention "batch" or "per-device", with their integer default where there is one; evaluation batches last.
* HF's `HfArgumentParser` (TrainingArguments from the command line): `--per_device_train_batch_size`.
* hydra (`@hydra.main(config_path=..., config_name=...)`): the keys of its YAML config that mention
  "batch", dotted (`data.batch_size`), with their value; overridden as `key=value`.
"""

from __future__ import annotations

import ast
import os
import sys
from dataclasses import dataclass

__all__ = ["BatchOptions", "batch_options", "script_source"]

_EVALUATION = ("eval", "val", "test", "infer", "predict")


@dataclass(frozen=True)
class BatchOptions:
    flags: tuple = ()        # (option string, integer default or None), training batches first
    hydra_keys: tuple = ()   # (dotted key, integer value or None) of a hydra config
    hydra: bool = False      # the script's entry is @hydra.main
    hf: bool = False         # HfArgumentParser: --per_device_train_batch_size


def script_source(script: str | None, module: str | None) -> str | None:
    """The file `python SCRIPT` or `python -m MODULE` would run, where it can be found without importing."""
    if script:
        path = os.path.join(script, "__main__.py") if os.path.isdir(script) else script
        return path if os.path.isfile(path) else None
    if not module:
        return None
    parts = module.split(".")
    for base in [os.getcwd(), *sys.path[1:]]:
        for path in (os.path.join(base, *parts) + ".py", os.path.join(base, *parts, "__main__.py")):
            if os.path.isfile(path):
                return path
    return None


def _batchy(name: str) -> bool:
    name = name.lower().replace("-", "_")
    return "batch" in name or "per_device" in name


def _int(node) -> int | None:
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def _flags(tree: ast.AST) -> list:
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("add_argument", "option")):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        flags = [n for n in names if n.startswith("-") and _batchy(n)]
        if flags:
            default = next((_int(k.value) for k in node.keywords if k.arg == "default"), None)
            found.append((max(flags, key=len), default))
    return sorted(found, key=lambda f: any(w in f[0].lower() for w in _EVALUATION))


def _hydra_config(tree: ast.AST, source: str, folder: str) -> tuple[bool, list]:
    """(whether the entry is @hydra.main, the batch keys of its config)."""
    if "hydra" not in source:
        return False, []
    for node in ast.walk(tree):
        for deco in getattr(node, "decorator_list", []):
            if isinstance(deco, ast.Call) and ast.unparse(deco.func).split(".")[-1] == "main":
                kw = {k.arg: k.value.value for k in deco.keywords if isinstance(k.value, ast.Constant)}
                path = os.path.join(folder, kw.get("config_path") or "", f"{kw.get('config_name') or 'config'}.yaml")
                return True, _yaml_batch_keys(path)
    return False, []


def _yaml_batch_keys(path: str) -> list:
    try:
        import yaml

        with open(path) as f:
            config = yaml.safe_load(f)
    except Exception:  # no config there, no PyYAML, or a file that is no YAML: the hint stays generic
        return []
    found = []

    def visit(value, prefix):
        if isinstance(value, dict):
            for k, v in value.items():
                key = f"{prefix}{k}"
                if "batch" in str(k).lower() and not isinstance(v, (dict, list)):
                    found.append((key, v if type(v) is int else None))
                visit(v, key + ".")

    visit(config, "")
    return sorted(found, key=lambda f: any(w in f[0].lower() for w in _EVALUATION))


def batch_options(path: str | None) -> BatchOptions:
    """What the script at `path` takes for a batch size (empty where it cannot be read or parsed)."""
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError, TypeError):
        return BatchOptions()
    hydra, keys = _hydra_config(tree, source, os.path.dirname(os.path.abspath(path)))
    hf = "HfArgumentParser" in source  # TrainingArguments from the command line
    return BatchOptions(tuple(_flags(tree)), tuple(keys), hydra, hf)
