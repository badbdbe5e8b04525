"""Backbones of the text encoders: loading a Hugging Face encoder (with its checks of the
saved files), saving a frozen one by reference (``backbone.json``), choosing its trainable
layers, and the helpers every encoder's ``encode`` shares (device, autocast, progress,
longest-first batches)."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lexgraph.core.errors import ConfigError, DataError, LexgraphError, SettingError
from lexgraph.core.hub import check_model_files, first_line
from lexgraph.core.inputs import read_json_object
from lexgraph.core.io import write_json
from lexgraph.core.layout import producer, restore_hint
from lexgraph.core.progress import progress

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
TOKEN_POOLING = ("cls", "mean")
#: a backbone that did not train, saved by reference to the checkpoint directory it was loaded from
BACKBONE_REF = "backbone.json"


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
        raise SettingError(
            "trainable_layers", trainable_layers, f"null or an integer in [0, {len(layers)}] (the backbone's layers)"
        )
    backbone.requires_grad_(False)
    for layer in layers[len(layers) - trainable_layers :]:
        layer.requires_grad_(True)


def split_layers(backbone: nn.Module, trainable_layers: int) -> tuple[nn.ModuleList, nn.ModuleList]:
    """``(frozen, top)``: the blocks below the top ``trainable_layers`` and those blocks."""
    layers = transformer_layers(backbone)
    cut = len(layers) - trainable_layers
    return layers[:cut], layers[cut:]


def _run_blocks(backbone: nn.Module, blocks, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``hidden`` (n, seq, dim) through ``blocks`` with the padding mask (n, seq) as an additive mask."""
    blocked = ~attention_mask.bool()[:, None, None, :]  # (n, 1, 1, seq): padding keys
    mask = torch.zeros(blocked.shape, dtype=hidden.dtype, device=hidden.device).masked_fill(
        blocked, torch.finfo(hidden.dtype).min
    )  # (n, 1, 1, seq), additive
    for block in blocks:
        out = block(hidden, attention_mask=mask)
        hidden = out[0] if isinstance(out, tuple) else out  # (n, seq, dim)
    return hidden


@torch.no_grad()
def frozen_states(backbone: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, trainable_layers: int):
    """The token states ``(n, seq, dim)`` entering the top ``trainable_layers`` blocks: the embeddings
    and the frozen blocks below, in eval mode (no dropout), computed once and cached by the caller."""
    frozen, _ = split_layers(backbone, trainable_layers)
    was_training = backbone.training
    backbone.eval()
    hidden = backbone.embeddings(input_ids=input_ids)  # (n, seq, dim)
    hidden = _run_blocks(backbone, frozen, hidden, attention_mask)
    backbone.train(was_training)
    return hidden


def top_states(backbone: nn.Module, hidden: torch.Tensor, attention_mask: torch.Tensor, trainable_layers: int):
    """The last hidden states ``(n, seq, dim)`` from cached :func:`frozen_states`: the top
    ``trainable_layers`` blocks only (in the backbone's mode, with gradients)."""
    _, top = split_layers(backbone, trainable_layers)
    return _run_blocks(backbone, top, hidden, attention_mask)


# ---------------------------------------------------------------------------
# Backbone loading
# ---------------------------------------------------------------------------


def save_backbone_ref(directory: str | os.PathLike, source: str | os.PathLike) -> None:
    """Write ``directory/backbone.json``: the backbone is the checkpoint in ``source``, unchanged
    (a path as the stage was given it: relative paths are relative to the workspace)."""
    write_json({"path": str(source), "frozen": True}, Path(directory) / BACKBONE_REF, ensure_ascii=True)


def backbone_ref(
    directory: str | os.PathLike, what: str, *, root: str | os.PathLike = ".", required: bool = True
) -> Path | None:
    """The checkpoint directory that ``directory/backbone.json`` names, under ``root`` (the
    workspace) when relative; ``None`` when ``directory`` holds no reference. A damaged
    reference, or (``required``) a missing directory, is one line naming the file and the
    stage to rerun (``what``: the encoder the reference stands for, for the message)."""
    reference = Path(directory) / BACKBONE_REF
    if not (reference.exists() or reference.is_symlink()):
        return None
    path = read_json_object(
        reference,
        what=f"{what}'s checkpoint directory",
        keys={"path": (lambda v: isinstance(v, str) and bool(v), "a directory")},
        fix=restore_hint(directory),
    )["path"]
    target = Path(root, path)
    if required and not target.is_dir():
        raise LexgraphError(f"{reference}: {what} lives in '{path}', which is missing; {restore_hint(path)}")
    return target


