"""Case-view contrastive loss of MVCL.

Wang, Zhang, Chen, Liu, Wang & Wen, "Legal Element-oriented Modeling with Multi-view
Contrastive Learning for Legal Case Retrieval", IJCNN 2022 (arXiv:2210.05188), Section
III-C: the query A, its relevant candidate B+ and the irrelevant C- are each pooled into
one vector by attention pooling over the PLM's tokens; the loss pulls A towards B+ and
away from C- with cosine similarities divided by the temperature T1:

    L_case = -(1/N) * sum_i log( exp(cos(a_i, b_i) / T1)
                                 / (exp(cos(a_i, b_i) / T1) + exp(cos(a_i, c_i) / T1)) )

Here each triple's own C- is its negative (the paper's triple form).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CaseViewLoss(nn.Module):
    """Two-way softmax over ``[cos(a, b+), cos(a, c-)] / T1`` with B+ as the target."""

    def __init__(self, temperature: float = 0.1) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = float(temperature)

    def forward(self, anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        if not anchor.shape == positive.shape == negative.shape or anchor.dim() != 2:
            raise ValueError("anchor, positive and negative must be (batch, dim) of one shape")
        pos = F.cosine_similarity(anchor.float(), positive.float(), dim=-1)  # (batch,)
        neg = F.cosine_similarity(anchor.float(), negative.float(), dim=-1)  # (batch,)
        logits = torch.stack([pos, neg], dim=1) / self.temperature  # (batch, 2)
        target = torch.zeros(anchor.shape[0], dtype=torch.long, device=anchor.device)  # (batch,)
        return F.cross_entropy(logits, target)
