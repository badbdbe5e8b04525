"""Stage parameters (the one-config frame), seeding and device selection.

``params.yaml`` holds one section per stage plus ``base`` (seed, device, log level);
:data:`SECTIONS` lists them and the stages that read them, and :func:`load_params`
refuses any other top-level section. A stage reads exactly one section plus ``base``;
DVC tracks the same keys through the stage's ``params:`` list in ``dvc.yaml``.

Every section is read into a frozen dataclass by :func:`section_config`, which refuses
unknown keys, checks each value against its field's annotation (``int``, ``float``,
``bool``, ``str``, ``list[...]``, ``X | None``; a field's ``metadata["expected"]``
words the expectation for the user), reads ``5e-5`` strings as numbers and runs the
dataclass's ``validate()``. Every error is a :class:`ConfigError` whose one sentence
names ``params.yaml``, the dotted key and what was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import os
import random
import re
import types
import typing
from collections import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

from lexgraph.core.errors import ConfigError
from lexgraph.core.inputs import DuplicateKeyError, load_yaml, yaml_problem

log = logging.getLogger(__name__)

DEFAULT_PARAMS = Path("params.yaml")

#: The top-level sections of params.yaml (and of every profile), each with the
#: stage(s) that read it. One place: load_params refuses any other section.
SECTIONS: dict[str, str] = {
    "base": "every stage (seed, device, log level)",
    "fetch": "fetch",
    "clean": "clean",
    "bm25_tune": "bm25_tune",
    "bm25": "bm25",
    "evaluate": "evaluate",
    "zeroshot": "zeroshot",
    "graph": "build_graph",
    "negatives": "mine_negatives",
    "gnn": "train_gnn (gdsr, qabisar, hgraph, hgraph_qa)",
    "pretrain": "pretrain",
    "queries": "generate_queries",
    "dsr": "train_dsr, encode_chunks (chunking keys)",
    "embed": "embed",
    "hprior": "hprior",
    "hybrid": "hybrid",
    "rerank": "encode_rerank (xrerank's encoding keys), rerank (mvcl, xrerank)",
}

#: The retrieval systems, by name, that settings may refer to (``rerank.first_stage``, ...);
#: :data:`lexgraph.systems.registry.SYSTEMS` maps each to its loader (a test keeps them equal).
SYSTEM_NAMES: tuple[str, ...] = (
    "bm25",
    "zeroshot",
    "dsr",
    "hprior",
    "gdsr",
    "qabisar",
    "hgraph",
    "hgraph_qa",
    "hybrid",
    "xrerank",
    "mvcl",
)

#: The split held out for evaluation: no tuning or training stage may read it.
HELD_OUT_SPLIT = "test"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_DEVICE = re.compile(r"auto|cpu|cuda(?::\d+)?")
_NONE = type(None)


# ---------------------------------------------------------------------------
# The frame: typed section configs
# ---------------------------------------------------------------------------


def params_error(detail: str) -> ConfigError:
    """The one-sentence error about a setting, naming params.yaml (the file the user edits):
    every module words it through here (or :func:`bad_value`)."""
    return ConfigError(f"{DEFAULT_PARAMS}: {detail}")


def without_params_file(exc: Exception) -> str:
    """A settings error's words without the leading ``params.yaml: ``, for a saved artefact
    (``gnn.json``, ``mvcl.json``) that holds the settings: the caller names that file instead."""
    return str(exc).removeprefix(f"{DEFAULT_PARAMS}: ")


def bad_value(section: str, key: str, value: Any, expected: str) -> ConfigError:
    """The one-sentence error for a bad ``section.key`` value."""
    return ConfigError(f"params.yaml: '{section}.{key}' = {value!r}, expected {expected}")


def _describe(hint: Any, plural: bool = False) -> str:
    """User wording of a type annotation: ``int | None`` -> "null or an integer"."""
    words = {
        int: ("an integer", "integers"),
        float: ("a number", "numbers"),
        bool: ("true or false", "true/false values"),
        str: ("a string", "strings"),
        _NONE: ("null", "nulls"),
        dict: ("a mapping", "mappings"),
        list: ("a list", "lists"),
    }
    if hint in words:
        return words[hint][plural]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        ordered = sorted(args, key=lambda a: a is not _NONE)  # null first
        return " or ".join(_describe(a, plural) for a in ordered)
    if origin in (list, tuple, abc.Sequence):
        inner = [a for a in args if a is not Ellipsis]
        return ("lists" if plural else "a list") + (f" of {_describe(inner[0], True)}" if inner else "")
    if origin is dict:
        return words[dict][plural]
    return f"a value of type {getattr(hint, '__name__', hint)}"


class _Mismatch(Exception):
    pass


class _NotFinite(_Mismatch):
    """A number that is nan or infinite: the type is right, the value meaningless (an
    infinite temperature trains nothing, a nan learning rate poisons every weight)."""


def _conform(value: Any, hint: Any) -> Any:
    """``value`` checked against annotation ``hint`` (numbers in strings, ``5e-5``, read
    as floats; ints accepted as floats); raises :class:`_Mismatch`."""
    if hint is Any:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None:
            if _NONE in args:
                return None
            raise _Mismatch
        not_finite = None
        for arg in (a for a in args if a is not _NONE):
            try:
                return _conform(value, arg)
            except _NotFinite as exc:
                not_finite = exc
            except _Mismatch:
                continue
        raise not_finite or _Mismatch()
    if hint is _NONE:
        if value is None:
            return None
        raise _Mismatch
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 (PyYAML, dvc exp run -S) reads `5e-5` as a string
            try:
                number = float(value)
            except ValueError:
                raise _Mismatch from None
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer beyond float's range (10**400)
                raise _NotFinite from None
        else:
            raise _Mismatch
        if not math.isfinite(number):  # .nan, .inf, and the strings 'nan', 'inf', '1e999' float() reads
            raise _NotFinite
        return number
    if hint is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if hint in (list, tuple) or origin in (list, tuple, abc.Sequence):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        inner = [a for a in args if a is not Ellipsis]
        items = [_conform(v, inner[0]) for v in value] if inner else list(value)
        return tuple(items) if (origin or hint) is tuple else items
    if hint is dict or origin is dict:
        if isinstance(value, dict):
            return value
        raise _Mismatch
    if isinstance(hint, type) and not isinstance(value, hint):
        raise _Mismatch
    return value


def expectation(cls, name: str) -> str:
    """What field ``name`` of dataclass ``cls`` expects, in the user's words."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    return f.metadata.get("expected") or _describe(typing.get_type_hints(cls)[name])


