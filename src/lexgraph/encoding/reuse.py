"""Chunk vectors reused text by text from an earlier table (``lexgraph index`` over an earlier index).

An amended corpus differs from the one indexed before in a few articles. :func:`reuse_rows` finds,
for each text to encode, a text of an earlier chunk table with the same content (by SHA-256 of its
UTF-8 bytes, whatever its id), when that table was made under the same key: the encoder's digest,
its chunk settings and its batching (:func:`reuse_key`). Only the others are encoded;
:func:`assemble` puts the reused and the new rows back in the corpus's order. With shape-stable
batches (:mod:`lexgraph.encoding.stable_batches`) a chunk's vector depends on its own tokens only,
so the assembled table is bit for bit the one a fresh encoding of the whole corpus gives.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from lexgraph.encoding.chunk_blocks import concat_tables
from lexgraph.encoding.chunks import ChunkTable

#: the chunk file metadata keys that say how its vectors were made, besides the chunk settings
KEY_FIELDS = ("encoder", "batching")


def reuse_key(settings: Mapping[str, str], encoder: str, batching: str) -> dict[str, str]:
    """What a chunk table's vectors depend on besides each text: its chunk ``settings``, the
    ``encoder``'s digest and the ``batching`` (a shape-stable batch's rows and step)."""
    return {**settings, "encoder": encoder, "batching": batching}


def text_digests(texts: Sequence[str]) -> list[bytes]:
    """SHA-256 of each text's UTF-8 bytes (lone surrogates kept, as the block digests keep them)."""
    return [hashlib.sha256(t.encode("utf-8", "surrogatepass")).digest() for t in texts]


def reuse_rows(texts: Sequence[str], earlier_texts: Sequence[str]) -> np.ndarray:
    """For each of ``texts``, the row of an earlier text with the same content, or -1 ``(n,)``."""
    where = {d: row for row, d in enumerate(text_digests(earlier_texts))}
    return np.asarray([where.get(d, -1) for d in text_digests(texts)], dtype=np.int64)


def take(table: ChunkTable, rows: Sequence[int] | np.ndarray) -> ChunkTable:
    """The texts ``rows`` of ``table``, in that order, with all their chunks."""
    rows = np.asarray(rows, dtype=np.int64)
    starts, ends = table.offsets[rows], table.offsets[rows + 1]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(ends - starts)
    spans = [np.arange(s, e, dtype=np.int64) for s, e in zip(starts, ends)]
    index = torch.from_numpy(np.concatenate(spans) if spans else np.zeros(0, dtype=np.int64))  # (m,)
    vectors = None if table.vectors is None else table.vectors[index]  # (m, dim)
    return ChunkTable(table.ids[rows], offsets, table.tokens[index], vectors, dict(table.settings))


def assemble(ids: Sequence[int], found: np.ndarray, earlier: ChunkTable, fresh: ChunkTable) -> ChunkTable:
    """The chunk table of ``ids``: text ``i`` takes ``earlier``'s row ``found[i]`` when it is not -1,
    else the next row of ``fresh`` (the encoded texts, in the corpus's order)."""
    ids = np.asarray(ids, dtype=np.int64)
    reused = np.flatnonzero(found >= 0)
    both = concat_tables([take(earlier, found[reused]), fresh])  # reused texts first, then the new
    position = np.empty(len(ids), dtype=np.int64)
    position[reused] = np.arange(len(reused))
    position[found < 0] = len(reused) + np.arange(len(ids) - len(reused))
    table = take(both, position)
    table.ids = ids
    return table
