"""The re-rankers' interaction network (MVCL's ESIM form) over PLM token states.

Zhaowei Wang, "Legal Element-oriented Modeling with Multi-view Contrastive Learning for
Legal Case Retrieval", IJCNN 2022 (arXiv:2210.05188; one author), Section III-B:

1. the PLM's token states of query A, ``(La, d)``, and candidate B, ``(Lb, d)``, give the
   word-level bidirectional attention ``e_ij = h_a_i . h_b_j / sqrt(d)`` (``alignment:
   scaled_dot``: on the PLM's states, ``d`` their width), softmax over B's tokens for each
   token of A and over A's for each token of B;
2. lexgraph projects every state to ``hidden`` dimensions (``h``) and takes the aligned
   vectors ``h~`` as the attention-weighted sums of the projected states; as the weights
   sum to one, ``h~`` is the projection of the paper's aligned PLM states;
3. every token is strengthened with ``[h; h~; h - h~; h * h~]`` (4 * hidden; the paper
   does this on the PLM's states, here on their projection: the one departure in the
   interaction, to keep the BiLSTM at ``hidden``);
4. a bidirectional LSTM runs over each side's strengthened tokens; masked mean and max
   pooling of both sides give the matching vector ``H_{a,b}`` (4 * hidden);
5. an MLP over ``H_{a,b} - H_{a,c}`` says which of B and C is the more relevant
   (:class:`lexgraph.losses.PairwiseTripleLoss`).

Re-ranking a list needs a score per candidate: :meth:`InteractionModel.tournament_scores`
plays every candidate against every other one of the list with that MLP (a round robin
on the cheap matching vectors) and scores candidate b by the mean margin
``logit_0 - logit_1`` of its games as B. The attention pooling of the case and element
views (:class:`AttentionPooling`, ReLU as in the paper or tanh) reads the PLM's states of
one text through the same projection as the interaction, so the contrastive views train
what the interaction reads.

``mvcl`` fine-tunes the PLM, whose states then come from the training step
(:mod:`lexgraph.training.rerank_plm`); ``xrerank`` (lexgraph's recipe) keeps it frozen with
cached states (:mod:`lexgraph.encoding.rerank_features`), aligns by cosine / temperature and
starts from MaxSim (``match_features``, ``warm_start``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class TokenBatches(Protocol):
    """Token states by id (``lexgraph.encoding.rerank_features.TokenStore``)."""

    def batch(self, keys: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]: ...


#: Where the word-level attention ``e`` is computed (``rerank.<variant>.alignment``):
#: ``scaled_dot`` = ``h_a . h_b / sqrt(d)`` on the PLM's states (MVCL §III-B), ``cosine`` =
#: their cosine / ``align_temperature`` (xrerank), ``projected`` = the scaled dot product of
#: the learned projections.
ALIGNMENTS = ("scaled_dot", "cosine", "projected")
POOLINGS = ("relu", "tanh")

_NEG = -1e4


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax of ``scores`` over ``dim`` where ``mask`` is True (fully masked rows give 0)."""
    scores = scores.masked_fill(~mask, _NEG)
    return torch.softmax(scores, dim=dim) * mask


class AttentionPooling(nn.Module):
    """``v = sum_t alpha_t W h_t``, ``alpha = softmax_t(w^T act(W h_t))`` over unmasked tokens,
    ``act`` ReLU (MVCL §III-C) or tanh (xrerank); ``W`` is the projection it is given (the
    interaction network's own, shared)."""

    def __init__(self, proj: nn.Linear, hidden: int, activation: str = "tanh") -> None:
        super().__init__()
        if activation not in POOLINGS:
            raise ValueError(f"activation must be one of {POOLINGS}, got {activation!r}")
        self.score = nn.Linear(hidden, 1, bias=False)
        self._proj = [proj]  # shared, not registered twice
        self.activation = torch.relu if activation == "relu" else torch.tanh

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self._proj[0](states)  # (batch, len, hidden)
        alpha = masked_softmax(self.score(self.activation(h)).squeeze(-1), mask, dim=1)  # (batch, len)
        return torch.einsum("bl,bld->bd", alpha, h)  # (batch, hidden)


