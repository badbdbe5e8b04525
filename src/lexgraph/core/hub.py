"""Loading Hugging Face checkpoints by name or directory, with one-sentence errors.

:func:`check_model_files` checks a local checkpoint directory before transformers reads it
(every entry readable, config, tokenizer vocabulary, weights, JSON and safetensors headers
intact), so that a damaged one is named with what to do.

:func:`from_pretrained` wraps any ``from_pretrained`` loader; :func:`hub_reachable` probes
the hub once (a few seconds at most) so that an offline machine is told at once instead
of waiting through the hub client's retries; :func:`hub_access` wraps any hub call (models
here, the BSARD dataset in :mod:`lexgraph.data.fetch_hub`): it silences the hub clients'
retry warnings and, when the hub cannot be reached, switches them to offline mode (local
cache only, no retries), so that the user reads one sentence, not twenty retry logs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lexgraph.core import layout
from lexgraph.core.errors import DataError, HubUnreachableError
from lexgraph.core.inputs import read_json
from lexgraph.core.io import check_file

log = logging.getLogger(__name__)

HUB_ENDPOINT = "https://huggingface.co"
#: loggers of the hub clients and their HTTP stacks; their retry warnings are noise to a user
HUB_LOGGERS = (
    "huggingface_hub",
    "datasets",
    "transformers",
    "sentence_transformers",
    "urllib3",
    "httpx",
    "httpcore",
    "filelock",
    "fsspec",
)
_TRUE = {"1", "true", "yes", "on"}


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0].rstrip(".") if text else type(exc).__name__


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").strip() or HUB_ENDPOINT


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub (``HF_ENDPOINT``) accepts a TCP connection; ``False`` under
    ``HF_HUB_OFFLINE=1``. Behind an HTTPS proxy (``HTTPS_PROXY``/``ALL_PROXY``) the proxy is
    probed instead, since the hub is only reached through it."""
    if offline_requested():
        return False
    endpoint = urlparse(hub_endpoint())
    proxy = next(
        (
            os.environ[k]
            for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
            if os.environ.get(k, "").strip()
        ),
        None,
    )
    url = urlparse(proxy if "://" in (proxy or "") else f"http://{proxy}") if proxy else endpoint
    default_port = 443 if url.scheme == "https" else 80
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or default_port), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def hub_access() -> Iterator[bool]:
    """Run hub calls quietly; yield whether the hub is reachable.

    Inside the block the hub clients log errors only (no retry warnings, which
    ``huggingface_hub`` prints twice: through its own handler and through ours), and when
    the hub cannot be reached they run in offline mode: cached files still load, anything
    else fails at once instead of after a minute of retries. Import ``datasets`` or
    ``transformers`` before entering: importing them resets their log level.
    """
    import huggingface_hub.constants as hf_constants

    online = hub_reachable()
    if not online:
        log.debug("the Hugging Face hub (%s) is not reachable: offline mode, local cache only", hub_endpoint())
    levels = {name: logging.getLogger(name).level for name in HUB_LOGGERS}
    for name in HUB_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    saved: list[tuple[Any, str, Any]] = []
    env = os.environ.get("HF_HUB_OFFLINE")
    if not online:
        os.environ["HF_HUB_OFFLINE"] = "1"
        targets = [hf_constants]
        if "datasets.config" in sys.modules:
            targets.append(sys.modules["datasets.config"])
        for module in targets:
            for attr in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
                if hasattr(module, attr):
                    saved.append((module, attr, getattr(module, attr)))
                    setattr(module, attr, True)
    try:
        yield online
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)
        if not online:
            if env is None:
                os.environ.pop("HF_HUB_OFFLINE", None)
            else:
                os.environ["HF_HUB_OFFLINE"] = env
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def offline_requested() -> bool:
    """Whether the user asked for offline mode (``HF_HUB_OFFLINE=1``)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def unreachable_reason(name: str, requested: bool) -> str:
    """Why the hub name ``name`` could not be loaded while the hub is unreachable (one clause);
    ``requested``: :func:`offline_requested`, read before :func:`hub_access` sets offline mode."""
    if requested:
        return f"HF_HUB_OFFLINE is set and '{name}' is not in the local Hugging Face cache"
    return (
        f"the Hugging Face hub at {hub_endpoint()} cannot be reached from this machine and '{name}' is not in the "
        "local Hugging Face cache"
    )


# ---------------------------------------------------------------------------
# Checks of a local checkpoint directory
# ---------------------------------------------------------------------------

#: files a tokenizer is built from: a local checkpoint needs one (transformers would otherwise
#: build a tokenizer that knows its special tokens only)
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "sentencepiece.bpe.model",
    "spiece.model",
    "tokenizer.model",
)
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
#: entries of a checkpoint directory that must be readable files (not loops, directories, ...)
FILE_SUFFIXES = (".json", ".safetensors", ".txt", ".model", ".bin")


def check_safetensors(path: str | os.PathLike, remedy: str | None = None) -> None:
    """Raise a :class:`DataError` naming ``path`` if it is not a complete safetensors file
    (missing, unreadable, truncated, corrupt header); reads the header only. ``remedy``
    defaults to rerunning the stage that writes ``path`` (:func:`lexgraph.core.layout.restore_hint`)."""
    from safetensors import SafetensorError, safe_open

    remedy = remedy or layout.restore_hint(path)
    check_file(path, "the weights file", remedy)
    try:
        with safe_open(str(path), framework="pt") as fh:
            fh.keys()
    except (SafetensorError, OSError) as exc:
        reason = str(exc).removeprefix("Error while deserializing header: ")
        raise DataError(path, f"truncated or corrupt weights file ({reason}); {remedy}") from None


def check_model_files(
    directory: str | os.PathLike,
    max_json_bytes: int | None = 1 << 20,
    *,
    weights: bool = True,
    remedy: str | None = None,
) -> None:
    """Check a local Hugging Face directory before transformers loads it, so that a damaged
    one is named in one sentence with the ``remedy`` (default: rerun the stage that writes
    it): the directory itself, every file-like entry (a symbolic link loop, a directory
    where a file belongs, an unreadable file), ``config.json``, a tokenizer vocabulary,
    weights (``weights=False``: not needed), every ``*.safetensors`` header and the JSON
    files up to ``max_json_bytes`` (``None``: all)."""
    directory = Path(directory)
    remedy = remedy or layout.restore_hint(directory)
    check_file(directory, "the model directory", remedy, directory=True)
    entries = sorted(directory.iterdir())
    for path in entries:
        if path.suffix in FILE_SUFFIXES:
            check_file(path, "this model file", remedy)
    check_file(directory / "config.json", "the model's config.json", remedy)
    if not any((directory / name).is_file() for name in TOKENIZER_FILES) and not any(
        p.suffix == ".model" for p in entries
    ):
        raise DataError(directory, f"no tokenizer vocabulary, expected one of {', '.join(TOKENIZER_FILES)}; {remedy}")
    if weights and not any((directory / name).is_file() for name in WEIGHT_FILES):
        raise DataError(directory, f"no model weights, expected {WEIGHT_FILES[0]}; {remedy}")
    for path in entries:
        if path.suffix == ".safetensors":
            check_safetensors(path, remedy)
    for path in entries:
        if path.suffix == ".json" and (max_json_bytes is None or path.stat().st_size <= max_json_bytes):
            read_json(
                path, what="a JSON file", fix=remedy
            )  # a 17 MB tokenizer.json: parsed only to diagnose a failed load


def from_pretrained(loader: Callable[..., Any], name: str, *, param: str, **kwargs) -> Any:
    """``loader(name, **kwargs)`` (a ``from_pretrained``) with one-sentence errors.

    A local directory that cannot be loaded (a file missing, unreadable or corrupt) raises
    :class:`DataError` saying what to do; a hub name that cannot be fetched (offline, hub
    unreachable, unknown model) raises :class:`HubUnreachableError` saying what to do.
    ``param`` is the dotted params key holding ``name``, quoted in the message.
    """
    from huggingface_hub.errors import HfHubHTTPError

    if Path(name).is_dir():
        remedy = (
            layout.restore_hint(name)
            if layout.producer(name)
            else f"expected a readable Hugging Face checkpoint directory (params '{param}')"
        )
        check_model_files(name, remedy=remedy)
        try:
            return loader(name, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a local checkpoint that does not load is damaged input
            check_model_files(name, max_json_bytes=None, remedy=remedy)
            raise DataError(
                name, f"not a loadable Hugging Face checkpoint ({type(exc).__name__}: {first_line(exc)}); {remedy}"
            ) from exc
    requested = offline_requested()
    with hub_access() as online:
        try:
            return loader(name, **kwargs)
        except (OSError, HfHubHTTPError) as exc:
            reason = first_line(exc) if online else unreachable_reason(name, requested)
            raise HubUnreachableError(
                f"could not load '{name}' (params '{param}'): {reason}; connect to the internet with "
                f"HF_HUB_OFFLINE unset, or run `hf download {name}` on a connected machine and copy the cache "
                f"here, or set '{param}' to a local checkpoint directory"
            ) from exc
