"""Text encoders of the dense statute retriever (DSR) and its graph-augmented variants.

One abstraction, :class:`TextEncoder`: a Hugging Face backbone (``AutoModel``) plus its
tokenizer, with a uniform API

* ``tokenize(texts) -> dict[str, Tensor]`` — model inputs for a batch of texts;
* ``forward(input_ids, attention_mask) -> (batch, dim)`` — differentiable embeddings;
* ``encode(texts, batch_size, device) -> (n, dim)`` — float32 embeddings, no grad, progress;
* ``save_pretrained(dir)`` / ``from_pretrained(dir)`` — a Hugging Face directory
  (backbone via ``save_pretrained`` + tokenizer) plus a small JSON of our settings.

Two encoders follow G-DSR (Louis, van Dijck & Spanakis, EACL 2023, Section 3.1):

* :class:`QueryEncoder` — the backbone's [CLS] vector of the (truncated) question.
* :class:`HierarchicalArticleEncoder` — a statute article can be far longer than the
  backbone's 512 positions, so its tokens are split into chunks of
  ``max_chunk_length`` tokens (each ``[CLS] … [SEP]``), at most
  ``max_document_length // max_chunk_length`` chunks (longer articles are truncated);
  each chunk is encoded by the shared backbone and represented by its [CLS] vector;
  learnable chunk-position embeddings are added; a small ``nn.TransformerEncoder``
  contextualises the chunk sequence (padded chunks masked out); max or mean pooling
  over the real chunks gives the article embedding.

:class:`DSR` bundles both with the :class:`~lexgraph.losses.InfoNCELoss` objective.
Embeddings are raw (not L2-normalised); similarity is cosine / temperature.

Model-family conventions travel with the base checkpoint: a ``lexgraph_base.json`` next to
it (written by the ``pretrain`` stage, see :mod:`lexgraph.models.base`) gives the text
prefixes (E5: ``"query: "`` / ``"passage: "``); encoders read them when they start from a
base model and save them with their own settings.

For a CPU budget the article side can keep its chunk encoder **frozen**: the chunk vectors
are then computed once (stage ``encode_chunks``, :mod:`lexgraph.chunks`) and only the
chunk-level module trains, through :meth:`HierarchicalArticleEncoder.aggregate`. With
``identity_init`` the chunk-level Transformer is pre-LN with zero-initialised residual
branches and zero chunk-position embeddings, so before training the article vector is
exactly the pooled chunk vectors (``token_mean``: the base model's own windowed mean).

``token_pooling`` picks how a sequence (question or chunk) becomes one vector: ``cls``
(G-DSR, the default) or ``mean`` over its non-padding tokens. ``mean`` is an addition
of ours for weak backbones: the embedded sample's tiny BERT, MLM-trained from scratch
for a few hundred steps, has an untrained [CLS] position and does not learn to
retrieve with it, while it does with mean pooling.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from lexgraph.distributed import map_batches
from lexgraph.errors import ConfigError, LexgraphError
from lexgraph.losses.InfoNCELoss import InfoNCELoss
from lexgraph.models.family import read_base_info
from lexgraph.progress import progress

log = logging.getLogger(__name__)

QUERY_CONFIG = "query_encoder.json"
HIERARCHICAL_CONFIG = "hierarchical.json"
HIERARCHICAL_WEIGHTS = "hierarchical.safetensors"
DSR_CONFIG = "dsr.json"
FORMAT_VERSION = 1
TOKEN_POOLING = ("cls", "mean")
CHUNK_POOLING = ("max", "mean", "token_mean")
BACKBONE_REF = "backbone.json"  # a frozen chunk encoder saved by reference to its base checkpoint


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


def _autocast(device: torch.device):
    from lexgraph.config import autocast

    return autocast(device)


# ---------------------------------------------------------------------------
# Shared abstraction
# ---------------------------------------------------------------------------


class TextEncoder(nn.Module):
    """A Hugging Face backbone + tokenizer mapping texts to ``(batch, dim)`` vectors.

    Subclasses implement :meth:`tokenize`, :meth:`forward` and :meth:`_lengths` (a
    cost per text, used to sort texts by length so that batches pad little).
    ``token_pooling``: ``cls`` ([CLS] hidden state) or ``mean`` (over real tokens).
    """

    def __init__(self, backbone: nn.Module | None, tokenizer, token_pooling: str = "cls", prefix: str = "",
                 config=None) -> None:
        super().__init__()
        if token_pooling not in TOKEN_POOLING:
            raise ConfigError(f"token_pooling = {token_pooling!r}, expected one of {', '.join(TOKEN_POOLING)}")
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.token_pooling = token_pooling
        self.prefix = str(prefix)
        self.backbone_config = backbone.config if backbone is not None else config

    @property
    def dim(self) -> int:
        return int(self.backbone_config.hidden_size)

    def _pool(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """One vector per sequence, ``(n, seq)`` -> ``(n, dim)``: [CLS] or masked mean."""
        if self.backbone is None:
            raise LexgraphError("this article encoder was loaded without its chunk encoder (chunk-level module only)")
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (n, seq, dim)
        if self.token_pooling == "cls":
            return hidden[:, 0]  # (n, dim)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (n, seq, 1)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (n, dim)

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _lengths(self, texts: Sequence[str]) -> list[int]:  # pragma: no cover - abstract
        raise NotImplementedError

    @torch.no_grad()
    def encode(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        device: torch.device | str | None = None,
        show_progress: bool = True,
        desc: str | None = None,
        distributed: bool = False,
    ) -> torch.Tensor:
        """Embed ``texts`` in eval mode without gradients: float32 ``(n, dim)`` on CPU.

        ``device`` moves the module there first (default: where it already is). Texts
        are processed longest first in batches of ``batch_size`` and returned in input
        order. Mixed precision on CUDA. The module's train/eval mode is restored.
        ``distributed``: with a process group open (:func:`lexgraph.distributed.session`),
        each rank runs a contiguous slice of the batches and every rank gets all rows.
        """
        if device is not None:
            self.to(device)
        device = _module_device(self)
        texts = list(texts)
        out = torch.empty(len(texts), self.dim, dtype=torch.float32)  # (n, dim)
        if not texts:
            return out
        lengths = self._lengths(texts)
        order = sorted(range(len(texts)), key=lambda i: (-lengths[i], i))
        batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]

        def run(idx: list[int]) -> torch.Tensor:
            inputs = {k: v.to(device) for k, v in self.tokenize([texts[i] for i in idx]).items()}
            with _autocast(device):
                return self(**inputs).float().cpu()  # (batch, dim)

        was_training = self.training
        self.eval()
        try:
            results = map_batches(run, batches, distributed=distributed, wrap=_bar(desc or f"encode {type(self).__name__}",
                                                                                  show_progress))
        finally:
            self.train(was_training)
        for idx, emb in zip(batches, results):
            out[torch.tensor(idx)] = emb
        return out

    # -- persistence ------------------------------------------------------
    def _save_backbone(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)


# ---------------------------------------------------------------------------
# Query encoder
# ---------------------------------------------------------------------------


def write_sentence_transformers_config(
    directory: Path, dim: int, max_length: int, token_pooling: str, prompts: dict[str, str] | None = None
) -> None:
    """sentence-transformers module files (Transformer -> Pooling) for an HF encoder dir;
    ``prompts`` (e.g. ``{"query": "query: "}``) go to ``config_sentence_transformers.json``."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    pooling = {
        "word_embedding_dimension": int(dim),
        "pooling_mode_cls_token": token_pooling == "cls",
        "pooling_mode_mean_tokens": token_pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    (directory / "1_Pooling").mkdir(exist_ok=True)
    for path, obj in (
        (directory / "modules.json", modules),
        (directory / "sentence_bert_config.json", {"max_seq_length": int(max_length), "do_lower_case": False}),
        (directory / "1_Pooling" / "config.json", pooling),
        (directory / "config_sentence_transformers.json",
         {"prompts": dict(prompts or {}), "default_prompt_name": next(iter(prompts), None) if prompts else None}),
    ):
        path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