def _finite(cls, name: str) -> str:
    """The expectation of a field given nan or an infinity."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if "expected" in f.metadata or typing.get_origin(typing.get_type_hints(cls)[name]) in (list, tuple, abc.Sequence):
        return f"{expectation(cls, name)}, finite (not nan or inf)"
    return "a finite number (not nan or inf)"


def check_types(cls, values: dict[str, Any], section: str, keys: dict[str, str] | None = None) -> dict[str, Any]:
    """``values`` (field name -> value) checked against the annotations of dataclass
    ``cls`` and conformed (``'5e-5'`` -> ``5e-05``); ``keys`` maps a field to the key
    the user wrote when they differ (``{"kd_weight": "kd.weight"}``)."""
    hints = typing.get_type_hints(cls)
    out = dict(values)
    for name, value in values.items():
        if name not in hints:
            continue
        try:
            out[name] = _conform(value, hints[name])
        except _NotFinite:
            raise bad_value(section, (keys or {}).get(name, name), value, _finite(cls, name)) from None
        except _Mismatch:
            raise bad_value(section, (keys or {}).get(name, name), value, expectation(cls, name)) from None
    return out


def section_config(cls, params: dict[str, Any] | None, section: str):
    """Build dataclass ``cls`` from a params section: unknown keys are errors, every field is
    required (a key missing from params.yaml is an error naming it: no silent default), every
    value is checked against its field's annotation (:func:`check_types`), and
    ``cls.validate()`` runs when defined."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ConfigError(f"params.yaml: '{section}' = {params!r}, expected a mapping of keys")
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(params) - set(fields), key=str)
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), fields, n=1)
        hint = f" (did you mean '{section}.{close[0]}'?)" if close else ""
        raise ConfigError(
            f"params.yaml: unknown keys {', '.join(repr(f'{section}.{k}') for k in unknown)}{hint}; "
            f"expected keys of '{section}': {', '.join(sorted(fields))}"
        )
    missing = [name for name in fields if name not in params]
    if missing:
        raise ConfigError(f"params.yaml: missing key '{section}.{missing[0]}', expected {expectation(cls, missing[0])}")
    cfg = cls(**check_types(cls, params, section))
    if hasattr(cfg, "validate"):
        cfg.validate()
    return cfg


def refuse_held_out(section: str, key: str, splits: str | list[str] | tuple[str, ...], expected: str) -> None:
    """Tuning and training stages never read the evaluation split: a ConfigError when
    ``section.key`` (one split name or a list) names it."""
    names = [splits] if isinstance(splits, str) else list(splits)
    if HELD_OUT_SPLIT in names:
        raise ConfigError(
            f"params.yaml: '{section}.{key}' = {splits!r}, but the '{HELD_OUT_SPLIT}' split is held out for "
            f"evaluation; expected {expected}"
        )


def require(params: dict[str, Any], key: str, section: str, kind: type | tuple[type, ...] | None = None):
    """Fetch ``params[key]`` or raise a ConfigError naming the dotted key."""
    if key not in params:
        raise ConfigError(f"params.yaml: missing key '{section}.{key}'")
    value = params[key]
    if kind is not None and not isinstance(value, kind):
        raise ConfigError(f"params.yaml: '{section}.{key}' = {value!r}, expected {kind}")
    return value


