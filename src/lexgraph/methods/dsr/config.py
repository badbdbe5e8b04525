"""The ``dsr`` section of params.yaml (:class:`DSRConfig`), the ``dsr_qabisar`` section
(:class:`QabisarDSRConfig`: QABISAR's first stage, the ``dsr`` recipe with its own keys) and
building a fresh DSR from them (the loop is :mod:`lexgraph.methods.dsr.train`)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from lexgraph.core.settings import Bool, Float, Int, Section, Str, enforce, settings_of
from lexgraph.losses.InfoNCELoss import SIMILARITIES
from lexgraph.models.article_encoder import HierarchicalArticleEncoder
from lexgraph.models.dsr import DSR
from lexgraph.models.encoders import QueryEncoder

log = logging.getLogger(__name__)

SECTION = "dsr"
#: QABISAR's first stage (train_dsr_qabisar): only the keys where it differs from the ``dsr`` section
QABISAR_SECTION = "dsr_qabisar"
EVAL_CUTOFF = 200  # model selection: dev recall@200 (G-DSR)


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


Count = Annotated[Int, Field(gt=0)]
Positive = Annotated[Float, Field(gt=0)]
NonNegative = Annotated[Float, Field(ge=0)]
Init = Literal["pretrain", "base"]
Similarity = Literal[SIMILARITIES]


class DSRConfig(Section, section=SECTION):
    """The ``dsr`` section of ``params.yaml`` (see the comments there); every key is required."""

    article_init: Init = Field(description="pretrain: start from models/pretrain | base: from `base_model`")
    query_init: Init
    base_model: Str = Field(description="HF name/dir, or `random` (pretrain's config, random weights)")
    synthetic: Bool = Field(description="add data/queries/synthetic.parquet pairs")
    synthetic_per_epoch: Count | None = Field(description="synthetic pairs drawn per epoch (null: all)")
    chunk_encoder: Literal["finetune", "frozen"] = Field(description="frozen: cached chunk vectors")
    query_trainable_layers: Annotated[Int, Field(ge=0)] | None = Field(
        description="null: all weights; N: top N blocks (embeddings frozen)"
    )
    chunk_identity_init: Bool = Field(description="identity-initialised (pre-LN, zero residual) chunk Transformer")
    chunk_lr: Positive | None = Field(description="the chunk-level module's learning rate (null: lr)")
    pooling: Literal["max", "mean", "token_mean"] = Field(description="over chunks")
    token_pooling: Literal["cls", "mean"] = Field(description="over a question's / chunk's tokens")
    max_chunk_length: Count
    max_document_length: Count
    max_query_length: Count
    chunk_layers: Count
    chunk_heads: Count
    similarity: Similarity = Field(
        description="cosine (G-DSR) | dot (QABISAR): the score of training (InfoNCE over score / temperature), "
        "selection and search"
    )
    temperature: Positive
    epochs: Count
    batch_size: Count
    lr: Positive
    warmup_ratio: Annotated[Float, Field(ge=0, le=1)]
    weight_decay: NonNegative
    max_grad_norm: NonNegative
    eval_batch_size: Count
    accumulation_steps: Count = Field(
        description="micro-batches per batch (per process): same updates, less memory per forward"
    )
    selection: Literal["dev", "fixed"] = Field(
        description="dev: the epoch with the best dev R@200, the untrained model included | fixed: the last of `epochs`"
    )
    refit: Bool = Field(
        description="retrain from the same start on train+dev (G-DSR appendix B) for the epochs `selection` gives"
    )

    @model_validator(mode="after")
    def _consistent(self) -> DSRConfig:
        frozen = f"pretrain with '{SECTION}.chunk_encoder' = frozen (the cached chunk vectors are models/pretrain's)"
        return enforce(
            self,
            [
                (
                    "max_document_length",
                    self.max_document_length < self.max_chunk_length,
                    f"an integer >= '{SECTION}.max_chunk_length' ({self.max_chunk_length})",
                ),
                ("article_init", self.chunk_encoder == "frozen" and self.article_init != "pretrain", frozen),
            ],
        )


# ---------------------------------------------------------------------------
# Model construction
# ---------------------------------------------------------------------------


def _source(init: str, config: DSRConfig, pretrained: str | os.PathLike) -> tuple[str, bool]:
    """(name_or_path, random_init) of the backbone for ``init`` = pretrain | base."""
    if init == "pretrain":
        return str(pretrained), False
    if config.base_model == "random":
        return str(pretrained), True
    return config.base_model, False


def build_dsr(config: DSRConfig, pretrained: str | os.PathLike) -> DSR:
    """A fresh DSR: both backbones from ``pretrained`` (the domain-adapted MLM) or the base model."""
    q_path, q_random = _source(config.query_init, config, pretrained)
    a_path, a_random = _source(config.article_init, config, pretrained)
    log.info(
        "query encoder from %s%s, article encoder from %s%s",
        q_path,
        " (random init)" if q_random else "",
        a_path,
        " (random init)" if a_random else "",
    )
    with settings_of(SECTION, BUILD_KEYS):
        return _build(config, q_path, q_random, a_path, a_random)


#: the encoders' arguments that come from the ``dsr`` section, by the key they come from
BUILD_KEYS = {
    "max_length": "max_query_length",
    "max_chunk_length": "max_chunk_length",
    "max_document_length": "max_document_length",
    "num_heads": "chunk_heads",
    "pooling": "pooling",
    "trainable_layers": "query_trainable_layers",
}


def _build(config: DSRConfig, q_path: str, q_random: bool, a_path: str, a_random: bool) -> DSR:
    query = QueryEncoder.from_pretrained(
        q_path,
        max_length=config.max_query_length,
        token_pooling=config.token_pooling,
        random_init=q_random,
        trainable_layers=config.query_trainable_layers,
    )
    article = HierarchicalArticleEncoder.from_pretrained(
        a_path,
        random_init=a_random,
        identity_init=config.chunk_identity_init,
        freeze_backbone=config.chunk_encoder == "frozen",
        max_chunk_length=config.max_chunk_length,
        max_document_length=config.max_document_length,
        pooling=config.pooling,
        num_layers=config.chunk_layers,
        num_heads=config.chunk_heads,
        token_pooling=config.token_pooling,
    )
    return DSR(query, article, temperature=config.temperature, similarity=config.similarity)


# ---------------------------------------------------------------------------
# QABISAR's first stage
# ---------------------------------------------------------------------------


class QabisarDSRConfig(Section, section=QABISAR_SECTION):
    """The ``dsr_qabisar`` section: the keys where QABISAR's dense bi-encoder (Santosh et al.,
    COLING 2025, §2.1 and App. A) differs from the ``dsr`` section's recipe (App. A follows G-DSR's)."""

    enabled: Bool = Field(
        description="false: train_dsr_qabisar and embed_qabisar write placeholders, qabisar starts from models/dsr"
    )
    similarity: Similarity
    synthetic: Bool


@dataclass(frozen=True)
class QabisarDSRSettings:
    """What ``train_dsr_qabisar`` runs: whether it trains, and its recipe (the ``dsr`` section with
    the ``dsr_qabisar`` keys in place of its own)."""

    enabled: bool
    recipe: DSRConfig

    @classmethod
    def from_sections(cls, sections: dict[str, Any]) -> QabisarDSRSettings:
        """From ``{"dsr": ..., "dsr_qabisar": ...}`` (what :func:`lexgraph.core.config.load_params`
        gives a section that extends another); each section checked by its own config."""
        own = QabisarDSRConfig.from_params(sections[QABISAR_SECTION])
        recipe = DSRConfig.from_params(sections[SECTION])
        return cls(own.enabled, recipe.model_copy(update={"similarity": own.similarity, "synthetic": own.synthetic}))
