"""QABISAR's joint objective: graph contrastive loss plus query-encoder distillation.

Santosh, Sarwat & Grabmair, "QABISAR: Query-Article Bipartite Interactions for
Statutory Article Retrieval" (COLING 2025) train the graph network and the query
bi-encoder together with

    L = (1 - w) * InfoNCE(q^graph, a^graph) + w * KD(q^graph -> q^enc),

``InfoNCE`` over in-batch and BM25 negatives with f / tau
(:class:`~lexgraph.losses.InfoNCELoss`) and ``KD`` the distillation term of
:class:`~lexgraph.losses.DistillationLoss` over the same candidate articles; ``w`` is
``gnn.<variant>.kd.weight``. As published (``gnn.qabisar``): f is the dot product (section
2.1), tau = 1, ``KD = KL(softmax f(q^graph, A) || softmax f(q^enc, A))`` at temperature 1
(section 2.2) and w = 0.3, i.e. 0.7 contrastive + 0.3 KL. lexgraph's ``hgraph_qa`` uses
cosine / 0.01 and a KD temperature of 0.05. ``w = 0`` is the "no distillation" ablation.

**The teacher's scores are detached** (both its query and the candidates on its side):
the KL term moves only the student (the query encoder, and the candidates through the
student's scores). The paper does not say (unsure); lexgraph detaches because the teacher
is what is distilled: without the detach the KL would also pull the graph's query
representation towards the weaker text-only encoder, which is the wrong direction for a
teacher; the graph side is trained by the contrastive term alone.

With ``student_contrastive`` (``kd.student_contrastive``, not in the paper) the contrastive
term is the mean of the teacher's and the student's InfoNCE against the same graph articles.
"""

from __future__ import annotations

import torch
from torch import nn

from lexgraph.losses.DistillationLoss import DistillationLoss
from lexgraph.losses.InfoNCELoss import InfoNCELoss


class QabisarLoss(nn.Module):
    """``(1 - kd_weight) * contrastive + kd_weight * distillation``."""

    def __init__(
        self,
        temperature: float = 0.01,
        kd_weight: float = 0.3,
        kd_mode: str = "score",
        kd_temperature: float | None = None,
        similarity: str = "cosine",
        student_contrastive: bool = False,
    ) -> None:
        super().__init__()
        if not 0.0 <= kd_weight <= 1.0:
            raise ValueError(f"kd_weight must be in [0, 1], got {kd_weight}")
        self.kd_weight = float(kd_weight)
        self.student_contrastive = bool(student_contrastive)
        self.contrastive = InfoNCELoss(temperature, similarity)
        self.distillation = DistillationLoss(kd_mode, kd_temperature or temperature, similarity)

    def forward(
        self,
        graph_queries: torch.Tensor,
        encoder_queries: torch.Tensor | None,
        positives: torch.Tensor,
        negatives: torch.Tensor | None = None,
        other_positives: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Joint loss and its parts.

        Args:
            graph_queries: ``(B, dim)`` query-node outputs of the graph encoder.
            encoder_queries: ``(B, dim)`` query-encoder outputs (may be None when
                ``kd_weight == 0``).
            positives: ``(B, dim)`` graph embeddings of each pair's gold article.
            negatives: optional ``(N, dim)`` graph embeddings of the BM25 negatives.
            other_positives: optional bool ``(B, B + N)``, other gold articles of query
                ``i`` among the columns (left out of both distributions).
        Returns:
            ``(loss, {"contrastive": ..., "kd": ...})``.
        """
        contrastive = self.contrastive(graph_queries, positives, negatives, other_positives)
        parts = {"contrastive": float(contrastive.detach())}
        if self.kd_weight == 0.0:
            parts["kd"] = 0.0
            return contrastive, parts
        if encoder_queries is None:
            raise ValueError("kd_weight > 0 needs the query-encoder embeddings")
        candidates = positives if negatives is None else torch.cat([positives, negatives], dim=0)  # (B + N, dim)
        mask = None
        if other_positives is not None:
            mask = other_positives.to(device=candidates.device, dtype=torch.bool).clone()  # (B, B + N)
            batch = mask.size(0)
            mask[torch.arange(batch), torch.arange(batch)] = False
        kd = self.distillation(graph_queries, encoder_queries, candidates, mask)
        parts["kd"] = float(kd.detach())
        if self.student_contrastive:  # the student, scored at test time, also against the graph's articles
            student = self.contrastive(encoder_queries, positives, negatives, other_positives)
            parts["contrastive_student"] = float(student.detach())
            contrastive = (contrastive + student) / 2
        return (1.0 - self.kd_weight) * contrastive + self.kd_weight * kd, parts
