"""Element-view contrastive loss of MVCL.

Wang, Zhang, Chen, Liu, Wang & Wen, "Legal Element-oriented Modeling with Multi-view
Contrastive Learning for Legal Case Retrieval", IJCNN 2022 (arXiv:2210.05188), Section
III-D: a legal element indicator marks the sentences of a text T that hold a legal
element; the positive view T+ replaces the tokens of the other sentences by ``[DEL]``
(``lexgraph.elements.element_view``). T and T+ are pooled into vectors (attention
pooling); T+ is the positive of T and the views of the other texts of the batch are its
negatives, with cosine similarity and temperature T2 (an InfoNCE over the batch):

    L_ele = -(1/N) * sum_i log( exp(cos(t_i, t+_i) / T2) / sum_j exp(cos(t_i, t+_j) / T2) )

The batch must hold distinct texts (a repeated text would be its own negative).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ElementViewLoss(nn.Module):
    """InfoNCE of each text against its element view, the batch's other views as negatives."""

    def __init__(self, temperature: float = 0.1) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = float(temperature)

    def forward(self, texts: torch.Tensor, views: torch.Tensor) -> torch.Tensor:
        if texts.shape != views.shape or texts.dim() != 2:
            raise ValueError(f"texts and views must be (batch, dim) of one shape, got {tuple(texts.shape)} and {tuple(views.shape)}")
        t = F.normalize(texts.float(), dim=-1)  # (batch, dim)
        v = F.normalize(views.float(), dim=-1)  # (batch, dim)
        logits = t @ v.T / self.temperature  # (batch, batch): row i, column j = cos(t_i, t+_j) / T2
        target = torch.arange(t.shape[0], device=t.device)  # (batch,): the diagonal
        return F.cross_entropy(logits, target)
