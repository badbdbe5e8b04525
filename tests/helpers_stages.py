"""dvc.yaml's stages as DVC expands them, their outputs, and the stage drivers that run them
(``tests/test_layout.py``, ``tests/test_dvc_paths.py``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

from conftest import ROOT


def expanded_stages() -> dict[str, dict]:
    """dvc.yaml's stages, a ``foreach`` expanded into ``name@item`` entries (a mapping's items
    ``name@key``, with ``${key}`` and ``${item.<field>}`` filled in, as DVC does)."""
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    out = {}
    for name, stage in spec.items():
        if "foreach" in stage:
            values = stage["foreach"]
            for key, item in values.items() if isinstance(values, dict) else ((v, v) for v in values):
                text = yaml.safe_dump(stage["do"]).replace("${key}", str(key))
                for field, value in item.items() if isinstance(item, dict) else ():
                    text = text.replace(f"${{item.{field}}}", str(value))
                text = text if isinstance(item, dict) else text.replace("${item}", str(item))
                assert "${item" not in text and "${key}" not in text, (name, key, text)
                out[f"{name}@{key}"] = yaml.safe_load(text)
        else:
            out[name] = stage
    return out


def outs_of(stage: dict) -> set[str]:
    paths = set()
    for key in ("outs", "metrics", "plots"):
        for entry in stage.get(key, []) or []:
            paths.add(next(iter(entry)) if isinstance(entry, dict) else entry)
    return paths


def driver(script: Path):
    """The module of the stage driver ``script`` (``stages/<name>.py``), imported, not run."""
    spec = importlib.util.spec_from_file_location(f"_stage_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
