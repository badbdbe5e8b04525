"""MVCL's fine-tuned PLM (``rerank.<variant>.plm: finetune``): token ids in, token states out
inside the training step, so that the losses' gradients reach the PLM (Wang, IJCNN 2022,
§IV-C: the PLM is fine-tuned with Adam at 2e-5 on inputs of up to 512 tokens, "the documents
longer than 512 tokens are truncated from the front"). The token ids it is given are already
cut: :func:`lexgraph.methods.rerank.features.token_inputs` at ``rerank.<variant>.truncation``
(``left`` for ``mvcl``: a long text keeps its last tokens).

:class:`PLMTokens` stands where a frozen re-ranker reads a :class:`TokenStore` of cached
states: the same ``batch(keys, device) -> (states, mask)``, ``dim`` and ``in``, but the
states are computed by the PLM on the call (with gradients in training), and
:meth:`PLMTokens.encode_store` freezes the current PLM's states of a selection into a
store for scoring (dev evaluation; the search side does the same with the saved PLM).

``rerank.<variant>.plm_layers`` = ``N`` (the sample's budget rule: only the PLM's top ``N`` blocks
train, as QABISAR's distilled query encoder, :class:`lexgraph.methods.gnn.train.StudentCache`):
:func:`plm_stores` freezes the embeddings and the blocks below the top ``N``
(:func:`lexgraph.models.backbone.set_trainable_layers`) and computes, once per article and
question (at the variant's truncation), the token states entering the top blocks
(:func:`lexgraph.models.backbone.frozen_states`: eval mode, no gradients), kept in memory in
:data:`CACHE_DTYPE`; a step then runs the top blocks alone over the batch's cached states
(:func:`lexgraph.models.backbone.top_states`, with gradients and, in training mode, their dropout).
The lower blocks thus run without dropout, where a full fine-tuning would apply it there too. An
element view (MVCL eq. 8: the article with its non-element sentences' tokens replaced by
[DEL]) is another token sequence, whose states no article's cache holds: its store runs the frozen
blocks on every call (no gradients) and the top blocks with gradients. ``plm_layers: null`` runs
the whole PLM in the step (every weight trains), as before. Either way the saved PLM is the whole
model, whose full forward gives the states the cached path gives (the frozen blocks never change).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from lexgraph.methods.rerank.features import TokenInputs, TokenStore

log = logging.getLogger(__name__)

#: the dtype of the cached states below the top ``plm_layers`` blocks: float32, so that the top
#: blocks read what a full forward passes them (the sample's cache: 275,838 tokens x 384 = 404 MiB).
#: float16 would halve it but moved e5-small's last states by 4e-4 and an untrained mvcl network's
#: scores by 5e-4 (one of 10 dev lists reordered), where float32 left them within 2e-5 of the
#: full forward (the final float16 rounding of the scoring store) and every order the same.
CACHE_DTYPE = torch.float32


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
    them into last-layer token states. ``layers``: None, the whole PLM runs on every call; ``N``,
    the frozen blocks below the top ``N`` run without gradients, from the cache that
    :meth:`cache_frozen` built (``cache``) or, without one, on the call, then the top ``N`` blocks."""

    def __init__(
        self,
        ids: Sequence[int],
        sequences: Sequence[Sequence[int]],
        plm: torch.nn.Module,
        pad_id: int,
        layers: int | None = None,
    ) -> None:
        self.sequences = {int(i): list(s) for i, s in zip(ids, sequences)}
        self.plm, self.pad_id = plm, int(pad_id)
        self.layers = layers
        self.cache: TokenStore | None = None  # the states entering the top `layers` blocks, per text

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
            states = self._states([keys[i] for i in chunk], [rows[i] for i in chunk], device)  # (c, Lc, dim)
            parts.append(torch.nn.functional.pad(states, (0, 0, 0, length - states.shape[1])))  # (c, L, dim)
            order += chunk
        where = torch.empty(len(rows), dtype=torch.long)
        where[torch.tensor(order, dtype=torch.long)] = torch.arange(len(rows))
        return torch.cat(parts, 0).index_select(0, where.to(device)), mask  # (n, L, dim), (n, L)

    def _states(self, keys: Sequence[int], rows: Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
        """The last-layer states ``(c, Lc, dim)`` of one chunk (``rows``: the token ids of ``keys``)."""
        from lexgraph.models.backbone import frozen_states, top_states

        if self.layers is None:  # the whole PLM
            ids, mask = self._padded(rows, device)  # (c, Lc)
            return self.plm(input_ids=ids, attention_mask=mask).last_hidden_state  # (c, Lc, dim)
        if self.cache is not None:  # the cached states below the top blocks
            hidden, mask = self.cache.batch(keys, device)  # (c, Lc, dim), (c, Lc)
        else:  # a sequence no cache holds (an element view): the frozen blocks now, without gradients
            ids, mask = self._padded(rows, device)  # (c, Lc)
            hidden = frozen_states(self.plm, ids, mask, self.layers)  # (c, Lc, dim)
        return top_states(self.plm, hidden, mask, self.layers)  # (c, Lc, dim)

    @torch.no_grad()
    def cache_frozen(self, batch_size: int, device: torch.device, desc: str = "cache frozen states") -> None:
        """Compute once the states entering the top ``layers`` blocks of every text (the embeddings
        and the frozen blocks in eval mode, without gradients, in length-sorted batches of
        ``batch_size``) and keep them, unpadded, in :data:`CACHE_DTYPE` on the CPU."""
        from lexgraph.core.progress import progress
        from lexgraph.models.backbone import frozen_states

        if self.layers is None:
            raise ValueError("cache_frozen needs layers: the whole PLM trains without a cache")
        keys = sorted(self.sequences, key=lambda k: (len(self.sequences[k]), k))
        states: dict[int, torch.Tensor] = {}
        starts = range(0, len(keys), batch_size)
        for start in progress(starts, desc, total=len(starts), unit="batch", disable=len(keys) <= batch_size):
            rows = keys[start : start + batch_size]
            ids, mask = self._padded([self.sequences[k] for k in rows], device)  # (b, L)
            hidden = frozen_states(self.plm, ids, mask, self.layers).to("cpu", CACHE_DTYPE)  # (b, L, dim)
            for j, k in enumerate(rows):
                states[k] = hidden[j, : len(self.sequences[k])].clone()  # (len, dim)
        ordered = sorted(states)
        self.cache = TokenStore.from_list(ordered, [states[k] for k in ordered], self.dim)

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


def plm_stores(
    inputs: TokenInputs,
    plm: torch.nn.Module,
    pad_id: int,
    layers: int | None,
    batch_size: int,
    device: torch.device,
) -> tuple[PLMTokens, PLMTokens, PLMTokens]:
    """``(articles, questions, element views)`` of ``inputs`` over the fine-tuned ``plm``
    (``rerank.<variant>.plm_layers`` = ``layers``): None, every weight trains and each store runs
    the whole PLM; ``N``, only the top ``N`` blocks train (a :class:`SettingError` ``plm_layers``
    when the PLM has fewer), the articles' and questions' states below them cached once
    (:meth:`PLMTokens.cache_frozen`), the element views' computed on every call."""
    from lexgraph.core.errors import SettingError
    from lexgraph.models.backbone import set_trainable_layers, transformer_layers

    blocks = len(transformer_layers(plm))
    if layers is not None and not 1 <= layers <= blocks:
        raise SettingError("plm_layers", layers, f"null or an integer in [1, {blocks}] (the PLM's blocks)")
    set_trainable_layers(plm, layers)
    stores = (
        PLMTokens(inputs.article_ids, inputs.articles, plm, pad_id, layers),
        PLMTokens(inputs.question_ids, inputs.questions, plm, pad_id, layers),
        PLMTokens(inputs.view_ids, inputs.views, plm, pad_id, layers),
    )
    if layers is not None:
        stores[0].cache_frozen(batch_size, device, "cache articles below the top blocks")
        stores[1].cache_frozen(batch_size, device, "cache questions below the top blocks")
        frozen = sum(p.numel() for p in plm.parameters() if not p.requires_grad)
        log.info(
            "the PLM's top %d blocks train (%.1fM weights frozen); cached below them: %d articles, %d questions "
            "(%d tokens, %.0f MiB)",
            layers,
            frozen / 1e6,
            len(stores[0].sequences),
            len(stores[1].sequences),
            sum(int(s.cache.states.shape[0]) for s in stores[:2]),
            sum(s.cache.states.numel() * s.cache.states.element_size() for s in stores[:2]) / 2**20,
        )
    return stores


def load_plm(directory, device: torch.device):
    """``(plm, tokenizer, query_prefix, passage_prefix)``: the base checkpoint, trainable."""
    from lexgraph.models.backbone import load_backbone
    from lexgraph.models.family import read_base_info

    plm, tokenizer = load_backbone(directory)
    info = read_base_info(directory)
    plm.to(device).train().requires_grad_(True)
    return plm, tokenizer, info["query_prefix"], info["passage_prefix"]
