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

A block is reused only when it is whole: once a block file is written, its SHA-256 is added to
``SHA256SUMS`` in the same folder (``sha256sum -c SHA256SUMS`` checks them; the list is rewritten
atomically after the block). A block whose bytes do not match (a flipped bit, a truncated file),
one without a recorded digest (a write cut short) or one that does not read back as the block
of its texts is encoded again, with one log line naming it.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from lexgraph.core.errors import LexgraphError
from lexgraph.core.io import write_text
from lexgraph.core.progress import progress
from lexgraph.core.provenance import digest_path, settings_digest
from lexgraph.encoding.chunks import SETTINGS, ChunkTable, encode_chunk_table, load_chunk_table, save_chunk_table

log = logging.getLogger(__name__)

#: the digests of a block folder's finished blocks (``sha256sum``'s format)
DIGESTS = "SHA256SUMS"


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
    offsets, total = [np.zeros(1, dtype=np.int64)], 0
    for table in tables:  # an empty table (no text) adds nothing
        offsets.append(table.offsets[1:] + total)
        total += int(table.offsets[-1])
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
    stable: bool = False,
) -> ChunkTable:
    """The chunk table of ``texts`` (chunk vectors by ``encoder``, a HierarchicalArticleEncoder),
    encoded ``block`` texts at a time (``stable``: in shape-stable batches,
    :func:`~lexgraph.encoding.chunks.encode_chunk_table`); each finished block is kept in ``folder``
    (``<name>-<first row>.safetensors``), and blocks already there are read instead of encoded."""
    ids = np.asarray(ids, dtype=np.int64)
    if not len(ids):  # nothing to encode (a corpus without headings): an empty table, chunked alike
        settings = {key: str(getattr(encoder, key)) for key in SETTINGS}
        empty = torch.empty(0, dtype=torch.long)  # (0,)
        return ChunkTable(ids, np.zeros(1, dtype=np.int64), empty, torch.empty(0, encoder.dim), settings)
    starts = list(range(0, len(ids), block))
    paths = [folder / f"{name}-{start:010d}.safetensors" for start in starts]
    recorded = read_digests(folder)
    done: dict[int, ChunkTable] = {}
    for start, path in zip(starts, paths):
        if path.exists() or path.is_symlink():
            table = _reuse(path, recorded, ids[start : start + block])
            if table is not None:
                done[start] = table
    if done:
        log.info("index: resuming the %s: %d of %d blocks already encoded in %s", name, len(done), len(starts), folder)
    tables = []
    for start, path in progress(list(zip(starts, paths)), f"index: encode {name} (blocks of {block})", unit="block"):
        if start in done:
            tables.append(done.pop(start))
            continue
        table = encode_chunk_table(
            encoder,
            ids[start : start + block],
            texts[start : start + block],
            batch_size,
            desc=f"index: encode {name}",
            stable=stable,
            unit=name.removesuffix("s"),
        )
        save_chunk_table(table, path)
        recorded[path.name] = digest_path(path)
        write_digests(folder, recorded)
        tables.append(table)
    return concat_tables(tables)


def read_digests(folder: Path) -> dict[str, str]:
    """``{file name: SHA-256}`` of ``folder``'s :data:`DIGESTS` ({} when there is none; a line
    that is not ``<64 hex digits>  <name>`` is ignored)."""
    try:
        text = (folder / DIGESTS).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    digests = {}
    for line in text.splitlines():
        digest, _, file = line.partition("  ")
        if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest) and file:
            digests[file] = digest
    return digests


def write_digests(folder: Path, digests: dict[str, str]) -> None:
    write_text("".join(f"{digest}  {file}\n" for file, digest in sorted(digests.items())), folder / DIGESTS)


def _reuse(path: Path, recorded: dict[str, str], ids: np.ndarray) -> ChunkTable | None:
    """The finished block ``path`` when it is whole (its digest recorded and matching, read
    back as the block of ``ids``), else ``None``: it is removed, with one log line naming it."""
    why = None
    if path.name not in recorded:
        why = f"has no SHA-256 in {DIGESTS} (its write was cut short)"
    else:
        try:
            if digest_path(path) != recorded[path.name]:
                why = f"is damaged: its SHA-256 is not the one {DIGESTS} recorded when it was written"
        except OSError as exc:
            why = f"is unreadable ({exc.strerror or exc})"
    table = None
    if why is None:
        try:
            table = load_chunk_table(path)
        except LexgraphError as exc:
            why = f"is unreadable ({exc})"
        else:
            if not np.array_equal(table.ids, ids):
                why, table = "holds the chunks of other texts", None
    if why is not None:
        log.warning("index: %s %s; encoding that block again", path, why)
        recorded.pop(path.name, None)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    return table
