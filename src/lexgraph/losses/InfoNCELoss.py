"""Contrastive InfoNCE loss of the dense statute retriever.

The dense statute retriever (DSR) of Louis & Spanakis, "A Statutory Article Retrieval
Dataset in French" (ACL 2022), and of its graph-augmented successor G-DSR in Louis,
van Dijck & Spanakis, "Finding the Law: Enhancing Statutory Article Retrieval via Graph
Neural Networks" (EACL 2023, Section 3.2), is trained with the InfoNCE objective of
van den Oord et al. (2018): the negative log-likelihood of the gold article under a
softmax over temperature-scaled cosine similarities, with the other articles of the
batch (in-batch negatives) and BM25 hard negatives as the alternatives.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SIMILARITIES = ("cosine", "dot")


def scores(queries: torch.Tensor, articles: torch.Tensor, cosine: bool = True) -> torch.Tensor:
    """``(nq, na)`` float32 similarities: cosine, or the plain dot product (QABISAR's scoring)."""
    q, a = queries.float(), articles.float()  # (nq, dim), (na, dim)
    if cosine:
        q, a = F.normalize(q, dim=-1), F.normalize(a, dim=-1)
    return q @ a.T  # (nq, na)


class InfoNCELoss(nn.Module):
    """InfoNCE with in-batch and hard negatives, scored by cosine (or dot product) / temperature.

    For a batch of ``B`` (query, positive article) pairs and ``N`` extra hard negatives,
    the score matrix is ``S = cos(q_i, a_j) / tau`` of shape ``(B, B + N)`` whose columns
    are the ``B`` positives followed by the ``N`` negatives; query ``i``'s positive is
    column ``i`` (the diagonal) and the loss is

        L = -(1/B) * sum_i log( exp(S[i, i]) / sum_{j not masked for i} exp(S[i, j]) ).

    **Shared positives.** When several pairs of a batch share a gold article (two
    questions citing the same article, or one question paired with two of its gold
    articles), column ``j != i`` may hold an article that is *also* relevant to query
    ``i``. Treating it as a negative would push a correct article away, so such columns
    are removed from query ``i``'s denominator (their logit is set to ``-inf``). Pass the
    mask as ``other_positives`` (``True`` = drop from row ``i``); build it with
    :meth:`shared_positive_mask` from each query's gold set and the column article ids.
    The diagonal is never masked.
    """

    def __init__(self, temperature: float = 0.01, similarity: str = "cosine") -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        if similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
        self.temperature = float(temperature)
        self.cosine = similarity == "cosine"

    def similarity(self, queries: torch.Tensor, articles: torch.Tensor) -> torch.Tensor:
        """Cosine (or, with ``similarity="dot"``, dot-product) similarity divided by the
        temperature, ``(nq, na)``, in float32."""
        return scores(queries, articles, self.cosine) / self.temperature  # (nq, na)

    def forward(
        self,
        queries: torch.Tensor,
        positives: torch.Tensor,
        negatives: torch.Tensor | None = None,
        other_positives: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Mean InfoNCE loss over the batch.

        Args:
            queries: ``(B, dim)`` query embeddings.
            positives: ``(B, dim)`` embeddings of each query's gold article.
            negatives: optional ``(N, dim)`` hard-negative article embeddings, shared by
                every query of the batch as extra columns.
            other_positives: optional bool ``(B, B + N)``; ``True`` where column ``j`` is
                relevant to query ``i`` but is not its own positive (dropped from the
                denominator). Its diagonal is ignored.
        """
        if queries.shape != positives.shape:
            raise ValueError(f"queries {tuple(queries.shape)} and positives {tuple(positives.shape)} differ")
        batch = queries.size(0)
        articles = positives if negatives is None else torch.cat([positives, negatives], dim=0)  # (B + N, dim)
        logits = self.similarity(queries, articles)  # (B, B + N)
        if other_positives is not None:
            if other_positives.shape != logits.shape:
                raise ValueError(
                    f"other_positives has shape {tuple(other_positives.shape)}, expected {tuple(logits.shape)}"
                )
            mask = other_positives.to(device=logits.device, dtype=torch.bool).clone()  # (B, B + N)
            diagonal = torch.arange(batch, device=logits.device)  # (B,): no host index, no copy
            mask[diagonal, diagonal] = False
            logits = logits.masked_fill(mask, float("-inf"))  # (B, B + N)
        targets = torch.arange(batch, device=logits.device)  # (B,)
        return F.cross_entropy(logits, targets)

    @staticmethod
    def shared_positive_mask(
        gold: Sequence[Collection[int]], column_ids: Sequence[int], device: torch.device | str | None = None
    ) -> torch.Tensor:
        """Bool ``(B, len(column_ids))``: ``mask[i, j] = column_ids[j] in gold[i] and j != i``.

        ``gold[i]`` is the set of article ids relevant to query ``i``; ``column_ids`` the
        article id of every column of the score matrix (positives then negatives).
        """
        rows = np.zeros((len(gold), len(column_ids)), dtype=bool)  # (B, B + N): numpy, no operator dispatched
        for i, relevant in enumerate(gold):
            relevant = set(relevant)
            for j, article_id in enumerate(column_ids):
                if j != i and int(article_id) in relevant:
                    rows[i, j] = True
        mask = torch.from_numpy(rows)  # (B, B + N)
        return mask.to(device) if device is not None else mask