def _no_pooler_kwargs(config) -> dict[str, Any]:
    """BERT-like backbones accept ``add_pooling_layer``; we only use [CLS] hidden states."""
    return {"add_pooling_layer": False} if config.model_type in {"bert", "camembert", "roberta", "xlm-roberta"} else {}


def is_local(name_or_path: str | os.PathLike) -> bool:
    """Whether ``name_or_path`` means a local directory rather than a hub model name: something
    is there (even a broken link or a loop), the path is absolute, or it is a workspace artefact."""
    return os.path.lexists(name_or_path) or Path(name_or_path).is_absolute() or producer(name_or_path) is not None


def load_backbone(name_or_path: str | os.PathLike, *, random_init: bool = False):
    """Return ``(model, tokenizer)`` for an HF name or directory.

    ``random_init=True`` builds a randomly initialised model with the same config and
    tokenizer as ``name_or_path`` (the "base" ablation of the sample profile); the
    caller seeds torch beforehand for reproducibility. A local directory's files are
    checked first (:func:`check_model_files`), and any failure to load it is a
    :class:`DataError` naming it and the stage that writes it.
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    local = is_local(name_or_path)
    if local:
        check_model_files(name_or_path, weights=not random_init)
    info: dict[str, Any] = {}
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
    except Exception as exc:  # noqa: BLE001 - a local checkpoint that does not load is damaged input
        if local:  # name the damaged file if there is one (a large tokenizer.json is parsed only now)
            check_model_files(name_or_path, max_json_bytes=None, weights=not random_init)
            raise DataError(
                name_or_path,
                f"not a loadable Hugging Face checkpoint ({type(exc).__name__}: "
                f"{first_line(exc)}); {restore_hint(name_or_path)}",
            ) from exc
        if isinstance(exc, OSError):
            raise LexgraphError(
                f"cannot load the transformer '{name_or_path}' ({exc.__class__.__name__}): expected a local "
                "Hugging Face directory (config.json, weights, tokenizer) or a hub model name with the hub reachable"
            ) from exc
        raise
    if info.get("unexpected_keys"):
        _refuse_weights_without_a_place(model, name_or_path, sorted(info["unexpected_keys"]))
    if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None or tokenizer.pad_token_id is None:
        raise ConfigError(f"tokenizer of '{name_or_path}' lacks a CLS, SEP or PAD token; a BERT-like model is expected")
    return model, tokenizer


def _refuse_weights_without_a_place(model: nn.Module, name_or_path, unexpected: list[str]) -> None:
    """Refuse a checkpoint whose weights hold parameters of the model's own modules that its
    config.json has no place for (a config with fewer layers than the weights: loading would
    silently drop the extra layers). Weights of another head (a masked-LM checkpoint's ``cls.*``,
    ``lm_head.*``, a pooler the encoder does not build) are dropped as before."""
    own = {name for name, _ in model.named_children()}
    extra = [key for key in unexpected if key.split(".", 1)[0] in own]
    if not extra:
        log.debug("%s: unused weights: %s", name_or_path, unexpected)
        return
    layers = sorted({int(m.group(1)) for k in extra if (m := re.search(r"\blayer\.(\d+)\.", k))})
    config_layers = getattr(model.config, "num_hidden_layers", None)
    detail = (
        f"the weights hold layer(s) {', '.join(map(str, layers))} but config.json has num_hidden_layers = "
        f"{config_layers}"
        if layers
        else f"{len(extra)} weight(s) have no place in the model config.json describes (first: {extra[0]})"
    )
    raise DataError(
        Path(name_or_path) / "config.json",
        f"does not match the weights: {detail}; expected the config.json saved with these weights (loading "
        f"would silently drop {len(extra)} weight(s)); {restore_hint(name_or_path)}",
    )


def max_positions(config) -> int | None:
    """Usable token positions of a backbone (RoBERTa-style models reserve two)."""
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and config.model_type in {"camembert", "roberta", "xlm-roberta"}:
        limit -= 2
    return limit


def _module_device(module: nn.Module) -> torch.device:
    return next(iter(module.parameters()), torch.empty(0)).device


def _bar(desc: str, show: bool):
    """A progress wrapper for :func:`~lexgraph.core.distributed.map_batches`."""
    return lambda batches: progress(batches, desc, unit="batch", disable=not show)


def longest_first(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of ``lengths`` sorted longest first (ties: input order), cut into batches."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def _autocast(device: torch.device):
    from lexgraph.core.config import autocast

    return autocast(device)
