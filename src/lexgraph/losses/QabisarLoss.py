"""QABISAR's joint objective: graph contrastive loss plus query-encoder distillation.

Santosh, Sarwat & Grabmair, "QABISAR: Query-Article Bipartite Interactions for Statutory
Article Retrieval" (COLING 2025). §2.2: "To learn GAT parameters, we adopt the same
contrastive learning used to train bi-encoder", i.e. §2.1's loss over f / τ (f the dot
product, τ "a scalar temperature"), with the graph's query and article representations;
then "the sum of contrastive loss using graph representations and the knowledge
distillation loss", weighted "0.7 and 0.3" (App. A):

    L    = (1 - w) * InfoNCE(q^g, p^g; f / τ) + w * L_KD,     w = 0.3
    L_KD = Σ_{q, p} s(q^g, p^g) · log( s(q^g, p^g) / s(q^b, p^g) ),
    s(q, p) = e^{f(q, p)} / Σ_{p' ∈ P} e^{f(q, p')}

``InfoNCE`` is :class:`~lexgraph.losses.InfoNCELoss` over in-batch and BM25 negatives (a
query's other gold articles left out of its denominator: §2.1's sum runs over
``{p} ∪ P'_q``, the irrelevant articles); ``L_KD`` is
:class:`~lexgraph.losses.DistillationLoss` in score mode over the batch's candidate
articles P (every column, none masked), with no temperature: the softmax of f itself
(``kd.temperature: 1``). ``w`` is ``gnn.<variant>.kd.weight``; ``w = 0`` is the "no
distillation" ablation. How the text is read where it leaves room:

* **τ is the bi-encoder's**: "the same contrastive learning used to train bi-encoder" —
  the profile sets ``gnn.qabisar.temperature`` to the first stage's ``dsr.temperature``
  (a test keeps them equal). The paper states no value.
* **Sums become batch means**: the paper's sums over queries are averaged over the batch,
  for both terms, so that the 0.7 / 0.3 split does not depend on the batch size.
* **The teacher's scores are detached** (its query and the candidates on its side): the
  KL moves the student (the query encoder) and, through the student's scores, the
  candidate articles; the graph's query representation is shaped by the contrastive term
  alone. The paper does not say.

With ``student_contrastive`` (``kd.student_contrastive``, lexgraph's, not in the paper) the
contrastive term is the mean of the teacher's and the student's InfoNCE against the same
graph articles.
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
        kd = self.distillation(graph_queries, encoder_queries, candidates)  # over every candidate P (§2.2)
        parts["kd"] = float(kd.detach())
        if self.student_contrastive:  # the student, scored at test time, also against the graph's articles
            student = self.contrastive(encoder_queries, positives, negatives, other_positives)
            parts["contrastive_student"] = float(student.detach())
            contrastive = (contrastive + student) / 2
        return (1.0 - self.kd_weight) * contrastive + self.kd_weight * kd, parts