class PairClassifier(nn.Module):
    """MVCL's MLP over ``H_{a,b} - H_{a,c}`` (2 logits, class 0: B is the more relevant), plus,
    when the matching vectors end with ``n_features`` alignment scores, a linear skip over
    their difference that adds ``+s/2`` to logit 0 and ``-s/2`` to logit 1 (margin ``+s``)."""

    def __init__(self, match_dim: int, hidden: int, dropout: float, n_features: int = 0) -> None:
        super().__init__()
        self.n_features = int(n_features)
        self.mlp = nn.Sequential(nn.Linear(match_dim, hidden), nn.Tanh(), nn.Dropout(dropout), nn.Linear(hidden, 2))
        self.skip = nn.Linear(self.n_features, 1, bias=False) if self.n_features else None

    def forward(self, diff: torch.Tensor) -> torch.Tensor:
        logits = self.mlp(diff)  # (..., 2)
        if self.skip is None:
            return logits
        s = self.skip(diff[..., -self.n_features :])  # (..., 1)
        return logits + torch.cat([s, -s], dim=-1) / 2  # (..., 2)


class InteractionModel(nn.Module):
    """ESIM-style interaction of a query and a candidate into ``H_{a,b}``, the pairwise
    MLP, and the attention pooling of the contrastive views.

    ``alignment`` says how the word-level attention ``e`` is computed: ``"scaled_dot"``,
    ``h_a . h_b / sqrt(d)`` on the PLM's own states of width ``d = input_dim`` (MVCL);
    ``"cosine"``, their cosine over ``temperature`` (xrerank); ``"projected"``, the dot
    product of the projections ``h``, scaled by ``1 / sqrt(hidden)``. The aligned vectors
    are sums of the projected states ``h`` in every case. With ``features`` on, ``H_{a,b}`` ends with three alignment
    scores of the PLM's states (:data:`FEATURES`) and the classifier has a linear skip over
    them; ``warm_start`` then initialises that skip to ``1 / temperature`` on MaxSim and
    the MLP's last layer to zero, so that the untrained network ranks a list by the PLM's
    MaxSim (ColBERT's late interaction) and training starts from a ranking the frozen PLM
    already knows."""

    FEATURES = ("maxsim_query", "maxsim_candidate", "mean_cosine")

    def __init__(
        self,
        input_dim: int,
        hidden: int = 128,
        dropout: float = 0.1,
        alignment: str = "scaled_dot",
        temperature: float = 0.05,
        features: bool = False,
        warm_start: bool = False,
        pooling: str = "relu",
    ) -> None:
        super().__init__()
        if hidden % 2:
            raise ValueError(f"hidden must be even (a bidirectional LSTM of hidden / 2 per direction), got {hidden}")
        if alignment not in ALIGNMENTS:
            raise ValueError(f"alignment must be one of {ALIGNMENTS}, got {alignment!r}")
        self.input_dim, self.hidden = int(input_dim), int(hidden)
        self.alignment, self.temperature, self.features = alignment, float(temperature), bool(features)
        self.proj = nn.Linear(input_dim, hidden)
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(4 * hidden, hidden // 2, batch_first=True, bidirectional=True)
        n_features = len(self.FEATURES) if self.features else 0
        self.classifier = PairClassifier(4 * hidden + n_features, hidden, dropout, n_features)
        self.warm_started = bool(warm_start) and self.features  # the untrained network is a ranking worth keeping
        if self.warm_started:
            with torch.no_grad():
                last = self.classifier.mlp[-1]
                last.weight.zero_()
                last.bias.zero_()
                self.classifier.skip.weight.zero_()
                self.classifier.skip.weight[0, 0] = 1.0 / self.temperature
        # the views' pooling reads the tokens through the interaction's projection: with the PLM
        # frozen, that projection is where the case and element views can shape the ranking
        self.pool = AttentionPooling(self.proj, hidden, pooling)

    @property
    def match_dim(self) -> int:
        return 4 * self.hidden + (len(self.FEATURES) if self.features else 0)

    def _aggregate(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        lengths = mask.sum(1).clamp(min=1).cpu()  # (batch,)
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])  # (batch, len, hidden)
        m = mask.unsqueeze(-1).to(out.dtype)  # (batch, len, 1)
        mean = (out * m).sum(1) / m.sum(1).clamp(min=1)  # (batch, hidden)
        peak = out.masked_fill(~mask.unsqueeze(-1), _NEG).max(1).values  # (batch, hidden)
        return torch.cat([mean, peak], dim=-1)  # (batch, 2 * hidden)

    def match(self, q: torch.Tensor, q_mask: torch.Tensor, d: torch.Tensor, d_mask: torch.Tensor) -> torch.Tensor:
        """``H_{a,b}`` for paired rows: q ``(batch, Lq, input_dim)``, d ``(batch, Ld, input_dim)``,
        masks bool ``(batch, L)`` -> ``(batch, match_dim)``."""
        hq = self.dropout(self.proj(q))  # (batch, Lq, hidden)
        hd = self.dropout(self.proj(d))  # (batch, Ld, hidden)
        pair = q_mask.unsqueeze(2) & d_mask.unsqueeze(1)  # (batch, Lq, Ld)
        cos = None
        if self.alignment == "cosine" or self.features:
            qn = nn.functional.normalize(q, dim=-1)  # (batch, Lq, input_dim)
            dn = nn.functional.normalize(d, dim=-1)  # (batch, Ld, input_dim)
            cos = qn @ dn.transpose(1, 2)  # (batch, Lq, Ld)
        if self.alignment == "cosine":
            e = cos / self.temperature  # (batch, Lq, Ld)
        elif self.alignment == "scaled_dot":
            e = q @ d.transpose(1, 2) / math.sqrt(self.input_dim)  # (batch, Lq, Ld): h_a . h_b / sqrt(d)
        else:
            e = hq @ hd.transpose(1, 2) / math.sqrt(self.hidden)  # (batch, Lq, Ld): scaled dot product
        q_aligned = masked_softmax(e, pair, dim=2) @ hd  # (batch, Lq, hidden)
        d_aligned = masked_softmax(e, pair, dim=1).transpose(1, 2) @ hq  # (batch, Ld, hidden)
        mq = torch.cat([hq, q_aligned, hq - q_aligned, hq * q_aligned], dim=-1)  # (batch, Lq, 4 * hidden)
        md = torch.cat([hd, d_aligned, hd - d_aligned, hd * d_aligned], dim=-1)  # (batch, Ld, 4 * hidden)
        parts = [self._aggregate(mq, q_mask), self._aggregate(md, d_mask)]  # 2 x (batch, 2 * hidden)
        if self.features:
            parts.append(self.alignment_features(q, q_mask, d, d_mask, cos))  # (batch, 3)
        return torch.cat(parts, dim=-1)  # (batch, match_dim)

    @staticmethod
    def alignment_features(
        q: torch.Tensor, q_mask: torch.Tensor, d: torch.Tensor, d_mask: torch.Tensor, cos: torch.Tensor
    ) -> torch.Tensor:
        """:data:`FEATURES` of paired rows ``(batch, 3)``: the mean over A's tokens of their best
        cosine with B's tokens (MaxSim), the same from B's side, and the cosine of the two
        mean-pooled texts."""
        pair = q_mask.unsqueeze(2) & d_mask.unsqueeze(1)  # (batch, Lq, Ld)
        best = cos.masked_fill(~pair, -2.0)  # (batch, Lq, Ld)
        qm, dm = q_mask.to(cos.dtype), d_mask.to(cos.dtype)  # (batch, Lq), (batch, Ld)
        maxsim_q = (best.max(2).values * qm).sum(1) / qm.sum(1).clamp(min=1)  # (batch,)
        maxsim_d = (best.max(1).values * dm).sum(1) / dm.sum(1).clamp(min=1)  # (batch,)
        q_mean = (q * qm.unsqueeze(-1)).sum(1) / qm.sum(1, keepdim=True).clamp(min=1)  # (batch, input_dim)
        d_mean = (d * dm.unsqueeze(-1)).sum(1) / dm.sum(1, keepdim=True).clamp(min=1)  # (batch, input_dim)
        mean_cos = nn.functional.cosine_similarity(q_mean, d_mean, dim=-1)  # (batch,)
        return torch.stack([maxsim_q, maxsim_d, mean_cos], dim=-1)  # (batch, 3)

    def compare(self, h_ab: torch.Tensor, h_ac: torch.Tensor) -> torch.Tensor:
        """The classifier's 2-way logits over ``H_{a,b} - H_{a,c}`` (class 0: B is the more relevant)."""
        return self.classifier(h_ab - h_ac)  # (batch, 2)

    def tournament_scores(self, h: torch.Tensor) -> torch.Tensor:
        """Scores of the ``n`` candidates of one query from their matching vectors ``(n, match_dim)``:
        candidate b's mean margin ``logit_0 - logit_1`` of ``MLP(H_b - H_c)`` over every c != b."""
        n = h.shape[0]
        if n < 2:
            return torch.zeros(n, device=h.device)
        diff = h.unsqueeze(1) - h.unsqueeze(0)  # (n, n, match_dim): [b, c] = H_b - H_c
        logits = self.classifier(diff)  # (n, n, 2)
        margin = logits[..., 0] - logits[..., 1]  # (n, n)
        margin = margin * (1 - torch.eye(n, device=h.device, dtype=margin.dtype))  # no game against itself
        return margin.sum(1) / (n - 1)  # (n,)


