"""Stage parameters, seeding and device selection.

A stage reads exactly one section of ``params.yaml`` plus ``base`` (seed, device).
DVC tracks the same keys through the stage's ``params:`` list in ``dvc.yaml``.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lexgraph.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_PARAMS = Path("params.yaml")


@dataclass(frozen=True)
class Base:
    seed: int = 13
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    log_level: str = "INFO"


def load_params(section: str, path: str | os.PathLike = DEFAULT_PARAMS) -> tuple[Base, dict[str, Any]]:
    """Return ``(base, params[section])`` from a params file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: parameters file not found (run from the repository root)")
    with path.open(encoding="utf-8") as fh:
        try:
            params = yaml.safe_load(fh) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    if section not in params:
        raise ConfigError(f"{path}: missing section '{section}'")
    raw_base = params.get("base") or {}
    unknown = set(raw_base) - {"seed", "device", "log_level"}
    if unknown:
        raise ConfigError(f"{path}: unknown keys in 'base': {sorted(unknown)}")
    return Base(**raw_base), dict(params[section] or {})


def require(params: dict[str, Any], key: str, section: str, kind: type | tuple[type, ...] | None = None):
    """Fetch ``params[key]`` or raise a ConfigError naming the dotted key."""
    if key not in params:
        raise ConfigError(f"params.yaml: missing key '{section}.{key}'")
    value = params[key]
    if kind is not None and not isinstance(value, kind):
        raise ConfigError(f"params.yaml: '{section}.{key}' = {value!r}, expected {kind}")
    return value


def choice(params: dict[str, Any], key: str, section: str, allowed: tuple[str, ...]) -> str:
    value = require(params, key, section)
    if value not in allowed:
        raise ConfigError(f"params.yaml: '{section}.{key}' = {value!r}, expected one of {', '.join(allowed)}")
    return value


def coerce_floats(cls, params: dict[str, Any], section: str) -> dict[str, Any]:
    """Accept ``5e-5`` for float fields of dataclass ``cls``: YAML 1.1 (PyYAML) reads it as a
    string, and so does ``dvc exp run -S``. Other types are left to the dataclass's checks."""
    import dataclasses

    out = dict(params)
    for f in dataclasses.fields(cls):
        if isinstance(f.default, float) and isinstance(out.get(f.name), str):
            try:
                out[f.name] = float(out[f.name])
            except ValueError:
                raise ConfigError(f"params.yaml: '{section}.{f.name}' = {out[f.name]!r}, expected a number") from None
    return out


def section_config(cls, params: dict[str, Any], section: str):
    """Build dataclass ``cls`` from a params section: unknown keys are errors, float fields
    accept strings like ``5e-5``, and ``cls.validate()`` runs when defined."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - fields)
    if unknown:
        raise ConfigError(f"params.yaml: unknown key(s) in '{section}': {unknown}; expected {sorted(fields)}")
    cfg = cls(**coerce_floats(cls, params, section))
    if hasattr(cfg, "validate"):
        cfg.validate()
    return cfg


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices) and make torch deterministic on CPU."""
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    import numpy as np

    np.random.seed(seed)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def resolve_device(spec: str = "auto"):
    """``auto`` picks cuda when available, else cpu."""
    import torch

    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"params.yaml: base.device = {spec!r} but no CUDA device is available")
    if spec != "cpu" and not spec.startswith("cuda"):
        raise ConfigError(f"params.yaml: base.device = {spec!r}, expected auto, cpu or cuda[:N]")
    return torch.device(spec)


def autocast(device, enabled: bool = True):
    """Mixed precision on CUDA (bf16 where supported, else fp16); a no-op context on CPU."""
    import contextlib

    import torch

    if not enabled or device.type != "cuda":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast(device_type="cuda", dtype=dtype)
