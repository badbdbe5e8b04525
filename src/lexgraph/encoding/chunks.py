"""Cached chunk vectors of a frozen chunk encoder (stage ``encode_chunks``).

With ``dsr.chunk_encoder: frozen`` the hierarchical article encoder's backbone never
trains, so every chunk of every article (and heading) is encoded once, here, and
``train_dsr`` / ``embed`` only run the chunk-level module on the cached vectors
(:meth:`~lexgraph.models.article_encoder.HierarchicalArticleEncoder.aggregate`). On a CPU this
turns the article side from the dominant cost into a few seconds per epoch.

A cache file (safetensors) holds, for ``n`` texts and ``m`` chunks in all:

* ``ids`` int64 ``(n,)``; ``offsets`` int64 ``(n + 1,)``: text ``i`` owns chunk rows
  ``offsets[i]:offsets[i + 1]``, in reading order;
* ``tokens`` int64 ``(m,)``: tokens of each chunk, special tokens and prefix included;
* ``vectors`` float32 ``(m, dim)``: the chunk vectors (absent when the chunk encoder is
  fine-tuned: then the file carries the chunking only);
* metadata: the chunking settings, so that consumers refuse a cache made otherwise.

With ``dsr.chunk_encoder: finetune`` (paper profile) the stage writes no vectors and
``train_dsr`` fine-tunes the chunk encoder end to end.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lexgraph.core.errors import DataError
from lexgraph.core.io import save_tensors
from lexgraph.core.progress import progress
from lexgraph.core.settings import settings_of
from lexgraph.core.stage import StageContext, stage_paths
from lexgraph.encoding.stable_batches import STABLE_STEP, stable_batches, stable_inputs

log = logging.getLogger(__name__)

FILES = ("articles", "headings")
SETTINGS = ("max_chunk_length", "max_document_length", "token_pooling", "prefix")


@dataclass
class ChunkTable:
    """Chunk vectors of ``n`` texts (see the module docstring for the layout)."""

    ids: np.ndarray  # (n,) int64
    offsets: np.ndarray  # (n + 1,) int64
    tokens: torch.Tensor  # (m,) int64
    vectors: torch.Tensor | None  # (m, dim) float32, None without vectors
    settings: dict[str, str]

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def rows(self, ids: Sequence[int]) -> np.ndarray:
        """Row of each id ``(len(ids),)``; :class:`KeyError` names the first missing one."""
        order = np.argsort(self.ids, kind="stable")
        wanted = np.asarray(ids, dtype=np.int64)
        pos = np.searchsorted(self.ids[order], wanted)
        pos = np.minimum(pos, len(order) - 1)
        found = self.ids[order][pos] == wanted
        if not found.all():
            raise KeyError(int(wanted[~found][0]))
        return order[pos]

    def padded(
        self, rows: Sequence[int] | np.ndarray, width: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Chunk vectors ``(b, c, dim)``, chunk mask ``(b, c)`` and token counts ``(b, c)``
        of texts ``rows``, padded to their largest chunk count ``c`` (or to ``width`` chunks)."""
        if self.vectors is None:
            raise ValueError("this chunk cache holds no vectors (dsr.chunk_encoder: finetune)")
        rows = np.asarray(rows, dtype=np.int64)
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        counts = ends - starts
        largest = int(counts.max()) if len(rows) else 0
        if width is not None and width < largest:
            raise ValueError(f"a text of {largest} chunks does not fit in {width}")
        width = largest if width is None else int(width)
        mask = torch.from_numpy(np.arange(width)[None, :] < counts[:, None])  # (b, c)
        index = torch.from_numpy(starts[:, None] + np.minimum(np.arange(width)[None, :], counts[:, None] - 1))
        chunks = self.vectors[index] * mask.unsqueeze(-1)  # (b, c, dim)
        tokens = self.tokens[index] * mask  # (b, c)
        return chunks, mask, tokens


