"""Chunking and packing of the hierarchical article encoder (:mod:`lexgraph.models.article_encoder`).

An article's tokens are cut into chunks of ``max_chunk_length`` (each ``[CLS] prefix …
[SEP]``); training and inference encode only real chunks, grouped in length buckets and
trimmed to their longest chunk (rounded up to :data:`PAD_MULTIPLE`), then scattered back
per article."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from lexgraph.core.errors import SettingError

log = logging.getLogger(__name__)


def prefix_token_ids(tokenizer, prefix: str) -> list[int]:
    """The token ids of a model family's prefix (E5's ``query: ``), without special tokens."""
    return tokenizer(prefix.strip(), add_special_tokens=False)["input_ids"] if prefix.strip() else []


def shortest_input(tokenizer, prefix: str) -> tuple[int, str]:
    """The fewest tokens an input (a question, a chunk) needs to hold any text, and why:
    ``[CLS]``, the prefix's tokens, one token of text, ``[SEP]``."""
    n = len(prefix_token_ids(tokenizer, prefix))
    return 3 + n, f"[CLS], {f'the prefix {prefix.strip()!r} ({n} tokens), ' if n else ''}one token of text and [SEP]"


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
    prefix_ids = prefix_token_ids(tokenizer, prefix)
    specials = 2 + len(prefix_ids)  # [CLS], [SEP] and the prefix
    body = max_chunk_length - specials
    max_chunks = max_document_length // max_chunk_length
    if body < 1:
        least, why = shortest_input(tokenizer, prefix)
        raise SettingError("max_chunk_length", max_chunk_length, f"an integer >= {least} ({why})")
    if max_chunks < 1:
        raise SettingError(
            "max_document_length", max_document_length, f"an integer >= the chunk length ({max_chunk_length})"
        )
    if not texts:  # no text, no chunk (a fast tokenizer refuses an empty batch)
        return []
    enc = tokenizer(list(texts), add_special_tokens=False, truncation=True, max_length=max_chunks * body, verbose=False)
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


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id rows right-padded to the longest: ``input_ids`` and ``attention_mask`` ``(n, len)``."""
    length = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)  # (n, len)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)  # (n, len)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[i, : len(row)] = 1
    return input_ids, attention_mask


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
    input_ids, attention_mask = pad_rows(flat, pad_id)  # (m, len), (m, len)
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
