"""The re-rankers' interaction network (MVCL's ESIM form) over PLM token states.

Zhaowei Wang, "Legal Element-oriented Modeling with Multi-view Contrastive Learning for
Legal Case Retrieval", IJCNN 2022 (arXiv:2210.05188; one author), Section III-B:

1. the PLM's token states of query A, ``(La, d)``, and candidate B, ``(Lb, d)``, give the
   word-level bidirectional attention (eq. 2) ``e_ij = h_a_i . h_b_j / sqrt(d)`` (``alignment:
   scaled_dot``: on the PLM's states, ``d`` their width), softmax over B's tokens for each
   token of A and over A's for each token of B; the aligned vectors ``h~`` are the
   attention-weighted sums of the other side's states;
2. every token is strengthened (eq. 3) with ``m = [h; h~; h - h~; h * h~]``;
3. a bidirectional LSTM shared by both sides runs over the strengthened tokens; masked mean and
   max pooling of both sides give the matching vector ``H_{a,b}`` (eq. 4, 4 * hidden);
4. an MLP over ``H_{a,b} - H_{a,c}`` (a hidden layer, Tanh) says which of B and C is the more
   relevant (eq. 5, :class:`lexgraph.losses.PairwiseTripleLoss`).

``projection`` says which states ``h`` steps 1-3 strengthen. ``projection=False`` is the
paper's form: the PLM's states themselves, so that ``m`` is ``4 * d`` wide and the BiLSTM reads
it directly (its width per direction, ``hidden / 2``, is not stated in the paper: lexgraph's
choice, as ``hidden``). ``projection=True`` (xrerank) is lexgraph's departure: every state
is first mapped by a linear layer to ``hidden`` (``h = W x + b``), ``h~`` sums the projected
states, and ``m`` is ``4 * hidden`` wide, which keeps the BiLSTM small over a frozen PLM.
Dropout (``rerank.dropout``; not stated in the paper) applies to the states ``h`` that are
strengthened, in either form.

Re-ranking a list needs a score per candidate. The paper says pairwise preferences can be
converted to a ranking by "many methods" it does not discuss (§III-A: "see examples in
Appendix B"). Both rules here (``ranking``, :data:`RANKINGS`) play a round robin among the
top-k (every candidate against every other one of the list with that MLP, on the cheap
matching vectors: the game ``(b, c)`` is the classifier on ``H_{a,b} - H_{a,c}``) and score
candidate b from its games as B (:meth:`InteractionModel.tournament_scores`):

* ``probability`` (MVCL's Appendix B, the third of its three methods: "We could sum the
  probabilities of a candidate in all pairs and rank candidates according to their summations
  of probabilities"): the sum over every other candidate c of the classifier's softmax
  probability that b is the more relevant in the game ``(b, c)`` (class 0);
* ``margin`` (lexgraph's rule, xrerank's; not in the paper): the mean margin ``logit_0 - logit_1``
  of those games. A margin is unbounded where a probability saturates, so one lopsided game can
  outweigh the others: the two rules can order a list differently.

Appendix B's other methods are not implemented: the exhaustive search of every ranked list for
"the largest proportion of correct pairwise preferences" (factorial in k = 100) and the count of
"how many times a candidate is preferred" (ties in a list of 100).

The attention pooling of the case and element views (``pooling``) is either MVCL's eq. 6
(:class:`Eq6Pooling`: its own ``W``, ``b`` and ``u_w`` on the PLM's states, the pooled vector
a sum of the activated ``u``) or xrerank's (:class:`AttentionPooling`: tanh scores over the
interaction's projection, pooling the projected states, so that with the PLM frozen the
contrastive views train what the interaction reads).

``mvcl`` fine-tunes the PLM, whose states then come from the training step
(:mod:`lexgraph.methods.rerank.plm`); ``xrerank`` (lexgraph's recipe) keeps it frozen with
cached states (:mod:`lexgraph.methods.rerank.features`), aligns by cosine / temperature and
starts from MaxSim (``match_features``, ``warm_start``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class TokenBatches(Protocol):
    """Token states by id (``lexgraph.methods.rerank.features.TokenStore``)."""

    def batch(self, keys: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]: ...


#: Where the word-level attention ``e`` is computed (``rerank.<variant>.alignment``):
#: ``scaled_dot`` = ``h_a . h_b / sqrt(d)`` on the PLM's states (MVCL §III-B), ``cosine`` =
#: their cosine / ``align_temperature`` (xrerank), ``projected`` = the scaled dot product of
#: the learned projections (``projection`` only).
ALIGNMENTS = ("scaled_dot", "cosine", "projected")
#: The views' attention pooling (``rerank.<variant>.pooling``): ``eq6`` = MVCL's eq. 6
#: (:class:`Eq6Pooling`), ``tanh`` = xrerank's over the interaction's projection (:class:`AttentionPooling`).
POOLINGS = ("eq6", "tanh")
#: How a list's games become one score per candidate (``rerank.<variant>.ranking``): ``probability`` =
#: MVCL App. B's sum of a candidate's probabilities in all pairs, ``margin`` = lexgraph's mean logit margin.
RANKINGS = ("probability", "margin")

_NEG = -1e4


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax of ``scores`` over ``dim`` where ``mask`` is True (fully masked rows give 0)."""
    scores = scores.masked_fill(~mask, _NEG)
    return torch.softmax(scores, dim=dim) * mask