def encode_chunk_table(
    encoder,
    ids: Sequence[int],
    texts: Sequence[str],
    batch_size: int = 64,
    vectors: bool = True,
    desc: str = "encode chunks",
    stable: bool = False,
    unit: str = "text",
) -> ChunkTable:
    """Chunk ``texts`` with ``encoder`` (a HierarchicalArticleEncoder) and, with
    ``vectors``, run its backbone once over every chunk (longest first, no grad).

    ``stable``: through shape-stable batches (:mod:`lexgraph.encoding.stable_batches`,
    ``batch_size`` rows, :data:`~lexgraph.encoding.stable_batches.STABLE_STEP`), so that a
    chunk's vector depends on its own tokens only, not on the other texts encoded with it."""
    chunked = encoder.chunk(list(texts))
    flat = [chunk for doc in chunked for chunk in doc]
    offsets = np.zeros(len(chunked) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(doc) for doc in chunked])
    tokens = torch.tensor([len(c) for c in flat], dtype=torch.long)  # (m,)
    settings = {key: str(getattr(encoder, key)) for key in SETTINGS}
    out = None
    if vectors and stable:
        out = _stable_chunk_vectors(encoder, flat, len(chunked), batch_size, desc, unit)
    elif vectors:
        from lexgraph.core.config import autocast

        device = next(encoder.backbone.parameters()).device
        out = torch.empty(len(flat), encoder.dim, dtype=torch.float32)  # (m, dim)
        order = sorted(range(len(flat)), key=lambda i: (-len(flat[i]), i))
        pad_id = encoder.tokenizer.pad_token_id
        was_training = encoder.training
        encoder.eval()
        starts = range(0, len(order), batch_size)
        with torch.no_grad():
            for start in progress(starts, desc):
                idx = order[start : start + batch_size]
                length = max(len(flat[i]) for i in idx)
                input_ids = torch.full((len(idx), length), pad_id, dtype=torch.long)  # (batch, len)
                attention = torch.zeros((len(idx), length), dtype=torch.long)  # (batch, len)
                for row, i in enumerate(idx):
                    input_ids[row, : len(flat[i])] = torch.tensor(flat[i])
                    attention[row, : len(flat[i])] = 1
                with autocast(device):
                    pooled = encoder._pool(input_ids.to(device), attention.to(device))  # (batch, dim)
                out[torch.tensor(idx)] = pooled.float().cpu()
        encoder.train(was_training)
    return ChunkTable(np.asarray(ids, dtype=np.int64), offsets, tokens, out, settings)


def _stable_chunk_vectors(
    encoder, flat: Sequence[Sequence[int]], texts: int, batch_size: int, desc: str, unit: str
) -> torch.Tensor:
    """Vectors ``(m, dim)`` float32 of the chunks ``flat`` of ``texts`` texts through shape-stable
    batches (no grad). Progress counts the texts by the share of their tokens encoded (a batch
    mixes chunks of many texts), as ``unit``: texts per second and the time left, from the first 2 s."""
    from lexgraph.core.config import autocast
    from lexgraph.core.progress import progress_bar
    from lexgraph.models.encoders import prepared_mask

    device = next(encoder.backbone.parameters()).device
    out = torch.empty(len(flat), encoder.dim, dtype=torch.float32)  # (m, dim)
    batches = stable_batches([len(c) for c in flat], batch_size, STABLE_STEP, encoder.max_chunk_length)
    pad_id = encoder.tokenizer.pad_token_id
    per_token = texts / max(1, sum(len(c) for c in flat))  # a text's share of one token
    was_training = encoder.training
    encoder.eval()
    with torch.no_grad(), progress_bar(texts, desc, unit=unit, first=2.0, rate=True) as bar:
        for batch in batches:
            input_ids, attention = stable_inputs(flat, batch, pad_id)  # (batch_size, len) each
            input_ids, attention = input_ids.to(device), attention.to(device)
            with autocast(device):  # the prepared mask even without padding: one kernel for every batch
                mask = prepared_mask(attention, encoder.backbone.config)
                hidden = encoder.backbone(input_ids=input_ids, attention_mask=mask).last_hidden_state
                pooled = encoder.pool_states(hidden, attention)  # (batch_size, dim)
            out[torch.tensor(batch.rows)] = pooled[: len(batch.rows)].float().cpu()
            bar.update(per_token * sum(len(flat[i]) for i in batch.rows))
    encoder.train(was_training)
    return out


