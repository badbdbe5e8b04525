"""The DSR toy shared by test_dsr, test_dsr_refit and test_learning: six articles over the
tiny vocabulary, a complete DSRConfig at toy sizes, and a freshly seeded DSR built from
conftest's ``tiny_model_dir``."""

from __future__ import annotations

import torch

from helpers_config import sample_config
from lexgraph.methods.dsr.config import DSRConfig
from lexgraph.models.article_encoder import HierarchicalArticleEncoder
from lexgraph.models.dsr import DSR
from lexgraph.models.encoders import QueryEncoder

CORPUS = {
    1: "le contrat de bail " * 8,
    2: "article du mariage et de l'enfant",
    3: "la loi du divorce",
    4: "le bail du contrat de la loi",
    5: "enfant mariage divorce",
    6: "les articles de la loi " * 5,
}


def _config(**kw) -> DSRConfig:
    base = dict(
        max_chunk_length=16,
        max_document_length=32,
        max_query_length=16,
        chunk_heads=2,
        chunk_layers=1,
        epochs=2,
        batch_size=3,
        lr=1e-3,
        eval_batch_size=4,
        temperature=0.05,
        # the toy encoder: end to end, [CLS] and max pooling, every layer trains
        chunk_encoder="finetune",
        query_trainable_layers=None,
        chunk_identity_init=False,
        chunk_lr=None,
        pooling="max",
        token_pooling="cls",
        synthetic_per_epoch=None,
        warmup_ratio=0.05,
        synthetic=True,
    )
    base.update(kw)
    return sample_config(DSRConfig, "dsr", **base)


def _fresh_dsr(path, config: DSRConfig, seed: int = 0) -> DSR:
    torch.manual_seed(seed)
    query = QueryEncoder.from_pretrained(path, max_length=config.max_query_length, token_pooling=config.token_pooling)
    article = HierarchicalArticleEncoder.from_pretrained(
        path,
        max_chunk_length=config.max_chunk_length,
        max_document_length=config.max_document_length,
        pooling=config.pooling,
        num_layers=config.chunk_layers,
        num_heads=config.chunk_heads,
        token_pooling=config.token_pooling,
    )
    return DSR(query, article, temperature=config.temperature, similarity=config.similarity)
