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
from typing import Sequence

import torch

from lexgraph.models.mvcl_features import TokenStore

log = logging.getLogger(__name__)


class PLMTokens:
    """Token ids of many texts (``ids`` -> ``sequences``) and the trainable ``plm`` that turns
    them into last-layer token states."""

    def __init__(self, ids: Sequence[int], sequences: Sequence[Sequence[int]], plm: torch.nn.Module,
                 pad_id: int) -> None:
        self.sequences = {int(i): list(s) for i, s in zip(ids, sequences)}
        self.plm, self.pad_id = plm, int(pad_id)

    @property
    def dim(self) -> int:
        return int(self.plm.config.hidden_size)

    def __contains__(self, key: int) -> bool:
        return int(key) in self.sequences

    def _padded(self, keys: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self.sequences[int(k)] for k in keys]
        length = max((len(r) for r in rows), default=1)
        ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)  # (n, L)
        mask = torch.zeros(len(rows), length, dtype=torch.long)  # (n, L)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
        return ids.to(device), mask.to(device)

    def batch(self, keys: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The PLM's states ``(n, L, dim)`` of ``keys`` (gradients flow when enabled) and the bool
        mask ``(n, L)``; called under the training step's autocast."""
        ids, mask = self._padded(keys, device)
        states = self.plm(input_ids=ids, attention_mask=mask).last_hidden_state  # (n, L, dim)
        return states, mask.bool()

    @torch.no_grad()
    def encode_store(self, keys: Sequence[int], batch_size: int, device: torch.device, autocast) -> TokenStore:
        """The current PLM's states of ``keys`` (eval mode, float16 as the frozen cache) in a store."""
        was_training = self.plm.training
        self.plm.eval()
        order = sorted(dict.fromkeys(int(k) for k in keys), key=lambda k: len(self.sequences[k]))
        states: dict[int, torch.Tensor] = {}
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
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
