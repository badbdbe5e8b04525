"""Pairwise triple loss of MVCL's interaction network.

Zhaowei Wang (the one author), "Legal Element-oriented Modeling with Multi-view
Contrastive Learning for Legal Case Retrieval", IJCNN 2022 (arXiv:2210.05188), Section
III: for a triple (A, B, C) the interaction network gives the matching vectors
``H_{a,b}`` and ``H_{a,c}``; an MLP over their difference ``H_{a,b} - H_{a,c}`` decides
which candidate is the more relevant one (two classes: 0 = B, 1 = C), trained with
cross-entropy. The data are augmented by swapping B and C: ``H_{a,c} - H_{a,b}`` with
label 1. With the relevant candidate as B the loss is

    L = 1/2 * [ CE(MLP(H_ab - H_ac), 0) + CE(MLP(H_ac - H_ab), 1) ]   (mean over the batch)

and without the swap only the first term.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class PairwiseTripleLoss(nn.Module):
    """Cross-entropy of the 2-way classifier over ``H_{a,b} - H_{a,c}`` (B relevant),
    averaged with its swapped copy when ``swap`` is on."""

    def __init__(self, swap: bool = True) -> None:
        super().__init__()
        self.swap = bool(swap)

    def forward(
        self, h_ab: torch.Tensor, h_ac: torch.Tensor, classifier: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        if h_ab.shape != h_ac.shape or h_ab.dim() != 2:
            raise ValueError(
                f"h_ab and h_ac must be (batch, dim) of one shape, got {tuple(h_ab.shape)} and {tuple(h_ac.shape)}"
            )
        batch = h_ab.shape[0]
        logits = classifier(h_ab - h_ac).float()  # (batch, 2): class 0 = B is the more relevant
        first = torch.zeros(batch, dtype=torch.long, device=h_ab.device)  # (batch,)
        loss = F.cross_entropy(logits, first)
        if not self.swap:
            return loss
        swapped = classifier(h_ac - h_ab).float()  # (batch, 2): now class 1 = the relevant one (second)
        return 0.5 * (loss + F.cross_entropy(swapped, first + 1))
