"""The finished blocks of `lexgraph index` (lexgraph.encoding.chunk_blocks) are reused only when
whole (issue 40, item 4): a block with a flipped bit, 0xFF bytes, truncated, empty or without its
recorded digest is encoded again, with one log line naming it, and the table is the one an
uninterrupted run gives. (tests/test_index.py runs the same through `lexgraph index`.)"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import lexgraph.encoding.chunk_blocks as blocks
from lexgraph.encoding.chunks import SETTINGS, ChunkTable

IDS = list(range(10, 20))
TEXTS = [f"article {i} " * (i % 3 + 1) for i in IDS]


def fake_table(encoder, ids, texts, batch_size, desc=None):
    """Chunk vectors as a function of the texts alone (what the real encoder guarantees)."""
    counts = [len(t.split()) // 2 for t in texts]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    tokens = torch.tensor([3 + c for c, n in zip(counts, counts) for _ in range(n)], dtype=torch.long)  # (m,)
    vectors = torch.stack(
        [torch.full((4,), float(i) + k / 10) for i, n in zip(ids, counts) for k in range(n)]
    )  # (m, 4)
    return ChunkTable(np.asarray(ids, dtype=np.int64), offsets, tokens, vectors, {k: "x" for k in SETTINGS})


class Kill(Exception):
    pass


def encode(folder, monkeypatch, kill_at: int | None = None) -> tuple[ChunkTable, list[int]]:
    calls = []

    def counted(encoder, ids, texts, batch_size, desc=None, stable=False, unit="text"):
        calls.append(int(ids[0]))
        if len(calls) == kill_at:
            raise Kill
        return fake_table(encoder, ids, texts, batch_size, desc)

    monkeypatch.setattr(blocks, "encode_chunk_table", counted)
    return blocks.encode_in_blocks(None, "articles", IDS, TEXTS, batch_size=2, block=3, folder=folder), calls


def same(a: ChunkTable, b: ChunkTable) -> bool:
    return (
        np.array_equal(a.ids, b.ids)
        and np.array_equal(a.offsets, b.offsets)
        and torch.equal(a.tokens, b.tokens)
        and torch.equal(a.vectors, b.vectors)
    )


def flip_bit(path):
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01  # in the last vector
    path.write_bytes(bytes(data))


def ones(path):
    data = bytearray(path.read_bytes())
    data[-64:] = b"\xff" * 64  # nan vectors
    path.write_bytes(bytes(data))


DAMAGE = {
    "a flipped bit": flip_bit,
    "64 bytes of 0xFF": ones,
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:-7]),
    "empty": lambda p: p.write_bytes(b""),
    "no recorded digest": lambda p: blocks.write_digests(
        p.parent, {k: v for k, v in blocks.read_digests(p.parent).items() if k != p.name}
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_block_is_encoded_again_with_one_line(tmp_path, monkeypatch, caplog, damage):
    whole, _ = encode(tmp_path / "whole", monkeypatch)
    folder = tmp_path / "partial"
    with pytest.raises(Kill):
        encode(folder, monkeypatch, kill_at=4)  # blocks 0, 3 and 6 written, killed in the fourth
    first = folder / "articles-0000000000.safetensors"
    DAMAGE[damage](first)
    caplog.set_level(logging.INFO, logger="lexgraph")
    table, calls = encode(folder, monkeypatch)
    assert calls == [10, 19]  # the damaged first block and the one never finished
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and lines[0].startswith(f"index: {first} ") and "encoding that block again" in lines[0]
    assert "2 of 4 blocks already encoded" in caplog.text
    assert same(table, whole)
    assert blocks.read_digests(folder).keys() == {f"articles-{s:010d}.safetensors" for s in (0, 3, 6, 9)}


def test_whole_blocks_are_reused_and_their_digests_check_with_sha256sum(tmp_path, monkeypatch):
    import shutil
    import subprocess

    whole, _ = encode(tmp_path / "whole", monkeypatch)
    table, calls = encode(tmp_path / "whole", monkeypatch)
    assert calls == [] and same(table, whole)
    if shutil.which("sha256sum"):
        check = subprocess.run(["sha256sum", "-c", blocks.DIGESTS], cwd=tmp_path / "whole", capture_output=True)
        assert check.returncode == 0 and check.stdout.count(b": OK") == 4
