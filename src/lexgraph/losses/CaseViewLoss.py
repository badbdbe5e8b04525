"""Case-view contrastive loss of MVCL.

Zhaowei Wang (the one author), "Legal Element-oriented Modeling with Multi-view
Contrastive Learning for Legal Case Retrieval", IJCNN 2022 (arXiv:2210.05188), Section
III-C: the query A, its relevant candidate B+ and the irrelevant C- of each of the N
triples of a batch are pooled into one vector each (attention pooling over the PLM's
tokens); the loss pulls a_i towards its b_i and away from **in-batch negatives**, with
cosine similarities divided by the temperature T1. The candidates of anchor a_i are the
batch's 2N cases ``x = [b_1 .. b_N, c_1 .. c_N]``: its positive b_i, and 2N - 1 negatives,
its own c_i and the b_j and c_j of the N - 1 other triples:

    L_case = -(1/N) * sum_i log( exp(cos(a_i, b_i) / T1)
                                 / sum_{k in {i} + neg(i)} exp(cos(a_i, x_k) / T1) )

``neg(i)`` is every k != i but those that ``exclude`` marks: a case of another triple that
is relevant to a_i as well (another gold article of the same question, or b_i's article
again) is not a negative of a_i, and the caller masks it out (false negatives; with
distinct questions and articles nothing is masked and a_i has 2N - 1 negatives).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CaseViewLoss(nn.Module):
    """InfoNCE of each query over the batch's 2N cases, its own B+ as the target."""

    def __init__(self, temperature: float = 0.1) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = float(temperature)

    def forward(
        self, anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, exclude: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``anchor``, ``positive``, ``negative``: ``(N, dim)`` (triple i: a_i, b_i, c_i);
        ``exclude``: optional bool ``(N, 2N)``, True where column k of ``[b; c]`` is not a
        negative of row i (its own column i is never excluded)."""
        if not anchor.shape == positive.shape == negative.shape or anchor.dim() != 2:
            raise ValueError("anchor, positive and negative must be (batch, dim) of one shape")
        n = anchor.shape[0]
        a = F.normalize(anchor.float(), dim=-1)  # (N, dim)
        cases = F.normalize(torch.cat([positive, negative], 0).float(), dim=-1)  # (2N, dim): b_1..b_N, c_1..c_N
        logits = a @ cases.T / self.temperature  # (N, 2N): row i, column k = cos(a_i, x_k) / T1
        target = torch.arange(n, device=anchor.device)  # (N,): b_i is column i
        if exclude is not None:
            if exclude.shape != logits.shape:
                raise ValueError(f"exclude must be (N, 2N) = {tuple(logits.shape)}, got {tuple(exclude.shape)}")
            exclude = exclude.to(logits.device).clone()
            exclude[target, target] = False  # the positive always stays
            logits = logits.masked_fill(exclude, float("-inf"))
        return F.cross_entropy(logits, target)