class Eq6Pooling(nn.Module):
    """MVCL's attention pooling (§III-D, eq. 6, after Yang et al.'s HAN):
    ``u_i = ReLU(W h_i + b)``, ``alpha_i = softmax_i(u_i^T u_w)``, ``h_bar = sum_i alpha_i u_i``
    over the unmasked tokens, with its own ``W``, ``b`` (``transform``, ``input_dim -> hidden``)
    and the learnable context vector ``u_w`` (``context``, ``(hidden,)``) on the PLM's states."""

    def __init__(self, input_dim: int, hidden: int) -> None:
        super().__init__()
        self.transform = nn.Linear(input_dim, hidden)  # W, b
        self.context = nn.Parameter(torch.empty(hidden))  # u_w
        bound = 1.0 / math.sqrt(hidden)
        nn.init.uniform_(self.context, -bound, bound)  # as nn.Linear(hidden, 1) would start

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        u = torch.relu(self.transform(states))  # (batch, len, hidden)
        alpha = masked_softmax(u @ self.context, mask, dim=1)  # (batch, len)
        return torch.einsum("bl,bld->bd", alpha, u)  # (batch, hidden)


class AttentionPooling(nn.Module):
    """xrerank's pooling: ``v = sum_t alpha_t W h_t``, ``alpha = softmax_t(w^T tanh(W h_t))``
    over unmasked tokens; ``W`` is the projection it is given (the interaction network's own,
    shared), and what it pools is the projection before the activation."""

    def __init__(self, proj: nn.Linear, hidden: int) -> None:
        super().__init__()
        self.score = nn.Linear(hidden, 1, bias=False)
        self._proj = [proj]  # shared, not registered twice

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self._proj[0](states)  # (batch, len, hidden)
        alpha = masked_softmax(self.score(torch.tanh(h)).squeeze(-1), mask, dim=1)  # (batch, len)
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

    ``projection``: False, the paper's eq. 2-4 on the PLM's own states (``m`` is ``4 * input_dim``
    wide); True, every state projected to ``hidden`` first (xrerank). ``alignment`` says how the
    word-level attention ``e`` is computed: ``"scaled_dot"``, ``h_a . h_b / sqrt(d)`` on the PLM's
    own states of width ``d = input_dim`` (MVCL); ``"cosine"``, their cosine over ``temperature``
    (xrerank); ``"projected"``, the dot product of the projections ``h``, scaled by
    ``1 / sqrt(hidden)`` (``projection`` only). The aligned vectors are sums of the states ``h``
    that are strengthened (the projections, or the PLM's states). ``pooling``: ``"eq6"``
    (:class:`Eq6Pooling`) or ``"tanh"`` (:class:`AttentionPooling`, ``projection`` only).
    With ``features`` on, ``H_{a,b}`` ends with three alignment
    scores of the PLM's states (:data:`FEATURES`) and the classifier has a linear skip over
    them; ``warm_start`` then initialises that skip to ``1 / temperature`` on MaxSim and
    the MLP's last layer to zero, so that the untrained network ranks a list by the PLM's
    MaxSim (ColBERT's late interaction) and training starts from a ranking the frozen PLM
    already knows (under either ``ranking``: each game's margin and probability grow with
    b's MaxSim). ``ranking`` (:data:`RANKINGS`) turns a list's games into scores
    (:meth:`tournament_scores`)."""

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
        pooling: str = "tanh",
        projection: bool = True,
        ranking: str = "margin",
    ) -> None:
        super().__init__()
        if hidden % 2:
            raise ValueError(f"hidden must be even (a bidirectional LSTM of hidden / 2 per direction), got {hidden}")
        if alignment not in ALIGNMENTS:
            raise ValueError(f"alignment must be one of {ALIGNMENTS}, got {alignment!r}")
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if ranking not in RANKINGS:
            raise ValueError(f"ranking must be one of {RANKINGS}, got {ranking!r}")
        if not projection and (alignment == "projected" or pooling == "tanh"):
            raise ValueError(f"alignment {alignment!r} and pooling {pooling!r}: 'projected' and 'tanh' need projection")
        self.input_dim, self.hidden = int(input_dim), int(hidden)
        self.alignment, self.temperature, self.features = alignment, float(temperature), bool(features)
        self.ranking = ranking  # not a weight: how tournament_scores turns the games into scores
        # the states that are aligned and strengthened: the projections (hidden) or the PLM's own (input_dim)
        self.proj = nn.Linear(input_dim, hidden) if projection else None
        self.width = self.hidden if projection else self.input_dim
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(4 * self.width, hidden // 2, batch_first=True, bidirectional=True)
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
        # tanh: the views' pooling reads the tokens through the interaction's projection (with the PLM
        # frozen, that projection is where the case and element views can shape the ranking); eq6: its own W, b
        self.pool = AttentionPooling(self.proj, hidden) if pooling == "tanh" else Eq6Pooling(input_dim, hidden)

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

    def strengthen(
        self,
        q: torch.Tensor,
        q_mask: torch.Tensor,
        d: torch.Tensor,
        d_mask: torch.Tensor,
        cos: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The strengthened tokens ``m = [h; h~; h - h~; h * h~]`` (eq. 2-3) of both sides, what
        the BiLSTM reads: q ``(batch, Lq, input_dim)``, d ``(batch, Ld, input_dim)``, masks bool
        ``(batch, L)`` -> ``(batch, Lq, 4 * width)``, ``(batch, Ld, 4 * width)``; ``cos``: the
        PLM states' cosines ``(batch, Lq, Ld)`` when already computed (``alignment: cosine``)."""
        hq = self.dropout(self.proj(q) if self.proj is not None else q)  # (batch, Lq, width)
        hd = self.dropout(self.proj(d) if self.proj is not None else d)  # (batch, Ld, width)
        pair = q_mask.unsqueeze(2) & d_mask.unsqueeze(1)  # (batch, Lq, Ld)
        if self.alignment == "cosine":
            e = (self.cosines(q, d) if cos is None else cos) / self.temperature  # (batch, Lq, Ld)
        elif self.alignment == "scaled_dot":
            e = q @ d.transpose(1, 2) / math.sqrt(self.input_dim)  # (batch, Lq, Ld): h_a . h_b / sqrt(d)
        else:
            e = hq @ hd.transpose(1, 2) / math.sqrt(self.hidden)  # (batch, Lq, Ld): scaled dot product
        q_aligned = masked_softmax(e, pair, dim=2) @ hd  # (batch, Lq, width): h~_a
        d_aligned = masked_softmax(e, pair, dim=1).transpose(1, 2) @ hq  # (batch, Ld, width): h~_b
        mq = torch.cat([hq, q_aligned, hq - q_aligned, hq * q_aligned], dim=-1)  # (batch, Lq, 4 * width)
        md = torch.cat([hd, d_aligned, hd - d_aligned, hd * d_aligned], dim=-1)  # (batch, Ld, 4 * width)
        return mq, md

    @staticmethod
    def cosines(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """Cosines of the PLM's token states ``(batch, Lq, Ld)``."""
        qn = nn.functional.normalize(q, dim=-1)  # (batch, Lq, input_dim)
        dn = nn.functional.normalize(d, dim=-1)  # (batch, Ld, input_dim)
        return qn @ dn.transpose(1, 2)  # (batch, Lq, Ld)

    def match(self, q: torch.Tensor, q_mask: torch.Tensor, d: torch.Tensor, d_mask: torch.Tensor) -> torch.Tensor:
        """``H_{a,b}`` (eq. 4) for paired rows: q ``(batch, Lq, input_dim)``, d ``(batch, Ld, input_dim)``,
        masks bool ``(batch, L)`` -> ``(batch, match_dim)``."""
        cos = self.cosines(q, d) if self.alignment == "cosine" or self.features else None  # (batch, Lq, Ld)
        mq, md = self.strengthen(q, q_mask, d, d_mask, cos)
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

    def pair_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Every game among the ``n`` candidates of one query from their matching vectors
        ``(n, match_dim)``: ``[b, c]`` = the classifier's 2 logits over ``H_b - H_c`` (the game
        with B = b and C = c; class 0: b is the more relevant) -> ``(n, n, 2)``."""
        diff = h.unsqueeze(1) - h.unsqueeze(0)  # (n, n, match_dim): [b, c] = H_b - H_c
        return self.classifier(diff)  # (n, n, 2)

    def pair_margins(self, h: torch.Tensor) -> torch.Tensor:
        """Every game's margin ``logit_0 - logit_1`` (:func:`game_margins` of :meth:`pair_logits`):
        ``[b, c]`` positive when b is preferred to c, 0 on the diagonal -> ``(n, n)``."""
        return game_margins(self.pair_logits(h))

    def tournament_scores(self, h: torch.Tensor) -> torch.Tensor:
        """Scores ``(n,)`` of the ``n`` candidates of one query from their matching vectors
        ``(n, match_dim)``: the round robin of :meth:`pair_logits` scored by this network's
        ``ranking`` (:func:`ranking_scores`): ``probability``, MVCL App. B's sum of b's probabilities
        in all its pairs; ``margin``, b's mean margin (lexgraph's)."""
        n = h.shape[0]
        if n < 2:
            return torch.zeros(n, device=h.device)
        return ranking_scores(self.pair_logits(h), self.ranking)  # (n,)


def game_margins(logits: torch.Tensor) -> torch.Tensor:
    """The margins ``logit_0 - logit_1`` ``(n, n)`` of a round robin's logits ``(n, n, 2)`` (``[b, c]``:
    the game B = b, C = c; positive: b preferred), 0 on the diagonal (no game against itself)."""
    n = logits.shape[0]
    margin = logits[..., 0] - logits[..., 1]  # (n, n)
    return margin * (1 - torch.eye(n, device=logits.device, dtype=margin.dtype))  # no game against itself


def game_probabilities(logits: torch.Tensor) -> torch.Tensor:
    """The classifier's softmax probability ``(n, n)`` that B is the more relevant (class 0) in
    every game of a round robin's logits ``(n, n, 2)``: ``[b, c]`` = P(b preferred to c | game
    B = b, C = c); 0 on the diagonal (no game against itself, no probability counted)."""
    n = logits.shape[0]
    p = torch.softmax(logits, dim=-1)[..., 0]  # (n, n)
    return p.masked_fill(torch.eye(n, dtype=torch.bool, device=logits.device), 0.0)  # (n, n)


def ranking_scores(logits: torch.Tensor, ranking: str) -> torch.Tensor:
    """One score per candidate ``(n,)`` from the games ``(n, n, 2)`` of ``n >= 2`` candidates
    (``[b, c]``: the classifier's logits with B = b, C = c; class 0: B is the more relevant).

    ``probability``: MVCL's Appendix B, "Methods to convert pair-wise preferences", the third
    of the three it lists: "We could sum the probabilities of a candidate in all pairs and rank
    candidates according to their summations of probabilities." Candidate b's probability in
    its pair with c is the classifier's softmax probability that b is the more relevant in the
    game where b is B (:func:`game_probabilities`); b's score is the sum over every other c,
    ``sum_{c != b} softmax(MLP(H_{a,b} - H_{a,c}))_0`` (its game as C, ``(c, b)``, is c's
    probability, counted in c's sum). ``margin``: lexgraph's rule (xrerank), not in the paper:
    b's mean margin ``logit_0 - logit_1`` over the same games."""
    if ranking == "probability":
        return game_probabilities(logits).sum(1)  # (n,): sum_{c != b} P(b preferred in (b, c))
    if ranking == "margin":
        return game_margins(logits).sum(1) / (logits.shape[0] - 1)  # (n,): mean margin
    raise ValueError(f"ranking must be one of {RANKINGS}, got {ranking!r}")


# ---------------------------------------------------------------------------
# Scoring and fusing a first-stage list (building, saving and loading: lexgraph.methods.rerank.io)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Tournament:
    """A trained re-ranker playing one question's candidates against each other: ``model``'s
    round robin over the token states of ``articles`` (by id) on ``device``, its matching vectors
    computed ``batch_size`` candidates at a time."""

    model: InteractionModel
    articles: TokenBatches
    device: torch.device
    batch_size: int = 128

    @torch.no_grad()
    def match(self, q_states: torch.Tensor, candidates: Sequence[int]) -> torch.Tensor:
        """The matching vectors ``H_{a,b}`` ``(n, match_dim)`` of one question ``(Lq, dim)`` with each
        of its ``n >= 1`` ``candidates``."""
        device, size = self.device, self.batch_size
        q = q_states.float().to(device).unsqueeze(0)  # (1, Lq, dim)
        h = []
        for start in range(0, len(candidates), size):
            keys = list(candidates[start : start + size])
            d, d_mask = self.articles.batch(keys, device)  # (b, Ld, dim), (b, Ld)
            qb = q.expand(len(keys), -1, -1)  # (b, Lq, dim)
            q_mask = torch.ones(qb.shape[:2], dtype=torch.bool, device=device)  # (b, Lq)
            h.append(self.model.match(qb, q_mask, d, d_mask).float())
        return torch.cat(h, 0)  # (n, match_dim)

    @torch.no_grad()
    def scores(self, q_states: torch.Tensor, candidates: Sequence[int]) -> np.ndarray:
        """The re-ranker's scores ``(n,)`` of ``candidates`` for one question ``(Lq, dim)``: the round
        robin scored by the network's ``ranking`` (:meth:`InteractionModel.tournament_scores`)."""
        self.model.eval()
        if len(candidates) == 0:
            return np.zeros(0, dtype=np.float32)
        h = self.match(q_states, candidates)  # (n, match_dim)
        return self.model.tournament_scores(h).cpu().numpy().astype(np.float32)

    @torch.no_grad()
    def games(self, q_states: torch.Tensor, candidates: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`scores` ``(n,)`` and the margins of the games they come from,
        :meth:`InteractionModel.pair_margins` ``(n, n)``, from one pass over the ``candidates`` (the
        pairwise accuracy reads the games)."""
        model = self.model
        model.eval()
        if len(candidates) == 0:
            return np.zeros(0, dtype=np.float32), np.zeros((0, 0), dtype=np.float32)
        h = self.match(q_states, candidates)  # (n, match_dim)
        n = h.shape[0]
        logits = model.pair_logits(h)  # (n, n, 2)
        margins = game_margins(logits)  # (n, n)
        # (n,): tournament_scores from the same games
        scores = ranking_scores(logits, model.ranking) if n >= 2 else torch.zeros(n, device=h.device)
        return scores.cpu().numpy().astype(np.float32), margins.cpu().numpy()


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
