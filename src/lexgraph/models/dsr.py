"""The dense statute retriever (:class:`DSR`): a query encoder and a hierarchical article
encoder trained with :class:`~lexgraph.losses.InfoNCELoss` (G-DSR, Section 3), and its I/O."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lexgraph.core.errors import ConfigError
from lexgraph.core.inputs import finite_number, read_json_object
from lexgraph.core.io import atomic_path, write_json
from lexgraph.core.layout import restore_hint
from lexgraph.losses.InfoNCELoss import SIMILARITIES, InfoNCELoss
from lexgraph.models.article_encoder import HierarchicalArticleEncoder
from lexgraph.models.backbone import FORMAT_VERSION
from lexgraph.models.encoders import QueryEncoder

log = logging.getLogger(__name__)

DSR_CONFIG = "dsr.json"
#: what a switched-off DSR stage writes instead of a model (``dsr_qabisar.enabled: false``), and the
#: ``embed`` stage on such a placeholder instead of vectors
DISABLED_FILE = "disabled.json"


# ---------------------------------------------------------------------------
# The dense statute retriever
# ---------------------------------------------------------------------------


class DSR(nn.Module):
    """Dense statute retriever: a query encoder and a hierarchical article encoder.

    ``similarity(q, a)`` is cosine (G-DSR) or the dot product (QABISAR, §2.1) over temperature
    (``(nq, na)``) and ``criterion`` the InfoNCE objective of :class:`~lexgraph.losses.InfoNCELoss`
    on the same scores.
    """

    def __init__(
        self,
        query_encoder: QueryEncoder,
        article_encoder: HierarchicalArticleEncoder,
        temperature: float = 0.01,
        similarity: str = "cosine",
    ) -> None:
        super().__init__()
        if query_encoder.dim != article_encoder.dim:
            raise ConfigError(
                f"query encoder dim {query_encoder.dim} != article encoder dim {article_encoder.dim}; "
                "both must come from models with the same hidden size"
            )
        self.query_encoder = query_encoder
        self.article_encoder = article_encoder
        self.criterion = InfoNCELoss(temperature, similarity)

    @property
    def temperature(self) -> float:
        return self.criterion.temperature

    @property
    def similarity_name(self) -> str:
        """``cosine`` or ``dot``: how this DSR scores (trains, selects and ranks)."""
        return "cosine" if self.criterion.cosine else "dot"

    @property
    def dim(self) -> int:
        return self.query_encoder.dim

    def encode_query(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``(batch, seq)`` -> ``(batch, dim)`` (differentiable)."""
        return self.query_encoder(input_ids, attention_mask)

    def encode_article(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, chunk_counts: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Padded ``(batch, chunks, len)`` or packed ``(m, len)`` + ``chunk_counts`` ``(batch,)``
        -> ``(batch, dim)`` (differentiable)."""
        return self.article_encoder(input_ids, attention_mask, chunk_counts)

    def encode_queries(self, texts: Sequence[str], batch_size: int = 64, **kwargs: Any) -> torch.Tensor:
        """Texts -> float32 ``(n, dim)`` with the query encoder (no grad)."""
        return self.query_encoder.encode(texts, batch_size=batch_size, **kwargs)

    def encode_articles(self, texts: Sequence[str], batch_size: int = 64, **kwargs: Any) -> torch.Tensor:
        """Texts -> float32 ``(n, dim)`` with the article encoder (no grad)."""
        return self.article_encoder.encode(texts, batch_size=batch_size, **kwargs)

    def similarity(self, queries: torch.Tensor, articles: torch.Tensor) -> torch.Tensor:
        """Cosine (or dot product) / temperature: ``(nq, dim)``, ``(na, dim)`` -> ``(nq, na)``."""
        return self.criterion.similarity(queries, articles)

    def save(self, directory: str | os.PathLike, backbone_source: str | os.PathLike | None = None) -> None:
        """Write ``query_encoder/``, ``article_encoder/`` and ``dsr.json`` under ``directory``
        (a frozen chunk encoder is saved as a reference to ``backbone_source`` when given)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.query_encoder.save_pretrained(directory / "query_encoder")
        self.article_encoder.save_pretrained(directory / "article_encoder", backbone_source=backbone_source)
        write_json(
            {
                "format_version": FORMAT_VERSION,
                "temperature": self.temperature,
                "dim": self.dim,
                "similarity": self.similarity_name,
                "normalized_embeddings": False,
            },
            directory / DSR_CONFIG,
            ensure_ascii=True,
        )

    @classmethod
    def load(
        cls, directory: str | os.PathLike, device: torch.device | str | None = None, with_article_backbone: bool = True
    ) -> DSR:
        """Load a saved DSR; ``with_article_backbone=False`` skips the article side's chunk
        encoder (enough to aggregate cached chunk vectors)."""
        directory = Path(directory)
        if is_disabled(directory):
            raise ConfigError(
                f"{directory}: a switched-off stage's placeholder ({DISABLED_FILE}), not a trained DSR; switch "
                f"its stage on ('enabled: true') and {restore_hint(directory)}"
            )
        config_path = directory / DSR_CONFIG
        config = read_json_object(
            config_path,
            what="the DSR settings train_dsr writes",
            keys={
                "temperature": (lambda v: finite_number(v) and v > 0, "a positive number"),
                "similarity": (lambda v: v in SIMILARITIES, " or ".join(SIMILARITIES)),
            },
            fix=restore_hint(config_path),
        )
        model = cls(
            QueryEncoder.from_pretrained(directory / "query_encoder"),
            HierarchicalArticleEncoder.from_pretrained(
                directory / "article_encoder", with_backbone=with_article_backbone
            ),
            temperature=config["temperature"],
            similarity=config["similarity"],
        )
        model.eval()
        return model.to(device) if device is not None else model


def cosine_scores(queries: torch.Tensor, articles: torch.Tensor) -> torch.Tensor:
    """Plain cosine similarity ``(nq, dim)``, ``(na, dim)`` -> ``(nq, na)`` in float32."""
    return F.normalize(queries.float(), dim=-1) @ F.normalize(articles.float(), dim=-1).T  # (nq, na)


def write_disabled(out_dir: str | os.PathLike, reason: str) -> None:
    """The placeholder output (:data:`DISABLED_FILE`, ``{"enabled": false}``) of a switched-off
    stage, or of a stage run on such a placeholder; ``reason`` (which) goes to the log line."""
    with atomic_path(out_dir, directory=True) as tmp:
        write_json({"enabled": False}, Path(tmp) / DISABLED_FILE, indent=None, ensure_ascii=True)
    log.info("%s holds a placeholder: %s", out_dir, reason)


def is_disabled(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` is a switched-off stage's placeholder (:func:`write_disabled`)."""
    return (Path(directory) / DISABLED_FILE).is_file()
