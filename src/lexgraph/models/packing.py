"""Chunking and packing of the hierarchical article encoder (:mod:`lexgraph.models.article_encoder`).

An article's tokens are cut into chunks of ``max_chunk_length`` (each ``[CLS] prefix …
[SEP]``); training and inference encode only real chunks, grouped in length buckets and
trimmed to their longest chunk (rounded up to :data:`PAD_MULTIPLE`), then scattered back
per article."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
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


WIDTH_MULTIPLE = 32  # backbone widths of the planned layouts: multiples of this, at most max_chunk_length
LAYOUTS = ("packed", "padded", "slots")


def stable_rows(n: int) -> int:
    """``n`` rounded up to a value of a small fixed set (8, then 4 steps per doubling: 10, 12, 14,
    16, 20, 24, 28, 32, 40, …): the row counts of the backbone calls repeat from batch to batch,
    at a cost of at most a quarter of dummy rows."""
    if n <= 8:
        return 8
    step = 1 << ((n - 1).bit_length() - 3)
    return -(-n // step) * step


def width_buckets(
    lengths: Sequence[int], limit: int, min_rows: int = MIN_BUCKET, multiple: int = WIDTH_MULTIPLE
) -> list[tuple[list[int], int]]:
    """Chunk indices grouped by their length rounded up to ``multiple`` (at most ``limit``):
    ``(indices in input order, width)`` per group, widest first. As in :func:`length_buckets`, a
    narrower group joins the current one (at its width) while that holds fewer than ``min_rows``."""
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(trimmed_length(n, limit, multiple), []).append(i)
    out: list[tuple[list[int], int]] = []
    for width in sorted(groups, reverse=True):
        if out and len(out[-1][0]) < min_rows:
            out[-1] = (sorted(out[-1][0] + groups[width]), out[-1][1])
        else:
            out.append((groups[width], width))
    return out


@dataclass(frozen=True)
class ChunkBatch:
    """Chunked articles laid out on the host for the backbone (:func:`plan_chunks`): every
    backbone call's inputs, and where each of its output rows goes. Nothing of it is read back
    from the device: the step only enqueues work.

    ``input_ids``/``attention_mask``: one ``(rows, width)`` pair per backbone call (dummy rows,
    outputs unused, make the row counts stable); ``gather`` ``(batch * max_chunks,)``: for every
    chunk slot, its row in the calls' concatenated outputs, or the total row count (a zero row)
    for an empty slot; ``chunk_mask`` ``(batch, max_chunks)`` and ``tokens`` ``(batch, max_chunks)``:
    which slots hold a chunk and its token count."""

    input_ids: tuple[torch.Tensor, ...]
    attention_mask: tuple[torch.Tensor, ...]
    gather: torch.Tensor
    chunk_mask: torch.Tensor
    tokens: torch.Tensor

    @property
    def shapes(self) -> list[tuple[int, int]]:
        return [tuple(ids.shape) for ids in self.input_ids]

    def to(self, device: torch.device | str) -> ChunkBatch:
        """On ``device``; to a GPU through pinned memory, without waiting (no synchronisation)."""
        device = torch.device(device)
        if device.type != "cuda":
            return self

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.pin_memory().to(device, non_blocking=True)

        return replace(
            self,
            input_ids=tuple(move(t) for t in self.input_ids),
            attention_mask=tuple(move(t) for t in self.attention_mask),
            gather=move(self.gather),
            chunk_mask=move(self.chunk_mask),
            tokens=move(self.tokens),
        )


def _call_rows(chunks: Sequence[Sequence[Sequence[int]]], layout: str, limit: int, max_chunks: int, stable: bool):
    """``(slots, width, rows)`` per backbone call: ``slots`` are flat chunk-slot indices
    (article ``b``'s chunk ``c`` is ``b * max_chunks + c``; an empty one in ``slots`` is a dummy row)."""
    lengths = [len(chunk) for doc in chunks for chunk in doc]
    slot_of = [b * max_chunks + c for b, doc in enumerate(chunks) for c in range(len(doc))]
    if layout == "slots":  # every slot, at full width
        return [(list(range(len(chunks) * max_chunks)), limit, len(chunks) * max_chunks)]
    if layout == "padded":
        groups = [(list(range(len(lengths))), max(lengths))]
    else:
        groups = (
            width_buckets(lengths, limit, MIN_BUCKET, WIDTH_MULTIPLE) if stable else _legacy_buckets(lengths, limit)
        )
    calls = []
    for rows, width in groups:
        width = trimmed_length(width, limit, WIDTH_MULTIPLE if stable else PAD_MULTIPLE)
        calls.append(([slot_of[i] for i in rows], width, stable_rows(len(rows)) if stable else len(rows)))
    return calls


def _legacy_buckets(lengths: Sequence[int], limit: int) -> list[tuple[list[int], int]]:
    return [(rows, lengths[rows[0]]) for rows in length_buckets(lengths, MIN_BUCKET, BUCKET_RATIO)]


def plan_chunks(
    chunks: Sequence[Sequence[Sequence[int]]],
    pad_id: int,
    limit: int,
    max_chunks: int,
    layout: str = "packed",
    stable: bool = True,
) -> ChunkBatch:
    """Lay out chunked articles for the backbone, on the host, from the token lists alone.

    ``layout``: ``packed`` (real chunks in width groups, :func:`width_buckets`), ``padded`` (real
    chunks, one call at the longest width) or ``slots`` (every one of ``max_chunks`` slots per
    article at width ``limit``; empty slots attend to their first position). ``stable``: widths
    rounded up to :data:`WIDTH_MULTIPLE` and row counts to :func:`stable_rows` (few shapes from
    batch to batch); otherwise widths to :data:`PAD_MULTIPLE`, exact rows and the length buckets
    of :func:`length_buckets`. Every article needs at least one chunk."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}, expected one of {', '.join(LAYOUTS)}")
    if any(len(doc) == 0 for doc in chunks):
        raise ValueError("every article needs at least one chunk")
    if any(len(doc) > max_chunks for doc in chunks):
        raise ValueError(f"an article has more than {max_chunks} chunks")
    flat = {b * max_chunks + c: chunk for b, doc in enumerate(chunks) for c, chunk in enumerate(doc)}
    calls = _call_rows(chunks, layout, limit, max_chunks, stable)
    total = sum(rows for _, _, rows in calls)
    gather = np.full(len(chunks) * max_chunks, total, dtype=np.int64)  # (batch * max_chunks,)
    ids_list, mask_list, offset = [], [], 0
    for slots, width, rows in calls:  # numpy, not torch: the host's work dispatches no operator
        ids = np.full((rows, width), pad_id, dtype=np.int64)  # (rows, width)
        mask = np.zeros((rows, width), dtype=np.int64)  # (rows, width)
        mask[:, 0] = 1  # dummy rows and empty slots attend to their first position
        for r, slot in enumerate(slots):
            chunk = flat.get(slot)
            if chunk is not None:
                ids[r, : len(chunk)] = chunk
                mask[r, : len(chunk)] = 1
                gather[slot] = offset + r
        ids_list.append(torch.from_numpy(ids))
        mask_list.append(torch.from_numpy(mask))
        offset += rows
    tokens = np.zeros((len(chunks), max_chunks), dtype=np.int64)  # (batch, max_chunks)
    for b, doc in enumerate(chunks):
        tokens[b, : len(doc)] = [len(chunk) for chunk in doc]
    counts = np.array([len(doc) for doc in chunks])
    chunk_mask = torch.from_numpy(np.arange(max_chunks)[None, :] < counts[:, None])  # (batch, max_chunks)
    return ChunkBatch(tuple(ids_list), tuple(mask_list), torch.from_numpy(gather), chunk_mask, torch.from_numpy(tokens))


def host_to_device(value, device: torch.device | str):
    """A tensor, or a dict/tuple/list of them (a :class:`ChunkBatch`), on ``device``: to a GPU
    through pinned memory and without waiting (a pageable copy synchronises the host)."""
    device = torch.device(device)
    if isinstance(value, ChunkBatch):
        return value.to(device)
    if isinstance(value, dict):
        return {k: host_to_device(v, device) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(host_to_device(v, device) for v in value)
    if device.type == "cuda" and value.device.type == "cpu":
        return value.pin_memory().to(device, non_blocking=True)
    return value.to(device)


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
