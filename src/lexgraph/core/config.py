"""Stage parameters (the one-config frame), seeding and device selection.

``params.yaml`` holds one section per stage plus ``base`` (seed, device, log level);
:data:`SECTIONS` lists them and the stages that read them, and :func:`load_params`
refuses any other top-level section. A stage reads exactly one section plus ``base``;
DVC tracks the same keys through the stage's ``params:`` list in ``dvc.yaml``.

Every section is a pydantic model (:mod:`lexgraph.core.settings`), read by its config's
``from_params`` through :func:`~lexgraph.core.settings.read_section`: unknown keys refused, every
key required, each value checked once against its type and constraints, and every error one
:class:`ConfigError` sentence naming ``params.yaml``, the dotted key and what was expected. A
value lives in params.yaml (and the profiles) only: section configs have no defaults.
"""

from __future__ import annotations

import difflib
import logging
import os
import random
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, Field

from lexgraph.core.errors import ConfigError, DataError
from lexgraph.core.inputs import DuplicateKeyError, load_yaml, yaml_problem
from lexgraph.core.settings import PARAMS_FILE as DEFAULT_PARAMS
from lexgraph.core.settings import Bool, Expect, Int, Settings, Str, read_section
from lexgraph.core.settings import bad_value as bad_value
from lexgraph.core.settings import params_error as params_error
from lexgraph.core.settings import without_params_file as without_params_file

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