# ---------------------------------------------------------------------------
# Scoring and fusing a first-stage list (building, saving and loading: lexgraph.training.rerank_io)
# ---------------------------------------------------------------------------


@torch.no_grad()
def rerank_scores(
    model,
    q_states: torch.Tensor,
    candidates: Sequence[int],
    articles: TokenBatches,
    device: torch.device,
    batch_size: int = 128,
) -> np.ndarray:
    """MVCL tournament scores ``(n,)`` of ``candidates`` for one question ``(Lq, dim)``."""
    model.eval()
    if len(candidates) == 0:
        return np.zeros(0, dtype=np.float32)
    q = q_states.float().to(device).unsqueeze(0)  # (1, Lq, dim)
    h = []
    for start in range(0, len(candidates), batch_size):
        keys = list(candidates[start : start + batch_size])
        d, d_mask = articles.batch(keys, device)  # (b, Ld, dim), (b, Ld)
        qb = q.expand(len(keys), -1, -1)  # (b, Lq, dim)
        q_mask = torch.ones(qb.shape[:2], dtype=torch.bool, device=device)  # (b, Lq)
        h.append(model.match(qb, q_mask, d, d_mask).float())
    return model.tournament_scores(torch.cat(h, 0)).cpu().numpy().astype(np.float32)


