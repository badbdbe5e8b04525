"""Chunk vectors encoded in blocks that survive an interruption (``lexgraph index``).

Encoding the chunks of a corpus is the whole cost of indexing it (about 10 articles a second
per CPU thread with the sample's e5-small). :func:`encode_in_blocks` encodes ``block`` texts at a
time with :func:`lexgraph.encoding.chunks.encode_chunk_table` and writes each finished block
(a chunk cache file, :func:`~lexgraph.encoding.chunks.save_chunk_table`, written atomically)
under ``partial/<fingerprint>/``; a later call with the same fingerprint (the same texts,
encoder, chunk settings, block and batch size: :func:`block_fingerprint`) reads the finished
blocks back instead of encoding them again, and logs one line saying so. The blocks together
are one :class:`~lexgraph.encoding.chunks.ChunkTable`, the same whether or not a run was
interrupted (each block is always encoded alone).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from lexgraph.core.progress import progress
from lexgraph.core.provenance import settings_digest
from lexgraph.encoding.chunks import SETTINGS, ChunkTable, encode_chunk_table, load_chunk_table, save_chunk_table

log = logging.getLogger(__name__)


def texts_digest(ids: Sequence[int], texts: Sequence[str]) -> str:
    """SHA-256 of ``ids`` and ``texts`` (what a block of chunk vectors is encoded from)."""
    digest = hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes())
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")
        digest.update(b"%d:" % len(data))
        digest.update(data)
    return digest.hexdigest()


def block_fingerprint(ids: Sequence[int], texts: Sequence[str], encoder_digest: str, settings: dict) -> str:
    """The name of a run's block folder: the texts, the encoder and ``settings`` (chunking, block
    and batch size), so that blocks are only reused by a run that would encode them alike."""
    return settings_digest({"texts": texts_digest(ids, texts), "encoder": encoder_digest, "settings": settings})[:32]


def concat_tables(tables: Sequence[ChunkTable]) -> ChunkTable:
    """One chunk table of ``tables`` in order (their chunk settings are the first's)."""
    offsets = [np.zeros(1, dtype=np.int64)]
    for table in tables:
        offsets.append(table.offsets[1:] + offsets[-1][-1])
    vectors = None if tables[0].vectors is None else torch.cat([t.vectors for t in tables])  # (m, dim)
    return ChunkTable(
        np.concatenate([t.ids for t in tables]),
        np.concatenate(offsets),
        torch.cat([t.tokens for t in tables]),  # (m,)
        vectors,
        dict(tables[0].settings),
    )


def encode_in_blocks(
    encoder,
    name: str,
    ids: Sequence[int],
    texts: Sequence[str],
    *,
    batch_size: int,
    block: int,
    folder: Path,
) -> ChunkTable:
    """The chunk table of ``texts`` (chunk vectors by ``encoder``, a HierarchicalArticleEncoder),
    encoded ``block`` texts at a time; each finished block is kept in ``folder``
    (``<name>-<first row>.safetensors``), and blocks already there are read instead of encoded."""
    ids = np.asarray(ids, dtype=np.int64)
    if not len(ids):  # nothing to encode (a corpus without headings): an empty table, chunked alike
        settings = {key: str(getattr(encoder, key)) for key in SETTINGS}
        empty = torch.empty(0, dtype=torch.long)  # (0,)
        return ChunkTable(ids, np.zeros(1, dtype=np.int64), empty, torch.empty(0, encoder.dim), settings)
    starts = list(range(0, len(ids), block))
    paths = [folder / f"{name}-{start:010d}.safetensors" for start in starts]
    done = sum(path.is_file() for path in paths)
    if done:
        log.info("index: resuming the %s: %d of %d blocks already encoded in %s", name, done, len(starts), folder)
    tables = []
    for start, path in progress(list(zip(starts, paths)), f"index: encode {name} (blocks of {block})", unit="block"):
        if path.is_file():
            tables.append(load_chunk_table(path))
            continue
        table = encode_chunk_table(
            encoder, ids[start : start + block], texts[start : start + block], batch_size, desc=f"{name} block"
        )
        save_chunk_table(table, path)
        tables.append(table)
    return concat_tables(tables)
