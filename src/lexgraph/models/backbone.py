"""Backbones of the text encoders: loading a Hugging Face encoder (with its checks of the
saved files), choosing its trainable layers, and the helpers every encoder's ``encode``
shares (device, autocast, progress, longest-first batches)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Sequence, Any

import torch
from torch import nn

from lexgraph.errors import ConfigError, LexgraphError
from lexgraph.progress import progress

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
TOKEN_POOLING = ("cls", "mean")


def transformer_layers(backbone: nn.Module) -> nn.ModuleList:
    """The stack of transformer blocks of a BERT-like backbone."""
    layers = getattr(getattr(backbone, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError(f"{type(backbone).__name__}: no encoder.layer stack; a BERT-like backbone is expected")
    return layers


def set_trainable_layers(backbone: nn.Module, trainable_layers: int | None) -> None:
    """``None``: every weight trains; ``N``: only the top ``N`` transformer blocks train
    (embeddings and lower blocks frozen; ``0`` freezes the backbone)."""
    layers = transformer_layers(backbone)
    if trainable_layers is None:
        backbone.requires_grad_(True)
        return
    if not 0 <= trainable_layers <= len(layers):
        raise ConfigError(f"trainable layers = {trainable_layers}, expected null or 0..{len(layers)}")
    backbone.requires_grad_(False)
    for layer in layers[len(layers) - trainable_layers :]:
        layer.requires_grad_(True)


# ---------------------------------------------------------------------------
# Backbone loading
# ---------------------------------------------------------------------------


def _no_pooler_kwargs(config) -> dict[str, Any]:
    """BERT-like backbones accept ``add_pooling_layer``; we only use [CLS] hidden states."""
    return {"add_pooling_layer": False} if config.model_type in {"bert", "camembert", "roberta", "xlm-roberta"} else {}


RESTORE = "rerun `dvc repro` (or `dvc checkout`) to restore it"


def check_safetensors(path: str | os.PathLike) -> None:
    """Raise a :class:`LexgraphError` naming ``path`` if it is not a complete safetensors
    file (truncated, corrupt header); reads the header only."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            fh.keys()
    except (SafetensorError, OSError) as exc:
        reason = str(exc).removeprefix("Error while deserializing header: ")
        raise LexgraphError(f"{path}: truncated or corrupt weights file ({reason}); {RESTORE}") from None


def check_model_files(directory: str | os.PathLike, max_json_bytes: int | None = 1 << 20) -> None:
    """Check a local Hugging Face directory's weights (every ``*.safetensors``, header
    only) and JSON files (those up to ``max_json_bytes``; ``None``: all) before
    transformers loads them, so a damaged file is named in one sentence."""
    directory = Path(directory)
    for path in sorted(directory.glob("*.safetensors")):
        check_safetensors(path)
    for path in sorted(directory.glob("*.json")):
        if max_json_bytes is not None and path.stat().st_size > max_json_bytes:
            continue  # e.g. a 17 MB tokenizer.json: parsed only to diagnose a failed load
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LexgraphError(f"{path}: truncated or corrupt JSON ({exc}); {RESTORE}") from None


def load_backbone(name_or_path: str | os.PathLike, *, random_init: bool = False):
    """Return ``(model, tokenizer)`` for an HF name or directory.

    ``random_init=True`` builds a randomly initialised model with the same config and
    tokenizer as ``name_or_path`` (the "base" ablation of the sample profile); the
    caller seeds torch beforehand for reproducibility. A local directory's files are
    checked first (:func:`check_model_files`).
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    local = Path(name_or_path).is_dir()
    if local:
        check_model_files(name_or_path)
    try:
        config = AutoConfig.from_pretrained(name_or_path)
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        if random_init:
            model = AutoModel.from_config(config, **_no_pooler_kwargs(config))
        else:
            # A masked-LM checkpoint carries an LM head the encoder drops: log the key
            # report ourselves instead of transformers' multi-line warning.
            previous = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()
            try:
                model, info = AutoModel.from_pretrained(
                    name_or_path, output_loading_info=True, **_no_pooler_kwargs(config)
                )
            finally:
                hf_logging.set_verbosity(previous)
            if info.get("missing_keys"):
                log.warning("%s: weights newly initialised: %s", name_or_path, sorted(info["missing_keys"]))
            if info.get("unexpected_keys"):
                log.debug("%s: unused weights: %s", name_or_path, sorted(info["unexpected_keys"]))
    except OSError as exc:
        if local:
            check_model_files(name_or_path, max_json_bytes=None)
        raise LexgraphError(
            f"cannot load the transformer '{name_or_path}' ({exc.__class__.__name__}): expected a local "
            "Hugging Face directory (config.json, weights, tokenizer) or a hub model name with the hub reachable"
        ) from exc
    except Exception:
        if local:  # a damaged large file (tokenizer.json) fails inside transformers/tokenizers: name it
            check_model_files(name_or_path, max_json_bytes=None)
        raise
    if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None or tokenizer.pad_token_id is None:
        raise ConfigError(f"tokenizer of '{name_or_path}' lacks a CLS, SEP or PAD token; a BERT-like model is expected")
    return model, tokenizer


def _max_positions(config) -> int | None:
    """Usable token positions of a backbone (RoBERTa-style models reserve two)."""
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and config.model_type in {"camembert", "roberta", "xlm-roberta"}:
        limit -= 2
    return limit


def _module_device(module: nn.Module) -> torch.device:
    return next(iter(module.parameters()), torch.empty(0)).device


def _bar(desc: str, show: bool):
    """A progress wrapper for :func:`~lexgraph.distributed.map_batches`."""
    return lambda batches: progress(batches, desc, unit="batch", disable=not show)


def longest_first(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of ``lengths`` sorted longest first (ties: input order), cut into batches."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def _autocast(device: torch.device):
    from lexgraph.config import autocast

    return autocast(device)