def zscore(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x
    return (x - x.mean()) / max(float(x.std()), 1e-9)


def fuse_list(
    ids: np.ndarray, first: np.ndarray, mvcl: np.ndarray, alpha: float | None, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """One question's re-ranked list: the first stage's ``ids``/``first`` scores (best first,
    ``-1`` padding) with the re-ranker's scores ``mvcl`` of its top-``k`` valid entries.
    Returns ``(ids, scores)`` of the same length: the top-``k`` by
    ``alpha * z(mvcl) + (1 - alpha) * z(first)`` or, with ``alpha`` None (no fusion: the
    re-ranked list alone), by the re-ranker's own scores (ties: the first stage's order),
    then the rest in the first stage's order, scored below."""
    ids = np.asarray(ids, dtype=np.int64)
    valid = np.flatnonzero(ids >= 0)
    head, tail = valid[:k], valid[k:]
    if head.size == 0:
        return ids.copy(), np.zeros(ids.shape, dtype=np.float32)
    if alpha is None:
        fused = np.asarray(mvcl[: head.size], dtype=np.float64)  # (h,): the network's scores
    else:
        fused = alpha * zscore(mvcl[: head.size]) + (1.0 - alpha) * zscore(first[head])  # (h,)
    order = np.lexsort((np.arange(head.size), -fused))  # by score desc, then first-stage rank
    out_ids = np.full(ids.shape, -1, dtype=np.int64)
    out_scores = np.zeros(ids.shape, dtype=np.float32)
    out_ids[: head.size] = ids[head[order]]
    out_scores[: head.size] = fused[order]
    if tail.size:
        floor = float(fused.min()) - 1.0
        t = np.asarray(first[tail], dtype=np.float64)
        out_ids[head.size : head.size + tail.size] = ids[tail]
        out_scores[head.size : head.size + tail.size] = floor - (t[0] - t)  # keeps the tail's order, below the head
    return out_ids, out_scores