class QueryEncoder(TextEncoder):
    """Embedding ([CLS] or mean) of ``prefix + question`` truncated to ``max_length`` tokens.

    ``trainable_layers`` (``None``: all; ``N``: the top ``N`` blocks, embeddings frozen) is
    applied at construction and saved, so every stage that fine-tunes this encoder
    (``train_dsr``, QABISAR's distillation) trains the same weights.
    """

    def __init__(self, backbone: nn.Module, tokenizer, max_length: int = 512, token_pooling: str = "cls",
                 prefix: str = "", trainable_layers: int | None = None) -> None:
        super().__init__(backbone, tokenizer, token_pooling, prefix)
        limit = _max_positions(backbone.config)
        self.max_length = int(min(max_length, limit) if limit else max_length)
        self.trainable_layers = trainable_layers
        set_trainable_layers(backbone, trainable_layers)

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(
            [self.prefix + t for t in texts], padding=True, truncation=True, max_length=self.max_length,
            return_tensors="pt",
        )
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}  # (batch, seq) each

    def _lengths(self, texts: Sequence[str]) -> list[int]:
        return [len(t) for t in texts]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``(batch, seq)`` token ids and mask -> ``(batch, dim)`` embeddings."""
        return self._pool(input_ids, attention_mask)  # (batch, dim)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """HF dir (backbone + tokenizer) + ``query_encoder.json``, laid out so that
        ``sentence_transformers.SentenceTransformer(directory)`` loads the same encoder."""
        directory = Path(directory)
        self._save_backbone(directory)
        (directory / QUERY_CONFIG).write_text(
            json.dumps(
                {"format_version": FORMAT_VERSION, "token_pooling": self.token_pooling, "max_length": self.max_length,
                 "prefix": self.prefix, "trainable_layers": self.trainable_layers},
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
        prompts = {"query": self.prefix} if self.prefix else None
        write_sentence_transformers_config(directory, self.dim, self.max_length, self.token_pooling, prompts)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike,
        *,
        max_length: int | None = None,
        token_pooling: str | None = None,
        random_init: bool = False,
        trainable_layers: int | None | str = "saved",
    ) -> "QueryEncoder":
        """Load a saved query encoder, or start one from any HF backbone (name or dir).

        Settings not given come from the saved ``query_encoder.json`` if any, else the
        defaults (512 tokens, [CLS] pooling, all layers trainable); the prefix comes from
        the saved settings or the base checkpoint's ``lexgraph_base.json``.
        """
        backbone, tokenizer = load_backbone(name_or_path, random_init=random_init)
        settings = Path(name_or_path) / QUERY_CONFIG
        saved = json.loads(settings.read_text(encoding="utf-8")) if settings.is_file() else {}
        prefix = saved.get("prefix", read_base_info(name_or_path)["query_prefix"])
        return cls(
            backbone,
            tokenizer,
            max_length=max_length or saved.get("max_length", 512),
            token_pooling=token_pooling or saved.get("token_pooling", "cls"),
            prefix=prefix,
            trainable_layers=saved.get("trainable_layers") if trainable_layers == "saved" else trainable_layers,
        )


# ---------------------------------------------------------------------------
# Hierarchical article encoder
# ---------------------------------------------------------------------------


def chunk_token_ids(
    tokenizer, texts: Sequence[str], max_chunk_length: int, max_document_length: int, prefix: str = ""
) -> list[list[list[int]]]:
    """Split each text into chunks of token ids, each ``[CLS] prefix … [SEP]``.

    The text is tokenized without special tokens and truncated to
    ``max_chunks * body`` tokens with ``max_chunks = max_document_length // max_chunk_length``
    and ``body = max_chunk_length - 2 - len(prefix tokens)``; the tokens are cut into
    consecutive pieces of ``body`` and each piece is wrapped in CLS (+ the prefix's
    tokens, e.g. E5's ``passage:``) / SEP, so no chunk exceeds ``max_chunk_length``.
    An empty text gives one chunk ``[CLS] prefix [SEP]``.
    Returns ``chunks[text][chunk] = list of token ids``.
    """
    prefix_ids = tokenizer(prefix.strip(), add_special_tokens=False)["input_ids"] if prefix.strip() else []
    specials = 2 + len(prefix_ids)  # [CLS], [SEP] and the prefix
    body = max_chunk_length - specials
    max_chunks = max_document_length // max_chunk_length
    if body < 1 or max_chunks < 1:
        raise ConfigError(
            f"max_chunk_length = {max_chunk_length} and max_document_length = {max_document_length}: "
            f"expected max_chunk_length >= {specials + 1} and max_document_length >= max_chunk_length"
        )
    enc = tokenizer(
        list(texts), add_special_tokens=False, truncation=True, max_length=max_chunks * body, verbose=False
    )
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    out = []
    for ids in enc["input_ids"]:
        pieces = [ids[i : i + body] for i in range(0, len(ids), body)] or [[]]
        out.append([[cls_id, *prefix_ids, *piece, sep_id] for piece in pieces])
    return out


def collate_chunks(chunks: Sequence[Sequence[Sequence[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad chunked articles to ``input_ids``/``attention_mask`` ``(batch, n_chunks, chunk_len)``.

    Missing chunks are all-padding with an all-zero attention mask; that is how the
    encoder recognises them.
    """
    n_chunks = max(len(doc) for doc in chunks)
    length = max(len(chunk) for doc in chunks for chunk in doc)
    input_ids = torch.full((len(chunks), n_chunks, length), pad_id, dtype=torch.long)  # (batch, chunks, len)
    attention_mask = torch.zeros((len(chunks), n_chunks, length), dtype=torch.long)  # (batch, chunks, len)
    for b, doc in enumerate(chunks):
        for c, chunk in enumerate(doc):
            input_ids[b, c, : len(chunk)] = torch.tensor(chunk, dtype=torch.long)
            attention_mask[b, c, : len(chunk)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


PAD_MULTIPLE = 8  # trimmed sequence lengths are rounded up to this (tensor-core friendly shapes)
BUCKET_RATIO = 0.75  # a new length bucket opens below this fraction of the current bucket's longest
MIN_BUCKET = 16  # ... once the current bucket holds at least this many sequences


def trimmed_length(longest: int, limit: int, multiple: int = PAD_MULTIPLE) -> int:
    """``longest`` rounded up to a multiple of ``multiple``, at most ``limit``."""
    return min(limit, -(-int(longest) // multiple) * multiple)


def length_buckets(lengths: Sequence[int], min_rows: int = MIN_BUCKET, ratio: float = BUCKET_RATIO) -> list[list[int]]:
    """Group sequence indices by length so that each group pads little.

    Indices are sorted longest first (ties by index) and cut greedily: a new bucket opens
    at a sequence shorter than ``ratio`` x the current bucket's longest, once the current
    bucket holds ``min_rows`` sequences. Each bucket is then run trimmed to its longest
    sequence, so padding is at most ``1 - ratio`` of a bucket (small buckets aside).
    """
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    buckets: list[list[int]] = []
    for i in order:
        if buckets and (len(buckets[-1]) < min_rows or lengths[i] >= ratio * lengths[buckets[-1][0]]):
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets


def pack_chunks(chunks: Sequence[Sequence[Sequence[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Packed chunks: every article's real chunks, one row each, in article order.

    Returns ``input_ids``/``attention_mask`` ``(m, chunk_len)`` (``m`` = real chunks in
    all, ``chunk_len`` = the longest) and ``chunk_counts`` ``(batch,)``: article ``b`` owns
    rows ``sum(counts[:b]) : sum(counts[:b + 1])``. No empty chunk slots are stored or
    encoded (compare :func:`collate_chunks`).
    """
    flat = [chunk for doc in chunks for chunk in doc]
    if any(len(doc) == 0 for doc in chunks):
        raise ValueError("every article needs at least one chunk")
    length = max(len(chunk) for chunk in flat)
    input_ids = torch.full((len(flat), length), pad_id, dtype=torch.long)  # (m, len)
    attention_mask = torch.zeros((len(flat), length), dtype=torch.long)  # (m, len)
    for row, chunk in enumerate(flat):
        input_ids[row, : len(chunk)] = torch.tensor(chunk, dtype=torch.long)
        attention_mask[row, : len(chunk)] = 1
    counts = torch.tensor([len(doc) for doc in chunks], dtype=torch.long)  # (batch,)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "chunk_counts": counts}


def scatter_chunks(values: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed per-chunk ``values`` ``(m, ...)`` -> padded ``(batch, max_chunks, ...)`` (zeros in
    empty slots) and the chunk mask ``(batch, max_chunks)``, for ``counts`` ``(batch,)``."""
    width = int(counts.max()) if counts.numel() else 0
    mask = torch.arange(width, device=counts.device).unsqueeze(0) < counts.unsqueeze(1)  # (batch, chunks)
    if int(counts.sum()) != values.size(0):
        raise ValueError(f"{values.size(0)} packed chunks but chunk counts sum to {int(counts.sum())}")
    padded = values.new_zeros(counts.numel(), width, *values.shape[1:])  # (batch, chunks, ...)
    padded[mask.to(values.device)] = values
    return padded, mask.to(values.device)


class HierarchicalArticleEncoder(TextEncoder):
    """Chunked article encoder: backbone vector per chunk -> chunk Transformer -> pooling.

    Args:
        backbone, tokenizer: the shared chunk encoder (an HF ``AutoModel``) and tokenizer.
            ``backbone=None`` (with ``config``) gives the chunk-level module alone, for
            articles whose chunk vectors were cached (:meth:`aggregate`).
        max_chunk_length: tokens per chunk, [CLS] and [SEP] included (G-DSR: 128).
        max_document_length: tokens per article over all chunks (G-DSR: 1024 -> 8 chunks).
        pooling: ``max`` or ``mean`` over the real (non-padded) chunks, or ``token_mean``:
            their mean weighted by each chunk's token count (E5's windowed mean pooling).
        num_layers, num_heads: depth and heads of the chunk-level ``nn.TransformerEncoder``
            (``d_model`` = backbone hidden size, feed-forward ``4 * d_model``, GELU);
            ``num_layers=0``: no chunk Transformer (and zero positions: pure pooling).
        dropout: dropout of the chunk-level Transformer (default: the backbone's
            ``hidden_dropout_prob``).
        token_pooling: chunk vector = ``cls`` (G-DSR) or ``mean`` of its tokens.
        prefix: text put before every chunk's tokens (E5: ``"passage: "``).
        identity_init: pre-LN chunk Transformer with zero-initialised residual branches and
            zero chunk-position embeddings: the untrained module is the identity.
        freeze_backbone: the chunk encoder does not train (its vectors can be cached) and
            is saved by reference to its base checkpoint, not copied.
    """

    def __init__(
        self,
        backbone: nn.Module | None,
        tokenizer,
        max_chunk_length: int = 128,
        max_document_length: int = 1024,
        pooling: str = "max",
        num_layers: int = 2,
        num_heads: int = 12,
        dropout: float | None = None,
        token_pooling: str = "cls",
        prefix: str = "",
        identity_init: bool = False,
        freeze_backbone: bool = False,
        config=None,
    ) -> None:
        super().__init__(backbone, tokenizer, token_pooling, prefix, config=config)
        if pooling not in CHUNK_POOLING:
            raise ConfigError(f"pooling = {pooling!r}, expected one of {', '.join(CHUNK_POOLING)}")
        dim = self.dim
        config = self.backbone_config
        if num_layers and (num_heads < 1 or dim % num_heads):
            raise ConfigError(f"chunk heads = {num_heads} must divide the hidden size {dim}")
        limit = _max_positions(config)
        if limit is not None and max_chunk_length > limit:
            raise ConfigError(f"max_chunk_length = {max_chunk_length} exceeds the backbone's {limit} positions")
        self.max_chunk_length = int(max_chunk_length)
        self.max_document_length = int(max_document_length)
        self.max_chunks = self.max_document_length // self.max_chunk_length
        self.pooling = pooling
        self.num_layers = int(num_layers)
        self.num_heads = int(num_heads)
        self.dropout = float(config.hidden_dropout_prob if dropout is None else dropout)
        self.identity_init = bool(identity_init)
        self.freeze_backbone = bool(freeze_backbone)
        chunk_token_ids(tokenizer, [""], self.max_chunk_length, self.max_document_length, self.prefix)  # validates

        self.chunk_positions = nn.Embedding(self.max_chunks, dim)
        nn.init.normal_(self.chunk_positions.weight, std=getattr(config, "initializer_range", 0.02))
        self.chunk_transformer = None
        if self.num_layers:
            layer = nn.TransformerEncoderLayer(
                d_model=dim,
                nhead=self.num_heads,
                dim_feedforward=4 * dim,
                dropout=self.dropout,
                activation="gelu",
                layer_norm_eps=getattr(config, "layer_norm_eps", 1e-5),
                batch_first=True,
                norm_first=self.identity_init,
            )
            self.chunk_transformer = nn.TransformerEncoder(
                layer, num_layers=self.num_layers, enable_nested_tensor=False
            )
        if self.identity_init or not self.num_layers:  # no chunk layers: pure pooling, no position offsets
            self._zero_residual_branches()
        if self.freeze_backbone and backbone is not None:
            backbone.requires_grad_(False)

    def _zero_residual_branches(self) -> None:
        """Pre-LN blocks compute ``x + f(LN(x))``: with the last linear map of every
        branch at zero, and no position offsets, the chunk module is the identity."""
        nn.init.zeros_(self.chunk_positions.weight)
        for layer in self.chunk_transformer.layers if self.chunk_transformer is not None else []:
            for linear in (layer.self_attn.out_proj, layer.linear2):
                nn.init.zeros_(linear.weight)
                nn.init.zeros_(linear.bias)

    def hierarchical_config(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "max_chunk_length": self.max_chunk_length,
            "max_document_length": self.max_document_length,
            "pooling": self.pooling,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "dropout": self.dropout,
            "token_pooling": self.token_pooling,
            "prefix": self.prefix,
            "identity_init": self.identity_init,
            "freeze_backbone": self.freeze_backbone,
        }

    def chunk(self, texts: Sequence[str]) -> list[list[list[int]]]:
        """Token-id chunks of each text (see :func:`chunk_token_ids`)."""
        return chunk_token_ids(self.tokenizer, texts, self.max_chunk_length, self.max_document_length, self.prefix)

    def collate(self, chunks: Sequence[Sequence[Sequence[int]]]) -> dict[str, torch.Tensor]:
        return collate_chunks(chunks, self.tokenizer.pad_token_id)

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        return self.collate(self.chunk(texts))  # (batch, chunks, len) each

    def _lengths(self, texts: Sequence[str]) -> list[int]:
        return [len(t) for t in texts]

    def pack(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """Packed model inputs of ``texts`` (see :func:`pack_chunks`); ``forward`` takes them."""
        return pack_chunks(self.chunk(texts), self.tokenizer.pad_token_id)

    def encode_flat(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, bucket: bool = True) -> torch.Tensor:
        """Packed real chunks ``(m, chunk_len)`` -> chunk vectors ``(m, dim)``, in input order.

        With ``bucket`` the chunks go through the backbone in length buckets
        (:func:`length_buckets`), each trimmed to its longest chunk (rounded up to
        :data:`PAD_MULTIPLE`), so few padding tokens are computed. Padding is masked, so the
        vectors equal one padded call's up to float rounding. Differentiable.
        """
        lengths = attention_mask.sum(dim=-1)  # (m,)
        if not bucket:
            width = trimmed_length(int(lengths.max()), input_ids.size(1)) if lengths.numel() else 0
            return self._pool(input_ids[:, :width], attention_mask[:, :width])  # (m, dim)
        buckets = length_buckets(lengths.tolist(), MIN_BUCKET, BUCKET_RATIO)
        parts = []
        for rows in buckets:
            index = torch.tensor(rows, device=input_ids.device)
            width = trimmed_length(int(lengths[rows[0]]), input_ids.size(1))
            parts.append(self._pool(input_ids[index, :width], attention_mask[index, :width]))  # (rows, dim)
        order = torch.tensor([i for rows in buckets for i in rows], device=input_ids.device)  # (m,)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        return torch.cat(parts)[inverse]  # (m, dim)

    def chunk_vectors(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, chunk_counts: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Padded ``(batch, n_chunks, chunk_len)`` ids and mask, or packed ``(m, chunk_len)``
        ones with ``chunk_counts`` ``(batch,)`` -> chunk vectors ``(batch, chunks, dim)``, the
        chunk mask ``(batch, chunks)`` and token counts ``(batch, chunks)``.

        Only real chunks run through the backbone, in length buckets (:meth:`encode_flat`);
        a padded input's all-zero-mask chunks are empty slots (vector zero, 0 tokens).
        """
        if chunk_counts is None:
            n_chunks = input_ids.size(1)
            if n_chunks > self.max_chunks:
                raise ValueError(f"{n_chunks} chunks per article, the encoder supports at most {self.max_chunks}")
            tokens = attention_mask.sum(dim=-1)  # (batch, chunks)
            chunk_mask = tokens > 0  # (batch, chunks)
            vectors = self.encode_flat(input_ids[chunk_mask], attention_mask[chunk_mask])  # (real_chunks, dim)
            chunks = vectors.new_zeros(*chunk_mask.shape, self.dim)  # (batch, chunks, dim)
            chunks[chunk_mask] = vectors
            return chunks, chunk_mask, tokens
        vectors = self.encode_flat(input_ids, attention_mask)  # (m, dim)
        chunks, chunk_mask = scatter_chunks(vectors, chunk_counts.to(vectors.device))  # (batch, chunks, dim)
        tokens, _ = scatter_chunks(attention_mask.sum(dim=-1), chunk_counts.to(vectors.device))  # (batch, chunks)
        return chunks, chunk_mask, tokens

    def aggregate(
        self, chunks: torch.Tensor, chunk_mask: torch.Tensor, tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Chunk vectors ``(batch, chunks, dim)``, mask ``(batch, chunks)`` and token counts
        ``(batch, chunks)`` (``token_mean`` only) -> article embeddings ``(batch, dim)``.

        Padded chunks are masked in the chunk Transformer and left out of the pooling, so
        appending empty chunks does not change an article's embedding.
        """
        n_chunks = chunks.size(1)
        if n_chunks > self.max_chunks:
            raise ValueError(f"{n_chunks} chunks per article, the encoder supports at most {self.max_chunks}")
        chunk_mask = chunk_mask.bool()
        if not bool(chunk_mask.any(dim=1).all()):
            raise ValueError("every article needs at least one non-empty chunk")
        positions = torch.arange(n_chunks, device=chunks.device)  # (chunks,)
        hidden = chunks + self.chunk_positions(positions).unsqueeze(0).to(chunks.dtype)  # (batch, chunks, dim)
        if self.chunk_transformer is not None:
            hidden = self.chunk_transformer(hidden, src_key_padding_mask=~chunk_mask)  # (batch, chunks, dim)
        keep = chunk_mask.unsqueeze(-1)  # (batch, chunks, 1)
        if self.pooling == "max":
            return hidden.masked_fill(~keep, float("-inf")).max(dim=1).values  # (batch, dim)
        if self.pooling == "token_mean":
            if tokens is None:
                raise ValueError("token_mean pooling needs the token count of every chunk")
            weights = (tokens.to(hidden.dtype) * chunk_mask).unsqueeze(-1)  # (batch, chunks, 1)
            return (hidden.masked_fill(~keep, 0.0) * weights).sum(dim=1) / weights.sum(dim=1)  # (batch, dim)
        summed = hidden.masked_fill(~keep, 0.0).sum(dim=1)  # (batch, dim)
        return summed / keep.sum(dim=1).to(summed.dtype)  # (batch, dim)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, chunk_counts: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Padded ``(batch, n_chunks, chunk_len)`` or packed ``(m, chunk_len)`` + ``chunk_counts``
        (:func:`pack_chunks`) ids and mask -> ``(batch, dim)`` article embeddings."""
        if self.freeze_backbone:
            with torch.no_grad():
                chunks, chunk_mask, tokens = self.chunk_vectors(input_ids, attention_mask, chunk_counts)
        else:
            chunks, chunk_mask, tokens = self.chunk_vectors(input_ids, attention_mask, chunk_counts)
        return self.aggregate(chunks, chunk_mask, tokens)  # (batch, dim)

    @torch.no_grad()
    def encode(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        device: torch.device | str | None = None,
        show_progress: bool = True,
        desc: str | None = None,
        distributed: bool = False,
    ) -> torch.Tensor:
        """Embed articles: float32 ``(n, dim)`` on CPU, in input order, eval mode, no grad.

        Packed inference: every real chunk of every text, sorted longest first across the
        whole input, goes through the backbone in batches of ``batch_size`` chunks, each
        trimmed to its longest chunk; the chunk vectors are then scattered back per article
        and aggregated (chunk Transformer + pooling) ``batch_size`` articles at a time.
        ``distributed``: both passes share their batches out across ranks
        (:func:`lexgraph.distributed.map_batches`).
        """
        if device is not None:
            self.to(device)
        device = _module_device(self)
        texts = list(texts)
        if not texts:
            return torch.empty(0, self.dim, dtype=torch.float32)
        chunked = self.chunk(texts)
        flat = [chunk for doc in chunked for chunk in doc]
        counts = torch.tensor([len(doc) for doc in chunked], dtype=torch.long)  # (n,)
        offsets = torch.zeros(len(texts) + 1, dtype=torch.long)
        offsets[1:] = counts.cumsum(0)
        order = sorted(range(len(flat)), key=lambda i: (-len(flat[i]), i))
        chunk_batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
        pad_id = self.tokenizer.pad_token_id
        label = desc or f"encode {type(self).__name__}"

        def backbone(idx: list[int]) -> torch.Tensor:
            packed = pack_chunks([[flat[i]] for i in idx], pad_id)
            with _autocast(device):
                return self._pool(packed["input_ids"].to(device), packed["attention_mask"].to(device)).float().cpu()

        def aggregate(start: int) -> torch.Tensor:
            end = min(start + batch_size, len(texts))
            rows = slice(int(offsets[start]), int(offsets[end]))
            chunks, mask = scatter_chunks(vectors[rows], counts[start:end])  # (b, c, dim), (b, c)
            tokens, _ = scatter_chunks(lengths[rows], counts[start:end])  # (b, c)
            with _autocast(device):
                return self.aggregate(chunks.to(device), mask.to(device), tokens.to(device)).float().cpu()

        was_training = self.training
        self.eval()
        try:
            parts = map_batches(backbone, chunk_batches, distributed=distributed, wrap=_bar(f"{label} (chunks)",
                                                                                            show_progress))
            vectors = torch.empty(len(flat), self.dim, dtype=torch.float32)  # (m, dim)
            for idx, part in zip(chunk_batches, parts):
                vectors[torch.tensor(idx)] = part
            lengths = torch.tensor([len(chunk) for chunk in flat], dtype=torch.long)  # (m,)
            starts = list(range(0, len(texts), batch_size))
            out = torch.cat(map_batches(aggregate, starts, distributed=distributed))  # (n, dim)
        finally:
            self.train(was_training)
        return out

    # -- persistence ------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike, backbone_source: str | os.PathLike | None = None) -> None:
        """Tokenizer + ``hierarchical.{json,safetensors}`` (the chunk-level module) and the
        backbone: copied (``save_pretrained``), or, when frozen and ``backbone_source`` is
        given, referenced as that checkpoint directory (``backbone.json``) with its config."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.freeze_backbone and backbone_source is not None:
            self.tokenizer.save_pretrained(directory)
            self.backbone_config.save_pretrained(directory)
            (directory / BACKBONE_REF).write_text(
                json.dumps({"path": str(backbone_source), "frozen": True}, indent=2) + "\n", encoding="utf-8"
            )
        else:
            if self.backbone is None:
                raise LexgraphError("cannot save an article encoder without its chunk encoder and no backbone_source")
            self._save_backbone(directory)
        state = {
            name: tensor.detach().cpu().contiguous()
            for name, tensor in self.state_dict().items()
            if not name.startswith("backbone.")
        }
        save_file(state, str(directory / HIERARCHICAL_WEIGHTS))
        (directory / HIERARCHICAL_CONFIG).write_text(json.dumps(self.hierarchical_config(), indent=2) + "\n")

    @classmethod
    def from_pretrained(
        cls, name_or_path: str | os.PathLike, *, random_init: bool = False, with_backbone: bool = True, **settings: Any
    ) -> "HierarchicalArticleEncoder":
        """Load a saved article encoder (``hierarchical.json`` present), or start a fresh
        one from an HF backbone with ``settings`` (``max_chunk_length``, ``pooling``, …)
        and a newly initialised chunk-level module. ``with_backbone=False`` loads the
        chunk-level module alone (for cached chunk vectors)."""
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoTokenizer

        directory = Path(name_or_path)
        saved_config = directory / HIERARCHICAL_CONFIG
        reference = directory / BACKBONE_REF
        backbone_path: str | os.PathLike = name_or_path
        if reference.is_file() and not random_init:
            backbone_path = json.loads(reference.read_text(encoding="utf-8"))["path"]
            if with_backbone and not Path(backbone_path).is_dir():
                raise LexgraphError(
                    f"{reference}: the frozen chunk encoder lives in '{backbone_path}', which is missing; "
                    "run `dvc repro` (or `dvc checkout`) to restore it"
                )
        if with_backbone:
            backbone, tokenizer = load_backbone(backbone_path, random_init=random_init)
            config = backbone.config
        else:
            backbone, tokenizer, config = None, AutoTokenizer.from_pretrained(directory), AutoConfig.from_pretrained(directory)
        if saved_config.is_file() and not random_init:
            config_values = json.loads(saved_config.read_text(encoding="utf-8"))
            config_values.pop("format_version", None)
            config_values.update(settings)
            encoder = cls(backbone, tokenizer, config=config, **config_values)
            check_safetensors(directory / HIERARCHICAL_WEIGHTS)
            weights = load_file(str(directory / HIERARCHICAL_WEIGHTS))
            missing, unexpected = encoder.load_state_dict(weights, strict=False)
            missing = [k for k in missing if not k.startswith("backbone.")]
            if missing or unexpected:
                raise LexgraphError(
                    f"{directory / HIERARCHICAL_WEIGHTS}: chunk-level weights do not match "
                    f"(missing {missing}, unexpected {list(unexpected)})"
                )
            return encoder
        settings.setdefault("prefix", read_base_info(name_or_path)["passage_prefix"])
        return cls(backbone, tokenizer, config=config, **settings)


# ---------------------------------------------------------------------------
# The dense statute retriever
# ---------------------------------------------------------------------------


class DSR(nn.Module):
    """Dense statute retriever: a query encoder and a hierarchical article encoder.

    ``similarity(q, a)`` is cosine / temperature (``(nq, na)``) and ``loss`` the InfoNCE
    objective of :class:`~lexgraph.losses.InfoNCELoss` with the same temperature.
    """

    def __init__(
        self, query_encoder: QueryEncoder, article_encoder: HierarchicalArticleEncoder, temperature: float = 0.01
    ) -> None:
        super().__init__()
        if query_encoder.dim != article_encoder.dim:
            raise ConfigError(
                f"query encoder dim {query_encoder.dim} != article encoder dim {article_encoder.dim}; "
                "both must come from models with the same hidden size"
            )
        self.query_encoder = query_encoder
        self.article_encoder = article_encoder
        self.criterion = InfoNCELoss(temperature)

    @property
    def temperature(self) -> float:
        return self.criterion.temperature

    @property
    def dim(self) -> int:
        return self.query_encoder.dim

    def encode_query(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``(batch, seq)`` -> ``(batch, dim)`` (differentiable)."""
        return self.query_encoder(input_ids, attention_mask)

    def encode_article(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, chunk_counts: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Padded ``(batch, chunks, len)`` or packed ``(m, len)`` + ``chunk_counts`` ``(batch,)``
        -> ``(batch, dim)`` (differentiable)."""
        return self.article_encoder(input_ids, attention_mask, chunk_counts)

    def encode_queries(self, texts: Sequence[str], batch_size: int = 64, **kwargs: Any) -> torch.Tensor:
        """Texts -> float32 ``(n, dim)`` with the query encoder (no grad)."""
        return self.query_encoder.encode(texts, batch_size=batch_size, **kwargs)

    def encode_articles(self, texts: Sequence[str], batch_size: int = 64, **kwargs: Any) -> torch.Tensor:
        """Texts -> float32 ``(n, dim)`` with the article encoder (no grad)."""
        return self.article_encoder.encode(texts, batch_size=batch_size, **kwargs)

    def similarity(self, queries: torch.Tensor, articles: torch.Tensor) -> torch.Tensor:
        """Cosine / temperature: ``(nq, dim)``, ``(na, dim)`` -> ``(nq, na)``."""
        return self.criterion.similarity(queries, articles)

    def loss(
        self,
        queries: torch.Tensor,
        positives: torch.Tensor,
        negatives: torch.Tensor | None = None,
        other_positives: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """InfoNCE over ``(B, dim)`` queries/positives and optional ``(N, dim)`` negatives."""
        return self.criterion(queries, positives, negatives, other_positives)

    def save(self, directory: str | os.PathLike, backbone_source: str | os.PathLike | None = None) -> None:
        """Write ``query_encoder/``, ``article_encoder/`` and ``dsr.json`` under ``directory``
        (a frozen chunk encoder is saved as a reference to ``backbone_source`` when given)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.query_encoder.save_pretrained(directory / "query_encoder")
        self.article_encoder.save_pretrained(directory / "article_encoder", backbone_source=backbone_source)
        (directory / DSR_CONFIG).write_text(
            json.dumps(
                {"format_version": FORMAT_VERSION, "temperature": self.temperature, "dim": self.dim,
                 "similarity": "cosine", "normalized_embeddings": False},
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )

    @classmethod
    def load(
        cls, directory: str | os.PathLike, device: torch.device | str | None = None, with_article_backbone: bool = True
    ) -> "DSR":
        """Load a saved DSR; ``with_article_backbone=False`` skips the article side's chunk
        encoder (enough to aggregate cached chunk vectors)."""
        directory = Path(directory)
        config_path = directory / DSR_CONFIG
        if not config_path.is_file():
            raise LexgraphError(f"{config_path}: not found; expected a DSR saved by the train_dsr stage")
        config = json.loads(config_path.read_text(encoding="utf-8"))
        model = cls(
            QueryEncoder.from_pretrained(directory / "query_encoder"),
            HierarchicalArticleEncoder.from_pretrained(directory / "article_encoder", with_backbone=with_article_backbone),
            temperature=config["temperature"],
        )
        model.eval()
        return model.to(device) if device is not None else model


def cosine_scores(queries: torch.Tensor, articles: torch.Tensor) -> torch.Tensor:
    """Plain cosine similarity ``(nq, dim)``, ``(na, dim)`` -> ``(nq, na)`` in float32."""
    return F.normalize(queries.float(), dim=-1) @ F.normalize(articles.float(), dim=-1).T  # (nq, na)
