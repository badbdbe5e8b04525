"""G-DSR's hierarchical article encoder (:class:`HierarchicalArticleEncoder`): chunk
vectors from the shared backbone, chunk-position embeddings, a small chunk-level
Transformer and pooling (the story is :mod:`lexgraph.models.encoders`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lexgraph.core.distributed import map_batches
from lexgraph.core.errors import ConfigError, DataError, LexgraphError, SettingError
from lexgraph.core.hub import check_model_files, check_safetensors, first_line
from lexgraph.core.inputs import read_json_object
from lexgraph.core.io import write_json
from lexgraph.core.layout import restore_hint
from lexgraph.models.backbone import (
    FORMAT_VERSION,
    _autocast,
    _bar,
    backbone_ref,
    load_backbone,
    longest_first,
    max_positions,
    save_backbone_ref,
)
from lexgraph.models.encoders import EncodeCall, TextEncoder
from lexgraph.models.family import read_base_info
from lexgraph.models.packing import (
    BUCKET_RATIO,
    MIN_BUCKET,
    ChunkBatch,
    chunk_token_ids,
    collate_chunks,
    length_buckets,
    pack_chunks,
    scatter_chunks,
    trimmed_length,
)
from lexgraph.models.weights import built_from

log = logging.getLogger(__name__)

HIERARCHICAL_CONFIG = "hierarchical.json"
HIERARCHICAL_WEIGHTS = "hierarchical.safetensors"
CHUNK_POOLING = ("max", "mean", "token_mean")


def sinusoidal_positions(n_chunks: int, dim: int) -> torch.Tensor:
    """The starting chunk-position embeddings ``(n_chunks, dim)`` of G-DSR's code: gdsr
    ``src/models/bert.py`` (``HierBERT``) makes them an ``nn.Embedding(n_pos_chunks + 1, dim,
    padding_idx=0)`` set to fairseq's sinusoidal table (``HierBERT.sinusoidal_init``) and trained
    (G-DSR §3.1: "learnable passage position embeddings"). Row ``p`` of that table is
    ``[sin(p w_0), …, sin(p w_{h-1}), cos(p w_0), …, cos(p w_{h-1})]`` with ``h = dim // 2``,
    ``w_j = exp(-j log(10000) / (h - 1))`` and a zero last column for an odd ``dim``; row 0 is the
    padding row and the code numbers real chunks 1, 2, …, so lexgraph's chunk ``i`` (counted from
    0, no padding row) gets row ``i + 1``. (``h = 1``, where the code divides by zero, takes
    ``w_0 = 1``.)"""
    import math

    half = dim // 2
    step = math.log(10000) / (half - 1) if half > 1 else 0.0
    freqs = torch.exp(torch.arange(half, dtype=torch.float) * -step)  # (half,)
    angles = torch.arange(1, n_chunks + 1, dtype=torch.float).unsqueeze(1) * freqs.unsqueeze(0)  # (n_chunks, half)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)  # (n_chunks, 2 * half)
    if dim % 2:
        table = torch.cat([table, torch.zeros(n_chunks, 1)], dim=1)  # (n_chunks, dim)
    return table


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
            zero chunk-position embeddings: the untrained module is the identity. Otherwise the
            (learnable) chunk-position embeddings start as the authors' code starts them:
            :func:`sinusoidal_positions`.
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
            raise SettingError("pooling", pooling, f"one of {', '.join(CHUNK_POOLING)}")
        dim = self.dim
        config = self.backbone_config
        if num_layers and (num_heads < 1 or dim % num_heads):
            raise SettingError("num_heads", num_heads, f"a positive divisor of the encoder's width {dim}")
        limit = max_positions(config)
        if limit is not None and max_chunk_length > limit:
            raise SettingError("max_chunk_length", max_chunk_length, f"at most the backbone's {limit} positions")
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
        # drawn and then replaced: the draw keeps the random stream of the layers built after it
        nn.init.normal_(self.chunk_positions.weight, std=getattr(config, "initializer_range", 0.02))
        if not self.identity_init:  # the authors' start, still learnable (identity_init: zeros, below)
            with torch.no_grad():
                self.chunk_positions.weight.copy_(sinusoidal_positions(self.max_chunks, dim))
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

    def planned_chunk_vectors(self, batch: ChunkBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`chunk_vectors` of a host-planned batch (:func:`~lexgraph.models.packing.plan_chunks`):
        one backbone call per planned ``(rows, width)`` input, the rows then gathered into their
        slots by the plan's index, with no value read back from the device."""
        parts = [self._pool(ids, mask) for ids, mask in zip(batch.input_ids, batch.attention_mask)]  # (rows, dim)
        flat = torch.cat([*parts, parts[0].new_zeros(1, parts[0].size(1))])  # (rows + 1, dim): + the empty slot
        chunks = flat.index_select(0, batch.gather).view(*batch.chunk_mask.shape, -1)  # (batch, max_chunks, dim)
        return chunks, batch.chunk_mask, batch.tokens

    def forward_planned(self, batch: ChunkBatch) -> torch.Tensor:
        """Article embeddings ``(batch, dim)`` of a host-planned batch (the training step's path)."""
        if self.freeze_backbone:
            with torch.no_grad():
                chunks, chunk_mask, tokens = self.planned_chunk_vectors(batch)
        else:
            chunks, chunk_mask, tokens = self.planned_chunk_vectors(batch)
        return self.aggregate(chunks, chunk_mask, tokens, check=False)  # the plan has a chunk per article

    def aggregate(
        self, chunks: torch.Tensor, chunk_mask: torch.Tensor, tokens: torch.Tensor | None = None, check: bool = True
    ) -> torch.Tensor:
        """Chunk vectors ``(batch, chunks, dim)``, mask ``(batch, chunks)`` and token counts
        ``(batch, chunks)`` (``token_mean`` only) -> article embeddings ``(batch, dim)``.

        Padded chunks are masked in the chunk Transformer and left out of the pooling, so
        appending empty chunks does not change an article's embedding. ``check``: refuse an
        article without a chunk (a value read back from the device: off where the host knows).
        """
        n_chunks = chunks.size(1)
        if n_chunks > self.max_chunks:
            raise ValueError(f"{n_chunks} chunks per article, the encoder supports at most {self.max_chunks}")
        chunk_mask = chunk_mask.bool()
        if check and not bool(chunk_mask.any(dim=1).all()):
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

    def _encode(self, call: EncodeCall) -> torch.Tensor:
        """:meth:`TextEncoder.encode`'s work for articles, in eval mode.

        Packed inference: every real chunk of every text, sorted longest first across the
        whole input, goes through the backbone in batches of ``batch_size`` chunks, each
        trimmed to its longest chunk; the chunk vectors are then scattered back per article
        and aggregated (chunk Transformer + pooling) ``batch_size`` articles at a time.
        ``distributed``: both passes share their batches out across ranks
        (:func:`lexgraph.core.distributed.map_batches`).
        """
        texts, batch_size, device = call.texts, call.batch_size, call.device
        chunked = self.chunk(texts)
        flat = [chunk for doc in chunked for chunk in doc]
        counts = torch.tensor([len(doc) for doc in chunked], dtype=torch.long)  # (n,)
        offsets = torch.zeros(len(texts) + 1, dtype=torch.long)
        offsets[1:] = counts.cumsum(0)
        chunk_batches = longest_first([len(chunk) for chunk in flat], batch_size)
        pad_id = self.tokenizer.pad_token_id

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

        parts = map_batches(
            backbone,
            chunk_batches,
            distributed=call.distributed,
            wrap=_bar(f"{call.label} (chunks)", call.show_progress),
        )
        vectors = torch.empty(len(flat), self.dim, dtype=torch.float32)  # (m, dim)
        for idx, part in zip(chunk_batches, parts):
            vectors[torch.tensor(idx)] = part
        lengths = torch.tensor([len(chunk) for chunk in flat], dtype=torch.long)  # (m,)
        starts = list(range(0, len(texts), batch_size))
        return torch.cat(map_batches(aggregate, starts, distributed=call.distributed))  # (n, dim)

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
            save_backbone_ref(directory, backbone_source)
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
        write_json(self.hierarchical_config(), directory / HIERARCHICAL_CONFIG, ensure_ascii=True)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike,
        *,
        random_init: bool = False,
        with_backbone: bool = True,
        root: str | os.PathLike = ".",
        **settings: Any,
    ) -> HierarchicalArticleEncoder:
        """Load a saved article encoder (``hierarchical.json`` present), or start a fresh
        one from an HF backbone with ``settings`` (``max_chunk_length``, ``pooling``, …)
        and a newly initialised chunk-level module. ``with_backbone=False`` loads the
        chunk-level module alone (for cached chunk vectors). A frozen chunk encoder saved as a
        reference lies under ``root`` (the workspace) when the reference is relative."""
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoTokenizer

        directory = Path(name_or_path)
        remedy = restore_hint(directory)
        saved_config = directory / HIERARCHICAL_CONFIG
        chunk_encoder = "the frozen chunk encoder"
        referenced = None if random_init else backbone_ref(directory, chunk_encoder, root=root, required=with_backbone)
        backbone_path: str | os.PathLike = referenced or name_or_path
        if with_backbone:
            backbone, tokenizer = load_backbone(backbone_path, random_init=random_init)
            config = backbone.config
        else:
            check_model_files(directory, weights=False)
            try:
                tokenizer, config = AutoTokenizer.from_pretrained(directory), AutoConfig.from_pretrained(directory)
            except Exception as exc:  # noqa: BLE001 - a saved directory that does not load is damaged input
                raise DataError(
                    directory,
                    f"not a loadable tokenizer and config ({type(exc).__name__}: {first_line(exc)}); {remedy}",
                ) from exc
            backbone = None
        if not random_init and (saved_config.exists() or saved_config.is_symlink()):
            config_values = read_json_object(saved_config, what="the chunk-level module's settings", fix=remedy)
            config_values.pop("format_version", None)
            config_values.update(settings)
            with built_from(
                saved_config,
                "settings that do not build a chunk-level module",
                "the settings train_dsr saved",
                remedy,
                errors=(TypeError, ValueError, ConfigError),
            ):
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
