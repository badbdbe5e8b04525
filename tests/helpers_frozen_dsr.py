"""The toy corpus and frozen-backbone DSR settings shared by tests/test_frozen_dsr.py and
tests/test_resume_hostile.py."""

from __future__ import annotations

import polars as pl

from helpers_config import sample_config
from lexgraph.methods.dsr.config import DSRConfig
from lexgraph.methods.dsr.data import TrainingData, build_pairs

CORPUS = {
    1: "le contrat de bail " * 6,  # several chunks
    2: "le mariage",
    3: "la loi du divorce",
    4: "l'enfant du mariage et la loi " * 3,
    5: "article du bail",
    6: "les enfants",
}


def frozen_config(**kw) -> DSRConfig:
    base = dict(
        max_chunk_length=12,
        max_document_length=48,
        max_query_length=16,
        chunk_heads=2,
        chunk_layers=1,
        epochs=2,
        batch_size=3,
        lr=1e-3,
        chunk_lr=1e-2,
        eval_batch_size=4,
        temperature=0.05,
        chunk_encoder="frozen",
        chunk_identity_init=True,
        pooling="token_mean",
        token_pooling="mean",
        query_trainable_layers=1,
        synthetic=False,
    )
    base.update(kw)
    return sample_config(DSRConfig, "dsr", **base)


def frozen_data(table) -> TrainingData:
    questions = pl.DataFrame(
        {
            "id": [1, 2, 3],
            "question": ["le bail ?", "le mariage ?", "la loi du divorce"],
            "article_ids": [[1, 5], [2], [3]],
            "split": ["train"] * 3,
        }
    )
    negatives = pl.DataFrame({"question_id": [1], "split": ["train"], "negative_ids": [[2, 3]]})
    pairs = build_pairs(questions, negatives, set(CORPUS))
    return TrainingData(
        pairs=pairs,
        article_ids=list(CORPUS),
        article_texts=list(CORPUS.values()),
        dev_questions=["bail ?", "enfant ?"],
        dev_qrels={10: {1}, 11: {4, 6}},
        dev_ids=[10, 11],
        chunks=table,
    )
