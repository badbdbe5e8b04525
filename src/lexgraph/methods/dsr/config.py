"""The ``dsr`` section of params.yaml (:class:`DSRConfig`), the ``dsr_qabisar`` section
(:class:`QabisarDSRConfig`: QABISAR's first stage, the ``dsr`` recipe with its own keys) and
building a fresh DSR from them (the loop is :mod:`lexgraph.methods.dsr.train`)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from typing import Any

from lexgraph.core.config import bad_value, expectation, params_error, section_config
from lexgraph.core.conform import settings_of
from lexgraph.core.errors import ConfigError
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


_CHOICES = {
    "article_init": ("pretrain", "base"),
    "query_init": ("pretrain", "base"),
    "chunk_encoder": ("finetune", "frozen"),
    "pooling": ("max", "mean", "token_mean"),
    "token_pooling": ("cls", "mean"),
    "selection": ("dev", "fixed"),
    "similarity": SIMILARITIES,
}
_POSITIVE = {"expected": "a positive integer"}


def _one_of(key: str) -> dict[str, str]:
    return {"expected": f"one of {', '.join(_CHOICES[key])}"}


@dataclass(frozen=True)
class DSRConfig:
    """The ``dsr`` section of ``params.yaml`` (see the comments there); every key is required."""

    article_init: str = field(metadata=_one_of("article_init"))
    query_init: str = field(metadata=_one_of("query_init"))
    base_model: str  # HF name/dir, or `random` (pretrain's config, random weights)
    synthetic: bool
    # synthetic pairs drawn per epoch (None: all)
    synthetic_per_epoch: int | None = field(metadata={"expected": "null or a positive integer"})
    chunk_encoder: str = field(metadata=_one_of("chunk_encoder"))  # frozen: cached chunk vectors
    # None: all weights; N: top N blocks (embeddings frozen)
    query_trainable_layers: int | None = field(metadata={"expected": "null or an integer >= 0"})
    chunk_identity_init: bool  # identity-initialised (pre-LN, zero residual) chunk Transformer
    chunk_lr: float | None = field(metadata={"expected": "null or a positive number"})  # None: lr
    pooling: str = field(metadata=_one_of("pooling"))  # over chunks
    token_pooling: str = field(metadata=_one_of("token_pooling"))  # over a question's / chunk's tokens
    max_chunk_length: int = field(metadata=_POSITIVE)
    max_document_length: int = field(metadata=_POSITIVE)
    max_query_length: int = field(metadata=_POSITIVE)
    chunk_layers: int = field(metadata=_POSITIVE)
    chunk_heads: int = field(metadata=_POSITIVE)
    # cosine (G-DSR) | dot (QABISAR): the score of training (InfoNCE over score / temperature), selection and search
    similarity: str = field(metadata=_one_of("similarity"))
    temperature: float = field(metadata={"expected": "a positive number"})
    epochs: int = field(metadata=_POSITIVE)
    batch_size: int = field(metadata=_POSITIVE)
    lr: float = field(metadata={"expected": "a positive number"})
    warmup_ratio: float = field(metadata={"expected": "a number in [0, 1]"})
    weight_decay: float = field(metadata={"expected": "a number >= 0"})
    max_grad_norm: float = field(metadata={"expected": "a number >= 0"})
    eval_batch_size: int = field(metadata=_POSITIVE)
    # micro-batches per batch (per process): same updates, less memory per forward
    accumulation_steps: int = field(metadata=_POSITIVE)
    # dev: the epoch with the best dev R@200, the untrained model included | fixed: the last of `epochs`
    selection: str = field(metadata=_one_of("selection"))
    # retrain from the same start on train+dev (G-DSR appendix B) for the epochs `selection` gives
    refit: bool = field(metadata={"expected": "true or false"})

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> DSRConfig:
        return section_config(cls, params, SECTION)

    def validate(self) -> None:
        def bad(key: str) -> ConfigError:
            return bad_value(SECTION, key, getattr(self, key), expectation(DSRConfig, key))

        for key, allowed in _CHOICES.items():
            if getattr(self, key) not in allowed:
                raise bad(key)
        if self.query_trainable_layers is not None and self.query_trainable_layers < 0:
            raise bad("query_trainable_layers")
        if self.chunk_lr is not None and not self.chunk_lr > 0:
            raise bad("chunk_lr")
        if self.synthetic_per_epoch is not None and self.synthetic_per_epoch < 1:
            raise bad("synthetic_per_epoch")
        for key in (
            "max_chunk_length",
            "max_document_length",
            "max_query_length",
            "chunk_layers",
            "chunk_heads",
            "epochs",
            "batch_size",
            "eval_batch_size",
            "accumulation_steps",
        ):
            if getattr(self, key) < 1:
                raise bad(key)
        for key in ("temperature", "lr"):
            if not getattr(self, key) > 0:
                raise bad(key)
        for key in ("weight_decay", "max_grad_norm"):
            if not getattr(self, key) >= 0:
                raise bad(key)
        if not 0 <= self.warmup_ratio <= 1:
            raise bad("warmup_ratio")
        if self.max_document_length < self.max_chunk_length:
            raise params_error(
                f"'{SECTION}.max_document_length' ({self.max_document_length}) must be >= "
                f"'{SECTION}.max_chunk_length' ({self.max_chunk_length})"
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
    if config.chunk_encoder == "frozen" and config.article_init != "pretrain":
        raise params_error(
            f"'{SECTION}.chunk_encoder' = frozen caches the chunk vectors of models/pretrain; "
            f"it needs '{SECTION}.article_init' = pretrain (got {config.article_init!r})"
        )
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


@dataclass(frozen=True)
class QabisarDSRConfig:
    """The ``dsr_qabisar`` section: the keys where QABISAR's dense bi-encoder (Santosh et al.,
    COLING 2025, §2.1 and App. A) differs from the ``dsr`` section's recipe (App. A follows G-DSR's)."""

    enabled: bool  # false: train_dsr_qabisar and embed_qabisar write placeholders, qabisar starts from models/dsr
    similarity: str = field(metadata=_one_of("similarity"))
    synthetic: bool

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> QabisarDSRConfig:
        return section_config(cls, params, QABISAR_SECTION)

    def validate(self) -> None:
        if self.similarity not in SIMILARITIES:
            raise bad_value(QABISAR_SECTION, "similarity", self.similarity, expectation(QabisarDSRConfig, "similarity"))


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
        return cls(own.enabled, replace(recipe, similarity=own.similarity, synthetic=own.synthetic))
