"""Stage parameters (the one-config frame), seeding and device selection.

``params.yaml`` holds one section per stage plus ``base`` (seed, device, log level);
:data:`SECTIONS` lists them and the stages that read them, and :func:`load_params`
refuses any other top-level section. A stage reads exactly one section plus ``base``;
DVC tracks the same keys through the stage's ``params:`` list in ``dvc.yaml``.

Every section is read into a frozen dataclass by :func:`section_config`, the one reader
(no section has a parser of its own), which refuses unknown keys, requires every key,
checks each value against its field's annotation (``int``, ``float``, ``bool``, ``str``,
``list[...]``, ``X | None``; :mod:`lexgraph.core.conform`; a field's
``metadata["expected"]`` words the expectation for the user), reads ``5e-5`` strings as
numbers and runs the dataclass's ``validate()``. Field metadata places a key in a nested
mapping or in a variant's own mapping (``gnn.<variant>``, ``rerank.<variant>``). Every
error is a :class:`ConfigError` whose one sentence names ``params.yaml``, the dotted key
and what was expected. A value lives in params.yaml (and the profiles) only: section
configs have no defaults.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import random
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BaseModel, Field

from lexgraph.core.conform import DEFAULT_PARAMS as DEFAULT_PARAMS
from lexgraph.core.conform import bad_value as bad_value
from lexgraph.core.conform import check_types as check_types
from lexgraph.core.conform import expectation as expectation
from lexgraph.core.conform import hints
from lexgraph.core.conform import params_error as params_error
from lexgraph.core.conform import without_params_file as without_params_file
from lexgraph.core.errors import ConfigError, DataError
from lexgraph.core.inputs import DuplicateKeyError, load_yaml, yaml_problem
from lexgraph.core.settings import Bool, Expect, Int, Settings, Str, read_section

log = logging.getLogger(__name__)


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
    "dsr": "train_dsr, train_dsr_qabisar (the keys dsr_qabisar does not set), encode_chunks (chunking keys)",
    "dsr_qabisar": "train_dsr_qabisar (QABISAR's first stage: the keys where it differs from dsr)",
    "embed": "embed",
    "hprior": "hprior",
    "hybrid": "hybrid",
    "rerank": "encode_rerank (xrerank's encoding keys), rerank (mvcl, xrerank)",
    "serve": "lexgraph serve (no stage: what the server loads and the bounds of its requests)",
}

#: Sections that hold only the keys where their stage differs from another section: that stage reads
#: both, and :func:`load_params` hands it ``{other: ..., section: ...}``.
EXTENDS: dict[str, str] = {"dsr_qabisar": "dsr"}

#: The split held out for evaluation: no tuning or training stage may read it.
HELD_OUT_SPLIT = "test"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_DEVICE = re.compile(r"^(?:auto|cpu|cuda(?::\d+)?)$")


def _log_level(value: str) -> str:
    if value.upper() not in LOG_LEVELS:
        raise ValueError("not a log level")
    return value


# ---------------------------------------------------------------------------
# The frame: typed section configs
# ---------------------------------------------------------------------------


def section_config(cls, params: dict[str, Any] | None, section: str, variant: str | None = None):
    """Build dataclass ``cls`` from a params section: the one reader of every section.

    Unknown keys are errors (with the closest key); every key is required (a missing one is an
    error naming it: no silent default); every value is checked against its field's annotation
    (:func:`check_types`) and its ``metadata["choices"]``, then ``cls.validate()`` runs.

    A field's ``metadata`` may place its key elsewhere in the section: ``key`` is its dotted
    path (``"{variant}.kd.weight"``: nested mappings, the variant's own mapping); ``variants``
    the variants that read it and ``read_with`` the ``(field, value)`` under which it is read
    (elsewhere it must be absent, and the field is ``metadata["unread"]``). A field whose type
    is a dataclass is built from the keys of ``metadata["keys"]`` (its field -> dotted path)
    plus ``metadata["extra"](variant, values)``. A per-variant section (``gnn``, ``rerank``:
    shared keys at the top, one mapping per name of ``cls.VARIANTS``) is read for ``variant``.
    """
    if isinstance(cls, type) and issubclass(cls, BaseModel):  # the pydantic settings (lexgraph.core.settings)
        return read_section(cls, params, section)
    variants: tuple[str, ...] = getattr(cls, "VARIANTS", ()) if variant is not None else ()
    if variant is not None and variant not in variants:
        raise params_error(f"unknown '{section}' variant {variant!r}, expected one of {', '.join(variants)}")
    layout = _layout(cls, variant)
    tree: dict[str, Any] = {}
    for path, required in ((p, r) for _, paths, r in layout for p in paths):
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = required
    for name in variants:
        tree.setdefault(name, {})
    values = _read_level(cls, params, tree, section, (), variant)
    found = {name: _lookup(values, paths[0]) for name, paths, _ in layout}
    flat = {name: value for name, value in found.items() if value is not _ABSENT}  # a conditional key may be absent
    keys = {name: ".".join(paths[0]) for name, paths, _ in layout}
    out: dict[str, Any] = {}
    for f in (f for f in dataclasses.fields(cls) if f.name in keys and "read_with" not in f.metadata):
        if dataclasses.is_dataclass(hints(cls)[f.name]):
            out[f.name] = _nested(cls, f, values, section, variant)
        elif f.name in flat:
            out[f.name] = check_types(cls, {f.name: flat[f.name]}, section, keys)[f.name]
            if out[f.name] not in f.metadata.get("choices", (out[f.name],)):
                raise bad_value(section, keys[f.name], out[f.name], expectation(cls, f.name))
    for f in dataclasses.fields(cls):
        if "read_with" in f.metadata and (variant is None or variant in f.metadata.get("variants", (variant,))):
            out[f.name] = _conditional(cls, f, out, flat, section, keys[f.name])
        elif f.init and f.name not in out and "unread" in f.metadata:
            out[f.name] = f.metadata["unread"]
    cfg = cls(**out, **({"variant": variant} if variant is not None else {}))
    if hasattr(cfg, "validate"):
        cfg.validate()
    return cfg


_ABSENT = object()


def _layout(cls, variant: str | None) -> list[tuple[str, list[tuple[str, ...]], bool]]:
    """``(field, [its key paths], required)`` for each field ``variant`` reads (a nested
    dataclass field has one path per key of its own)."""
    rows = []
    for f in dataclasses.fields(cls):
        if not f.init or (f.name == "variant" and variant is not None):
            continue
        if variant is not None and variant not in f.metadata.get("variants", (variant,)):
            continue
        spec = _keys_of(cls, f) or {f.name: f.metadata.get("key", f.name)}
        paths = [tuple(p.format(variant=variant).split(".")) for p in spec.values()]
        rows.append((f.name, paths, "read_with" not in f.metadata))
    return rows


def _keys_of(cls, f) -> dict[str, str]:
    """A nested dataclass field's keys: ``metadata["keys"]``, else its fields under the field's name."""
    sub = hints(cls)[f.name]
    if not dataclasses.is_dataclass(sub):
        return {}
    return f.metadata.get("keys") or {g.name: f"{f.name}.{g.name}" for g in dataclasses.fields(sub) if g.init}


def _lookup(values: dict[str, Any], path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(values, dict) or part not in values:
            return _ABSENT
        values = values[part]
    return values


def _read_level(cls, params: Any, tree: dict[str, Any], section: str, where: tuple[str, ...], variant) -> Any:
    """``params`` at ``where`` checked against ``tree`` (key -> True: required, False: read under a
    condition, a dict: a nested mapping): the first unknown, then the first missing key."""
    dotted = ".".join((section, *where))
    if params is None and not where:
        params = {}
    if not isinstance(params, dict):
        expected = f"a mapping with the keys {', '.join(tree)}" if where else "a mapping of keys"
        raise ConfigError(f"params.yaml: '{dotted}' = {params!r}, expected {expected}")
    unknown = sorted(set(params) - set(tree), key=str)
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), list(tree), n=1)
        shared = set(unknown) & {path[0] for _, paths, _ in _layout(cls, variant) for path in paths if len(path) == 1}
        hint = f" (a shared key: set it once under '{section}')" if where and shared else ""
        hint = hint or (f" (did you mean '{dotted}.{close[0]}'?)" if close else "")
        raise ConfigError(
            f"params.yaml: unknown keys {', '.join(repr(f'{dotted}.{k}') for k in unknown)}{hint}; "
            f"expected keys of '{dotted}': {', '.join(sorted(tree))}"
        )
    for key, sub in tree.items():
        if key not in params and sub is not False:
            raise params_error(f"missing key '{dotted}.{key}', expected {_expected(cls, tree, key, where, variant)}")
    others = [k for k in tree if not where and variant is not None and k in cls.VARIANTS and k != variant]
    return {  # the other variants' mappings are read when their own settings are
        k: _read_level(cls, v, tree[k], section, (*where, k), variant) if isinstance(tree[k], dict) else v
        for k, v in params.items()
        if k not in others
    }


def _expected(cls, tree: dict[str, Any], key: str, where: tuple[str, ...], variant) -> str:
    """What missing ``key`` (at ``where``) expects: its field's expectation, or a mapping's keys."""
    if not where and key in getattr(cls, "VARIANTS", ()):
        return f"a mapping of the {key} settings"
    if isinstance(tree[key], dict):
        return f"a mapping with the keys {', '.join(tree[key])}"
    path = ".".join((*where, key))
    for f in dataclasses.fields(cls):
        if f.metadata.get("key", f.name).format(variant=variant) == path:
            return expectation(cls, f.name)
        sub = {p.format(variant=variant): name for name, p in _keys_of(cls, f).items()}
        if path in sub:
            return expectation(hints(cls)[f.name], sub[path])
    return "a value"  # pragma: no cover - every leaf of the tree is a field's key


def _nested(cls, f, values: dict[str, Any], section: str, variant):
    """The dataclass of field ``f`` (an architecture inside a stage's settings) from its keys;
    its errors name the keys as written (``'gnn.heads'`` -> ``'gnn.hgraph.heads'``)."""
    sub = hints(cls)[f.name]
    paths = {name: p.format(variant=variant) for name, p in _keys_of(cls, f).items()}
    own = check_types(sub, {n: _lookup(values, tuple(p.split("."))) for n, p in paths.items()}, section, paths)
    try:
        built = sub(**own, **f.metadata.get("extra", lambda v, x: {})(variant, values))
        if hasattr(built, "validate"):
            built.validate()
        return built
    except ConfigError as exc:
        message = str(exc)
        for name, path in paths.items():
            message = message.replace(f"'{section}.{name}'", f"'{section}.{path}'")
        raise ConfigError(message) from None


def _conditional(cls, f, out: dict[str, Any], flat: dict[str, Any], section: str, key: str) -> Any:
    """A key read only when ``metadata["read_with"]`` holds: required then, refused otherwise."""
    depends, value = f.metadata["read_with"]

    def yaml_word(v: Any) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    read = out[depends] == value
    if read and f.name not in flat:
        raise params_error(
            f"missing key '{section}.{key}', expected {expectation(cls, f.name)} (read with {depends}: "
            f"{yaml_word(value)})"
        )
    if not read and f.name in flat:
        raise params_error(
            f"'{section}.{key}' is read only with {depends}: {yaml_word(value)}; expected no {f.name} with "
            f"{depends}: {yaml_word(out[depends])} (remove it)"
        )
    return check_types(cls, {f.name: flat[f.name]}, section, {f.name: key})[f.name] if read else f.metadata["unread"]


def refuse_held_out(section: str, key: str, splits: str | list[str] | tuple[str, ...], expected: str) -> None:
    """Tuning and training stages never read the evaluation split: a ConfigError when
    ``section.key`` (one split name or a list) names it."""
    names = [splits] if isinstance(splits, str) else list(splits)
    if HELD_OUT_SPLIT in names:
        raise ConfigError(
            f"params.yaml: '{section}.{key}' = {splits!r}, but the '{HELD_OUT_SPLIT}' split is held out for "
            f"evaluation; expected {expected}"
        )


# ---------------------------------------------------------------------------
# base, and loading a stage's section
# ---------------------------------------------------------------------------


#: the devices a setting may name
Device = Annotated[Str, Field(pattern=_DEVICE.pattern), Expect("auto, cpu, cuda or cuda:N")]


class Base(Settings):
    """The ``base`` section: read by every stage."""

    seed: Annotated[Int, Field(ge=0, le=2**32 - 1)]
    device: Device
    log_level: Annotated[Str, AfterValidator(_log_level), Expect(f"one of {', '.join(LOG_LEVELS)}")]
    deterministic: Bool = Field(
        description="bitwise-reproducible kernels (set_deterministic); costs GPU speed, nothing measurable on CPU"
    )
    launcher: Annotated[
        Str,
        Field(pattern=r"\S"),
        Expect("a command such as python or 'accelerate launch --multi_gpu --num_processes 2'"),
    ] = Field(
        description="the program the training stages' dvc.yaml commands start with: `python`, or a "
        "multi-process launcher such as `accelerate launch --multi_gpu --num_processes 4` (README)"
    )


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
    """Return ``(base, params[section])`` from a params file (a section of :data:`EXTENDS`:
    ``{other: params[other], section: params[section]}``): unknown top-level sections and a bad
    ``base`` are errors; the section itself is checked by its stage's config."""
    if section not in SECTIONS:
        raise ValueError(f"unknown params section {section!r}; add it to lexgraph.core.config.SECTIONS")
    params = read_params(path)
    raw = _section(params, section, path)
    if section in EXTENDS:
        raw = {EXTENDS[section]: _section(params, EXTENDS[section], path), section: raw}
    return read_section(Base, params.get("base"), "base"), raw


def _section(params: dict[str, Any], section: str, path: str | os.PathLike) -> dict[str, Any]:
    """``params[section]`` as a mapping (a missing section, or one that is not a mapping, is an error)."""
    if section not in params:
        raise ConfigError(f"{path}: missing section '{section}' (read by {SECTIONS[section]})")
    raw = params[section] if params[section] is not None else {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: section '{section}' = {raw!r}, expected a mapping of keys")
    return dict(raw)


def workspace_params(section: str, workspace: Path, config_class):
    """The typed ``section`` of the workspace's params.yaml (the settings its models were built with)."""
    path = workspace / "params.yaml"
    if not path.is_file():
        raise DataError(path, "not found; expected the workspace's params.yaml (its models' settings)")
    return config_class.from_params(load_params(section, path)[1])


def seed_everything(seed: int, with_torch: bool = True) -> None:
    """Seed python, numpy and (``with_torch``) torch on all devices. Kernel determinism is
    :func:`set_deterministic`'s (``base.deterministic``)."""
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    import numpy as np

    np.random.seed(seed)
    if with_torch:
        import torch

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
