"""BM25 hard negatives for training the dense retriever.

For every training question, the articles that BM25 ranks highest but that are not
gold: retrieve the top-``depth`` articles with a BM25 index of its own ``k1``/``b``
(G-DSR: k1 = 1.0, b = 0.6, independent of the tuned evaluation BM25), remove the
question's gold articles and keep the ``k`` best that remain, best first. Articles
sharing no term with the question (BM25 score 0) are never negatives, so a question
may get fewer than ``k`` (possibly none).

Output (``data/negatives/negatives.parquet``): ``question_id`` int64, ``split`` str,
``negative_ids`` list[int64], one row per selected question, in input order.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import polars as pl
from tqdm.auto import tqdm

from lexgraph.errors import DataError, LexgraphError
from lexgraph.retrieval.bm25 import BM25
from lexgraph.text import FrenchAnalyzer

log = logging.getLogger(__name__)

ARTICLE_COLUMNS = ("id", "article")
QUESTION_COLUMNS = ("id", "question", "article_ids", "split")
SCHEMA = {"question_id": pl.Int64, "split": pl.String, "negative_ids": pl.List(pl.Int64)}


def mine_from_index(
    bm25: BM25,
    question_tokens: Sequence[Sequence[str]],
    gold: Sequence[Sequence[int]],
    *,
    k: int = 10,
    depth: int = 500,
    batch_size: int = 4096,
) -> list[np.ndarray]:
    """Negatives (int64 article ids, best first, ``<= k``) for each tokenised question.

    Equivalent to taking BM25's top-``depth``, removing gold and positive-score-less
    articles and keeping the first ``k``; only ``min(depth, k + |gold|)`` articles are
    actually retrieved for a batch, which gives the same lists faster.
    """
    if k < 1 or depth < 1:
        raise LexgraphError(f"negatives: k = {k} and depth = {depth} must be positive")
    if len(question_tokens) != len(gold):
        raise LexgraphError(f"negatives: {len(question_tokens)} questions but {len(gold)} gold lists")
    out: list[np.ndarray] = []
    n = len(question_tokens)
    with tqdm(total=n, desc="mine negatives", unit="q", disable=n < 2000) as bar:
        for start in range(0, n, batch_size):
            toks = question_tokens[start : start + batch_size]
            golds = [np.unique(np.asarray(g, dtype=np.int64)) for g in gold[start : start + batch_size]]
            need = min(depth, k + max((g.size for g in golds), default=0))
            ids, scores = bm25.search_tokens(toks, need, progress=False)
            for row_ids, row_scores, g in zip(ids, scores, golds):
                keep = (row_scores > 0) & ~np.isin(row_ids, g, assume_unique=False)
                out.append(row_ids[keep][:k].astype(np.int64))
            bar.update(len(toks))
    return out


def _check_article_ids(df: pl.DataFrame, path) -> None:
    dtype = df.schema["article_ids"]
    if not (isinstance(dtype, pl.List) and dtype.inner.is_integer()):
        raise DataError(path, f"expected a list of int64 article ids (clean stage output), got {dtype}", column="article_ids")


def load_questions(path, splits: Sequence[str]) -> pl.DataFrame:
    """Read a questions Parquet file (clean schema) and keep the rows whose split is in ``splits``."""
    from lexgraph.io import read_parquet

    df = read_parquet(path, QUESTION_COLUMNS)
    _check_article_ids(df, path)
    nulls = df.select(pl.col(c).is_null().sum() for c in ("id", "question", "split")).row(0)
    for column, count in zip(("id", "question", "split"), nulls):
        if count:
            raise DataError(path, f"{count} missing value(s)", column=column)
    return df.filter(pl.col("split").is_in(list(splits))).select(
        pl.col("id").cast(pl.Int64),
        pl.col("question").cast(pl.String),
        pl.col("article_ids").cast(pl.List(pl.Int64)),
        pl.col("split").cast(pl.String),
    )


def mine_negatives(
    articles: pl.DataFrame,
    questions: pl.DataFrame,
    *,
    k1: float = 1.0,
    b: float = 0.6,
    depth: int = 500,
    k: int = 10,
    analyzer: FrenchAnalyzer | None = None,
) -> pl.DataFrame:
    """BM25 negatives for every row of ``questions`` (clean schema) over ``articles``."""
    analyzer = analyzer or FrenchAnalyzer()
    bm25 = BM25(k1=k1, b=b, analyzer=analyzer.config())
    bm25.fit(analyzer.analyze_many(articles["article"].to_list(), desc="analyze articles"), articles["id"].to_numpy())
    tokens = analyzer.analyze_many(questions["question"].to_list(), desc="analyze questions")
    gold = [g if g is not None else [] for g in questions["article_ids"].to_list()]
    negatives = mine_from_index(bm25, tokens, gold, k=k, depth=depth)
    counts = np.fromiter((n.size for n in negatives), dtype=np.int64, count=len(negatives))
    if counts.size:
        log.info(
            "negatives: %d questions, %.2f negatives on average, %d with fewer than %d",
            counts.size, counts.mean(), int((counts < k).sum()), k,
        )
    return pl.DataFrame(
        {
            "question_id": questions["id"].cast(pl.Int64),
            "split": questions["split"].cast(pl.String),
            "negative_ids": [n.tolist() for n in negatives],
        },
        schema=SCHEMA,
    )


def run(params: dict, articles_path, questions_path, synthetic_path=None) -> pl.DataFrame:
    """The ``mine_negatives`` stage: validate ``negatives`` params, read inputs, mine."""
    from pathlib import Path

    from lexgraph.config import require
    from lexgraph.errors import ConfigError
    from lexgraph.io import read_parquet

    section = "negatives"
    k1 = float(require(params, "k1", section, (int, float)))
    b = float(require(params, "b", section, (int, float)))
    depth = require(params, "depth", section, int)
    k = require(params, "k", section, int)
    splits = require(params, "splits", section, list)
    if depth < 1 or k < 1:
        raise ConfigError(f"params.yaml: '{section}.depth' = {depth} and '{section}.k' = {k} must be positive")
    if not splits or not all(isinstance(s, str) for s in splits):
        raise ConfigError(f"params.yaml: '{section}.splits' = {splits!r}, expected a non-empty list of split names")

    articles = read_parquet(articles_path, ARTICLE_COLUMNS)
    frames = [load_questions(questions_path, splits)]
    if synthetic_path is not None:
        if Path(synthetic_path).is_file():
            frames.append(load_questions(synthetic_path, splits))
        else:
            log.warning("%s not found: no synthetic questions mined", synthetic_path)
    questions = pl.concat(frames, how="vertical")
    dup = questions.filter(pl.struct("id", "split").is_duplicated())
    if dup.height:
        qid, split = dup.row(0, named=True)["id"], dup.row(0, named=True)["split"]
        raise DataError(
            synthetic_path if len(frames) > 1 else questions_path,
            f"question id {qid} occurs more than once in split '{split}' (ids must be unique per split)",
            column="id",
        )
    log.info("mining negatives for %d questions (splits %s) over %d articles", questions.height, splits, articles.height)
    if questions.height == 0:
        log.warning("no question has a split in %s: writing an empty negatives file", splits)
    return mine_negatives(articles, questions, k1=k1, b=b, depth=depth, k=k)
