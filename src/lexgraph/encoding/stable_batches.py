"""Shape-stable batches: a sequence's encoding that does not depend on its batch companions.

An incremental index re-encodes only the changed articles and must equal a from-scratch index
bit for bit. A backbone's output for one sequence, however, moves in its last bits with the
batch's shape: with torch 2.13 on a CPU (e5-small), encoding 120 articles or 80 of them with
batches padded to their longest sequence gave 16 of the 80 shared articles different bits (up to
5e-7); a fixed length but a varying batch size still moved 25 of 36. With a fixed batch shape
``(rows, length)``, the 24 rows measured were identical whatever their companions and position.

So the canonical encoding (:func:`stable_batches`): every sequence padded to its length rounded
up to a multiple of ``step`` (its *bucket*, at most ``max_length``), sequences grouped by bucket,
and every batch exactly ``batch_size`` rows, the last batch of a bucket filled with dummy rows
whose outputs are dropped (:func:`stable_inputs` builds the tensors). A sequence's output then
depends only on its own tokens, ``step`` and ``batch_size`` (on one machine and library build).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: the bucket step of the stable encodings (benchmarks/stable_batches.json, 300 sample articles,
#: e5-small, 32 rows: step 32 encodes at 0.71 times today's articles/s, step 16 at 0.47)
STABLE_STEP = 32


@dataclass(frozen=True)
class StableBatch:
    """One batch: the indices of its real ``rows`` (in row order), the padded ``length`` of
    every row and the number of ``dummies`` rows after the real ones."""

    rows: tuple[int, ...]
    length: int
    dummies: int

    @property
    def size(self) -> int:
        """Rows in all, real and dummy: the planner's ``batch_size``."""
        return len(self.rows) + self.dummies


def batching(batch_size: int, device, config=None, step: int = STABLE_STEP) -> str:
    """What a stable encoding's bits depend on besides a text's tokens, as a key (a cache records it):
    the batch shape (``batch_size`` rows, lengths rounded up to ``step``), the torch, transformers
    and tokenizers builds, the backbone's attention implementation (``config``'s, when given) and
    the kernels it runs on ``device`` (the CPU's instruction set, or the accelerator's name): vectors
    made otherwise may differ in their last bits, so they are not mixed with these."""
    from importlib.metadata import version

    import torch

    device = torch.device(device)
    if device.type == "cuda":
        kernels = torch.cuda.get_device_name(device)
    elif device.type == "cpu":
        kernels = f"cpu {torch.backends.cpu.get_cpu_capability()}"
    else:
        kernels = device.type
    builds = f"torch={torch.__version__} transformers={version('transformers')} tokenizers={version('tokenizers')}"
    attention = getattr(config, "_attn_implementation", None)
    return f"stable rows={int(batch_size)} step={int(step)} {builds} attention={attention} on {kernels}"


def bucket_length(length: int, step: int, max_length: int | None = None) -> int:
    """The padded length of a sequence of ``length`` tokens: ``length`` rounded up to a multiple
    of ``step`` (at least ``step``), at most ``max_length``; a longer sequence is refused."""
    if step < 1:
        raise ValueError(f"step must be at least 1, got {step}")
    if length < 0 or (max_length is not None and length > max_length):
        raise ValueError(f"a sequence of {length} tokens, expected 0 to {max_length}")
    bucket = max(-(-length // step), 1) * step
    return bucket if max_length is None else min(bucket, max_length)


def stable_batches(
    lengths: Sequence[int], batch_size: int, step: int, max_length: int | None = None
) -> list[StableBatch]:
    """Shape-stable batches of sequences of ``lengths`` (see the module docstring): buckets
    longest first, and in a bucket the sequences by index, ``batch_size`` to a batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    buckets: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        buckets.setdefault(bucket_length(int(n), step, max_length), []).append(i)
    batches = []
    for length in sorted(buckets, reverse=True):
        members = buckets[length]
        for start in range(0, len(members), batch_size):
            rows = tuple(members[start : start + batch_size])
            batches.append(StableBatch(rows, length, batch_size - len(rows)))
    return batches


def stable_inputs(
    sequences: Sequence[Sequence[int]], batch: StableBatch, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention`` ``(batch.size, batch.length)`` of ``batch``: its real rows
    (``sequences[i]``, then ``pad_id``), then its dummy rows (one attended ``pad_id``, so that no
    row is wholly masked)."""
    input_ids = torch.full((batch.size, batch.length), pad_id, dtype=torch.long)  # (batch, len)
    attention = torch.zeros((batch.size, batch.length), dtype=torch.long)  # (batch, len)
    for row, i in enumerate(batch.rows):
        tokens = sequences[i]
        input_ids[row, : len(tokens)] = torch.as_tensor(list(tokens), dtype=torch.long)
        attention[row, : len(tokens)] = 1
    attention[len(batch.rows) :, 0] = 1  # the dummy rows
    return input_ids, attention