def save_chunk_table(table: ChunkTable, path: str | os.PathLike) -> None:
    tensors = {
        "ids": torch.from_numpy(table.ids),
        "offsets": torch.from_numpy(table.offsets),
        "tokens": table.tokens.contiguous(),
    }
    if table.vectors is not None:
        tensors["vectors"] = table.vectors.contiguous()
    metadata = {**table.settings, "vectors": str(table.vectors is not None).lower()}
    save_tensors(tensors, path, metadata)


def load_chunk_table(path: str | os.PathLike) -> ChunkTable:
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise DataError(path, "chunk cache not found (run `dvc repro encode_chunks`)")
    try:
        with safe_open(str(path), framework="pt") as fh:
            metadata = fh.metadata() or {}
            tensors = {key: fh.get_tensor(key) for key in fh.keys()}
    except (SafetensorError, OSError) as exc:
        raise DataError(path, f"not a readable chunk cache ({exc})") from exc
    missing = {"ids", "offsets", "tokens"} - set(tensors)
    if missing or any(key not in metadata for key in SETTINGS):
        raise DataError(path, f"not a chunk cache: expected tensors ids/offsets/tokens and settings {SETTINGS}")
    ids, offsets = tensors["ids"].numpy(), tensors["offsets"].numpy()
    if offsets.shape != (ids.shape[0] + 1,) or int(offsets[-1]) != tensors["tokens"].shape[0]:
        raise DataError(path, "inconsistent chunk offsets")
    settings = {key: metadata[key] for key in SETTINGS}
    return ChunkTable(ids, offsets, tensors["tokens"], tensors.get("vectors"), settings)


def check_settings(table: ChunkTable, encoder, path: str | os.PathLike) -> None:
    """Refuse a cache chunked differently from ``encoder``."""
    expected = {key: str(getattr(encoder, key)) for key in SETTINGS}
    diff = {k: (table.settings[k], expected[k]) for k in SETTINGS if table.settings[k] != expected[k]}
    if diff:
        raise DataError(path, f"chunk cache made with other settings (cache, expected): {diff}; run `dvc repro`")


def write_chunk_cache(
    config,
    pretrained: str | os.PathLike,
    articles_path: str | os.PathLike,
    headings_path: str | os.PathLike,
    out: str | os.PathLike,
    device,
) -> dict[str, Any]:
    """Chunk (and, frozen, encode) articles and headings into the cache ``out``: :func:`run_encode_chunks`'s work."""
    from lexgraph.core.io import atomic_path, read_parquet
    from lexgraph.models.article_encoder import HierarchicalArticleEncoder

    if not Path(pretrained).is_dir():
        raise DataError(pretrained, "base model directory not found (run `dvc repro pretrain`)")
    with settings_of("dsr", {"max_chunk_length": "max_chunk_length", "max_document_length": "max_document_length"}):
        encoder = HierarchicalArticleEncoder.from_pretrained(
            pretrained,
            max_chunk_length=config.max_chunk_length,
            max_document_length=config.max_document_length,
            token_pooling=config.token_pooling,
            num_layers=0,
        ).to(device)
    frozen = config.chunk_encoder == "frozen"
    sources = {
        "articles": (read_parquet(articles_path, ["id", "article"]), "id", "article", articles_path),
        "headings": (read_parquet(headings_path, ["heading_id", "text"]), "heading_id", "text", headings_path),
    }
    counts = {}
    with atomic_path(out, directory=True) as tmp:
        for name, (df, id_col, text_col, path) in sources.items():
            ids = df[id_col].to_numpy().astype(np.int64)
            if len(np.unique(ids)) != len(ids):
                raise DataError(path, "ids are not unique", column=id_col)
            texts = ["" if t is None else str(t) for t in df[text_col].to_list()]
            table = encode_chunk_table(
                encoder, ids, texts, config.eval_batch_size, vectors=frozen, desc=f"encode_chunks {name}"
            )
            save_chunk_table(table, Path(tmp) / f"{name}.safetensors")
            counts[name] = {"texts": len(table), "chunks": int(table.tokens.numel())}
            log.info(
                "%s: %d texts, %d chunks%s",
                name,
                len(table),
                table.tokens.numel(),
                "" if frozen else " (chunking only: the chunk encoder is fine-tuned)",
            )
    return counts


