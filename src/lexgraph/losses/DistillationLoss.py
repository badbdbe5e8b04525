"""Knowledge distillation from the graph's query nodes into the query encoder (QABISAR).

QABISAR (Santosh, Sarwat & Grabmair, "QABISAR: Query-Article Bipartite Interactions for
Statutory Article Retrieval", COLING 2025) trains a graph network over a query-article
bipartite graph; unseen test questions have no node in that graph, so the enriched
query representations are distilled into the query bi-encoder, which alone encodes
questions at test time. Two forms are supported:

* ``score`` (default): match the relevance distributions over a candidate set,

      L = (1/B) sum_i KL( softmax(s(q_i^graph, A) / tau) || softmax(s(q_i^enc, A) / tau) )
        = (1/B) sum_i sum_j p_ij (log p_ij - log r_ij),

  with ``s`` the cosine similarity (or the dot product, QABISAR's scoring), ``tau`` the
  distillation's own temperature (``gnn.<variant>.kd.temperature``: softer targets than the
  contrastive 0.01, whose distributions are near one-hot), ``A`` the candidate articles (graph embeddings:
  in-batch positives + BM25 negatives), ``p`` the teacher (graph query) and ``r`` the
  student (encoder query) distribution.
* ``feature``: mean squared error between the embeddings,
  ``L = (1/(B*d)) sum_i ||q_i^enc - q_i^graph||^2``.

**The teacher is detached**: the teacher distribution (graph query *and* the candidates
on the teacher side) is a fixed target, so the distillation term only moves the student
(the query encoder) and, through the student's scores, the candidate article
embeddings; the graph query representation is shaped by the contrastive term alone.
Without the detach, the KD term could pull the graph towards the weaker encoder query.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lexgraph.losses.InfoNCELoss import SIMILARITIES, scores

MODES = ("score", "feature")


class DistillationLoss(nn.Module):
    """KL (score mode) or MSE (feature mode) from graph-query teacher to encoder-query student."""

    def __init__(self, mode: str = "score", temperature: float = 0.01, similarity: str = "cosine") -> None:
        super().__init__()
        if similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
        self.cosine = similarity == "cosine"
        if mode not in MODES:
            raise ValueError(f"distillation mode must be one of {MODES}, got {mode!r}")
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.mode = mode
        self.temperature = float(temperature)

    def forward(
        self,
        teacher_queries: torch.Tensor,
        student_queries: torch.Tensor,
        candidates: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Mean distillation loss over the batch.

        Args:
            teacher_queries: ``(B, dim)`` graph query embeddings (detached here).
            student_queries: ``(B, dim)`` query-encoder embeddings.
            candidates: ``(C, dim)`` candidate article embeddings (score mode only).
            mask: optional bool ``(B, C)``; ``True`` removes candidate ``j`` from query
                ``i``'s distributions (e.g. another gold article of ``i``). Each row must
                keep at least one candidate.
        """
        teacher = teacher_queries.detach().float()  # (B, dim)
        student = student_queries.float()  # (B, dim)
        if teacher.shape != student.shape:
            raise ValueError(f"teacher {tuple(teacher.shape)} and student {tuple(student.shape)} differ")
        if self.mode == "feature":
            return F.mse_loss(student, teacher)
        if candidates is None:
            raise ValueError("score-mode distillation needs the candidate article embeddings")
        t_logits = scores(teacher, candidates.detach(), self.cosine) / self.temperature  # (B, C)
        s_logits = scores(student, candidates, self.cosine) / self.temperature  # (B, C)
        if mask is not None:
            t_logits = t_logits.masked_fill(mask, float("-inf"))  # (B, C)
            s_logits = s_logits.masked_fill(mask, float("-inf"))  # (B, C)
        t_log = F.log_softmax(t_logits, dim=-1)  # (B, C)
        s_log = F.log_softmax(s_logits, dim=-1)  # (B, C)
        diff = t_log - s_log  # (B, C)
        if mask is not None:
            diff = diff.masked_fill(mask, 0.0)  # -inf - -inf is nan; p = 0 there anyway
        return (t_log.exp() * diff).sum(dim=-1).mean()
