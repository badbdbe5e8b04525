"""Element-view contrastive loss of MVCL.

Zhaowei Wang (the one author), "Legal Element-oriented Modeling with Multi-view
Contrastive Learning for Legal Case Retrieval", IJCNN 2022 (arXiv:2210.05188), Section
III-D: a legal element indicator marks the sentences of a text T that hold a legal
element; the positive view T+ deletes a random subset of the other sentences, totalling
at most L1 tokens, by replacing their tokens with ``[DEL]``
(``lexgraph.text.elements.element_view``). The N texts of a batch and their N views are pooled
into vectors (attention pooling); for the anchor t_i, its own view t+_i is the positive
and the **2N - 2** other texts and views of the batch, t_j and t+_j for every j != i, are
its negatives (t_i itself is left out), with cosine similarity and temperature T2:

    L_ele = -(1/N) * sum_i log( exp(cos(t_i, t+_i) / T2)
                                / ( exp(cos(t_i, t+_i) / T2)
                                    + sum_{j != i} [exp(cos(t_i, t+_j) / T2) + exp(cos(t_i, t_j) / T2)] ) )

The anchors are the N original texts. The batch must hold distinct texts (a repeated
text would be its own negative).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ElementViewLoss(nn.Module):
    """InfoNCE of each text against its element view, the batch's other texts and views as
    the 2N - 2 negatives."""

    def __init__(self, temperature: float = 0.1) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = float(temperature)

    def forward(self, texts: torch.Tensor, views: torch.Tensor) -> torch.Tensor:
        if texts.shape != views.shape or texts.dim() != 2:
            raise ValueError(
                f"texts and views must be (batch, dim) of one shape, got {tuple(texts.shape)} and {tuple(views.shape)}"
            )
        n = texts.shape[0]
        t = F.normalize(texts.float(), dim=-1)  # (N, dim)
        v = F.normalize(views.float(), dim=-1)  # (N, dim)
        logits = t @ torch.cat([v, t], 0).T / self.temperature  # (N, 2N): columns t+_1..t+_N, t_1..t_N
        target = torch.arange(n, device=t.device)  # (N,): t+_i is column i
        self_column = torch.zeros_like(logits, dtype=torch.bool)  # (N, 2N)
        self_column[target, target + n] = True  # cos(t_i, t_i) is no negative
        return F.cross_entropy(logits.masked_fill(self_column, float("-inf")), target)