@torch.no_grad()
def embed_from_chunks(
    encoder,
    table: ChunkTable,
    rows: Sequence[int] | np.ndarray | None = None,
    batch_size: int = 256,
    stable: bool = False,
) -> torch.Tensor:
    """Article embeddings ``(n, dim)`` float32 of ``rows`` (default: all) from cached chunk
    vectors, through ``encoder.aggregate`` (eval mode, no grad).

    ``stable``: every batch is ``batch_size`` articles (the last one filled with dummy
    articles, dropped) of ``encoder.max_chunks`` chunks, so that an article's embedding does
    not depend on the articles aggregated with it (:mod:`lexgraph.encoding.stable_batches`)."""
    rows = np.arange(len(table)) if rows is None else np.asarray(rows, dtype=np.int64)
    device = next(iter(encoder.parameters()), torch.empty(0)).device
    out = torch.empty(len(rows), encoder.dim, dtype=torch.float32)  # (n, dim)
    was_training = encoder.training
    encoder.eval()
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        if stable:  # (batch_size, max_chunks, dim), (batch_size, max_chunks) twice
            chunks, mask, tokens = _stable_batch(table, batch, batch_size, encoder.max_chunks)
        else:
            chunks, mask, tokens = table.padded(batch)  # (b, c, dim), (b, c), (b, c)
        embedded = encoder.aggregate(chunks.to(device), mask.to(device), tokens.to(device)).float().cpu()
        out[start : start + len(batch)] = embedded[: len(batch)]  # (b, dim): the real articles
    encoder.train(was_training)
    return out


def _stable_batch(
    table: ChunkTable, rows: np.ndarray, size: int, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:meth:`ChunkTable.padded` of ``rows`` to ``width`` chunks, then dummy articles (one
    zero chunk of one token) up to ``size`` rows: ``(size, width, dim)``, ``(size, width)`` twice."""
    chunks, mask, tokens = table.padded(rows, width)  # (b, width, dim), (b, width), (b, width)
    dummies = size - len(rows)
    dummy_mask = torch.zeros(dummies, width, dtype=mask.dtype)  # (dummies, width)
    dummy_mask[:, 0] = True
    dummy_tokens = dummy_mask.to(tokens.dtype)  # (dummies, width)
    dummy_chunks = chunks.new_zeros(dummies, width, chunks.shape[-1])  # (dummies, width, dim)
    return torch.cat([chunks, dummy_chunks]), torch.cat([mask, dummy_mask]), torch.cat([tokens, dummy_tokens])


EncodeChunksPaths = stage_paths("encode_chunks")


def run_encode_chunks(paths: EncodeChunksPaths, config, context: StageContext) -> dict[str, Any]:
    """The ``encode_chunks`` stage (``config``: the ``dsr`` section's settings): chunk (and, frozen,
    encode) articles and headings."""
    return write_chunk_cache(
        config, paths.pretrained, paths.articles, paths.headings, paths.out, context.torch_device()
    )