# ---------------------------------------------------------------------------
# base, and loading a stage's section
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Base:
    """The ``base`` section: read by every stage."""

    seed: int = 13
    device: str = field(default="auto", metadata={"expected": "auto, cpu, cuda or cuda:N"})
    log_level: str = field(default="INFO", metadata={"expected": f"one of {', '.join(LOG_LEVELS)}"})
    # bitwise-reproducible kernels (set_deterministic); costs GPU speed, nothing measurable on CPU
    deterministic: bool = True
    # the program the training stages' dvc.yaml commands start with: `python`, or a
    # multi-process launcher such as `accelerate launch --multi_gpu --num_processes 4` (README)
    launcher: str = field(
        default="python",
        metadata={"expected": "a command such as python or 'accelerate launch --multi_gpu --num_processes 2'"},
    )

    def validate(self) -> None:
        if not 0 <= self.seed < 2**32:
            raise bad_value("base", "seed", self.seed, f"an integer in [0, {2**32 - 1}]")
        if not _DEVICE.fullmatch(self.device):
            raise bad_value("base", "device", self.device, expectation(Base, "device"))
        if self.log_level.upper() not in LOG_LEVELS:
            raise bad_value("base", "log_level", self.log_level, expectation(Base, "log_level"))
        if not self.launcher.strip():
            raise bad_value("base", "launcher", self.launcher, expectation(Base, "launcher"))


def read_params(path: str | os.PathLike = DEFAULT_PARAMS) -> dict[str, Any]:
    """The whole params file, its top-level sections checked against :data:`SECTIONS`: a
    directory, bytes that are not UTF-8, invalid YAML and a key given twice (PyYAML would
    keep the last value silently; DVC refuses such a file) are errors naming the file."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            f"{path}: is a directory; expected the parameters file (YAML, like the repository's params.yaml)"
        )
    if not path.is_file():
        raise ConfigError(f"{path}: parameters file not found (run from the repository root)")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not valid UTF-8 ({exc.reason} at byte {exc.start}); expected a UTF-8 text file"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror}); expected a readable parameters file") from None
    try:
        params = load_yaml(text)
    except DuplicateKeyError as exc:
        raise ConfigError(
            f"{path}: {exc.located}; expected each key once (a repeated key would silently replace the first)"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({yaml_problem(exc)})") from None
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ConfigError(
            f"{path}: expected a mapping of sections ({', '.join(SECTIONS)}), got {type(params).__name__}"
        )
    unknown = sorted((s for s in params if s not in SECTIONS), key=str)
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), list(SECTIONS), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(
            f"{path}: unknown section(s) {', '.join(repr(str(s)) for s in unknown)}{hint}; "
            f"expected only the sections {', '.join(SECTIONS)}"
        )
    return params


def load_params(section: str, path: str | os.PathLike = DEFAULT_PARAMS) -> tuple[Base, dict[str, Any]]:
    """Return ``(base, params[section])`` from a params file: unknown top-level sections and
    a bad ``base`` are errors; the section itself is checked by its stage's config."""
    if section not in SECTIONS:
        raise ValueError(f"unknown params section {section!r}; add it to lexgraph.core.config.SECTIONS")
    params = read_params(path)
    if section not in params:
        raise ConfigError(f"{path}: missing section '{section}' (read by {SECTIONS[section]})")
    raw = params[section] if params[section] is not None else {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: section '{section}' = {raw!r}, expected a mapping of keys")
    return section_config(Base, params.get("base"), "base"), dict(raw)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices). Kernel determinism is
    :func:`set_deterministic`'s (``base.deterministic``)."""
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


def set_deterministic(enabled: bool) -> None:
    """``base.deterministic``: bitwise-reproducible kernels, or the fastest ones.

    On: ``torch.use_deterministic_algorithms(True)`` (strict: an op without a
    deterministic implementation raises instead of warning; the attention backward
    (flash / memory-efficient / cuDNN) then takes its deterministic path, which it does
    not in warn-only mode), ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (unless already set;
    read when cuBLAS starts, so set here before any CUDA work), cuDNN deterministic and
    no cuDNN benchmarking. Off: all of these back to PyTorch's defaults.
    """
    import torch

    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = enabled
    torch.backends.cudnn.benchmark = False


def resolve_device(spec: str = "auto", *, where: str = "params.yaml: 'base.device'"):
    """``auto`` picks cuda when available, else cpu; ``where`` names the setting in errors
    (the CLI passes ``where="--device"``)."""
    import torch

    if not isinstance(spec, str) or not _DEVICE.fullmatch(spec):
        raise ConfigError(f"{where} = {spec!r}, expected auto, cpu, cuda or cuda:N")
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"{where} = {spec!r} but no CUDA device is available; expected auto or cpu on this machine"
            )
        index = int(spec.split(":")[1]) if ":" in spec else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"{where} = {spec!r} but this machine has {torch.cuda.device_count()} CUDA device(s); "
                f"expected cuda:0 to cuda:{torch.cuda.device_count() - 1}"
            )
    return torch.device(spec)


def autocast(device, enabled: bool = True):
    """Mixed precision on CUDA (bf16 where supported, else fp16); a no-op context on CPU."""
    import contextlib

    import torch

    if not enabled or device.type != "cuda":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast(device_type="cuda", dtype=dtype)
