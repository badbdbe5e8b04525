"""MVCL's fine-tuned PLM (``rerank.<variant>.plm: finetune``): token ids in, token states out
inside the training step, so that the losses' gradients reach the PLM (Wang, IJCNN 2022,
§IV-C: the PLM is fine-tuned with Adam at 2e-5 on inputs of up to 512 tokens).

:class:`PLMTokens` stands where a frozen re-ranker reads a :class:`TokenStore` of cached
states: the same ``batch(keys, device) -> (states, mask)``, ``dim`` and ``in``, but the
states are computed by the PLM on the call (with gradients in training), and
:meth:`PLMTokens.encode_store` freezes the current PLM's states of a selection into a
store for scoring (dev evaluation; the search side does the same with the saved PLM).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from lexgraph.encoding.rerank_features import TokenStore

log = logging.getLogger(__name__)


# what one more PLM call costs on a CPU, in padded tokens: chunks are cut where they save more
CHUNK_OVERHEAD_TOKENS = 64
ONE_CHUNK = 1 << 40  # accelerators: one padded batch (padding is cheaper than a serial call there)


def length_chunks(lengths: Sequence[int], overhead: int = CHUNK_OVERHEAD_TOKENS) -> list[list[int]]:
    """Indices of ``lengths`` in chunks of similar lengths (shortest first) that minimise the
    padded tokens ``sum(len(chunk) * max length in it)`` plus ``overhead`` per chunk (exact:
    dynamic programming over the sorted lengths). A fine-tuning step pads a random batch
    (questions of ~40 tokens, articles of 10 to 512) to its longest text otherwise."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    sizes = [max(int(lengths[i]), 1) for i in order]
    cost = [0.0] + [float("inf")] * len(sizes)
    cut = [0] * (len(sizes) + 1)
    for end in range(1, len(sizes) + 1):
        for start in range(end):
            c = cost[start] + (end - start) * sizes[end - 1] + overhead
            if c < cost[end]:
                cost[end], cut[end] = c, start
    chunks, end = [], len(sizes)
    while end > 0:
        chunks.append(order[cut[end] : end])
        end = cut[end]
    return chunks[::-1]


class PLMTokens:
    """Token ids of many texts (``ids`` -> ``sequences``) and the trainable ``plm`` that turns
    them into last-layer token states."""

    def __init__(
        self, ids: Sequence[int], sequences: Sequence[Sequence[int]], plm: torch.nn.Module, pad_id: int
    ) -> None:
        self.sequences = {int(i): list(s) for i, s in zip(ids, sequences)}
        self.plm, self.pad_id = plm, int(pad_id)

    @property
    def dim(self) -> int:
        return int(self.plm.config.hidden_size)

    def __contains__(self, key: int) -> bool:
        return int(key) in self.sequences

    def _padded(self, rows: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        length = max((len(r) for r in rows), default=1)
        ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)  # (n, L)
        mask = torch.zeros(len(rows), length, dtype=torch.long)  # (n, L)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
        return ids.to(device), mask.to(device)

    def batch(self, keys: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The PLM's states ``(n, L, dim)`` of ``keys`` (gradients flow when enabled) and the bool
        mask ``(n, L)``; called under the training step's autocast. The PLM runs on chunks of
        similar lengths (:func:`length_chunks`), each padded to its own longest sequence; what
        stands at padding positions means nothing (zeros, or the PLM's states of pad tokens)
        and every reader masks it."""
        rows = [self.sequences[int(k)] for k in keys]
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)  # (n,)
        length = max(int(lengths.max()), 1) if rows else 1
        mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).to(device)  # (n, L)
        overhead = CHUNK_OVERHEAD_TOKENS if device.type == "cpu" else ONE_CHUNK
        order, parts = [], []
        for chunk in length_chunks([len(r) for r in rows], overhead):
            ids, chunk_mask = self._padded([rows[i] for i in chunk], device)  # (c, Lc)
            states = self.plm(input_ids=ids, attention_mask=chunk_mask).last_hidden_state  # (c, Lc, dim)
            parts.append(torch.nn.functional.pad(states, (0, 0, 0, length - states.shape[1])))  # (c, L, dim)
            order += chunk
        where = torch.empty(len(rows), dtype=torch.long)
        where[torch.tensor(order, dtype=torch.long)] = torch.arange(len(rows))
        return torch.cat(parts, 0).index_select(0, where.to(device)), mask  # (n, L, dim), (n, L)

    @torch.no_grad()
    def encode_store(self, keys: Sequence[int], batch_size: int, device: torch.device, autocast) -> TokenStore:
        """The current PLM's states of ``keys`` (eval mode, float16 as the frozen cache) in a store."""
        was_training = self.plm.training
        self.plm.eval()
        order = sorted(dict.fromkeys(int(k) for k in keys), key=lambda k: len(self.sequences[k]))
        states: dict[int, torch.Tensor] = {}
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            with autocast():
                out, mask = self.batch(rows, device)
            out = out.float().cpu().half()  # (b, L, dim)
            for j, k in enumerate(rows):
                states[k] = out[j, : int(mask[j].sum())].clone()
        self.plm.train(was_training)
        keys_sorted = sorted(states)
        return TokenStore.from_list(keys_sorted, [states[k] for k in keys_sorted], self.dim)


def load_plm(directory, device: torch.device):
    """``(plm, tokenizer, query_prefix, passage_prefix)``: the base checkpoint, trainable."""
    from lexgraph.models.backbone import load_backbone
    from lexgraph.models.family import read_base_info

    plm, tokenizer = load_backbone(directory)
    info = read_base_info(directory)
    plm.to(device).train().requires_grad_(True)
    return plm, tokenizer, info["query_prefix"], info["passage_prefix"]
