"""Scoring an export the way a sentence-transformers user would: the export encodes the questions and
the articles itself and sentence-transformers' own ``InformationRetrievalEvaluator`` ranks and scores."""

from __future__ import annotations

from pathlib import Path

import polars as pl

#: the metrics compared: the evaluator names them as lexgraph does, after the similarity (``cosine_ndcg@10``)
COMPARED = ("recall@100", "map@100", "ndcg@10")


def split_data(workspace: Path, split: str) -> tuple[dict[str, str], dict[str, str], dict[str, set[str]]]:
    """``(queries, corpus, relevant)`` of ``split`` from the workspace's clean files, ids as strings."""
    articles = pl.read_parquet(workspace / "data" / "clean" / "articles.parquet", columns=["id", "article"])
    questions = pl.read_parquet(workspace / "data" / "clean" / "questions.parquet").filter(pl.col("split") == split)
    corpus = {str(i): text for i, text in zip(articles["id"], articles["article"])}
    queries = {str(q): text for q, text in zip(questions["id"], questions["question"])}
    relevant = {str(q): {str(a) for a in gold} for q, gold in zip(questions["id"], questions["article_ids"])}
    return queries, corpus, relevant


def st_metrics(export: Path, workspace: Path, split: str = "test") -> dict[str, float]:
    """lexgraph's names -> the evaluator's scores of ``SentenceTransformer(export)`` on ``split``."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    model = SentenceTransformer(str(export), trust_remote_code=True, device="cpu")
    queries, corpus, relevant = split_data(workspace, split)
    evaluator = InformationRetrievalEvaluator(
        queries,
        corpus,
        relevant,
        mrr_at_k=[10],
        ndcg_at_k=[10],
        accuracy_at_k=[10],
        precision_recall_at_k=[100],
        map_at_k=[100],
        batch_size=16,
        show_progress_bar=False,
    )
    scores = evaluator(model)
    return {name: float(scores[f"{model.similarity_fn_name}_{name}"]) for name in COMPARED}
