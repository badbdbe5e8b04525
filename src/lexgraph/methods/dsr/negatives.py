"""BM25 hard negatives for training the dense retriever.

For every training question, the articles that BM25 ranks highest but that are not
gold: retrieve the top-``depth`` articles with a BM25 index of its own ``k1``/``b``
(G-DSR: k1 = 1.0, b = 0.6, independent of the tuned evaluation BM25), remove the
question's gold articles and keep the ``k`` best that remain, best first. Articles
sharing no term with the question (BM25 score 0) are never negatives, so a question
may get fewer than ``k`` (possibly none).

The hub's own BM25 negatives (``data/raw/negatives.parquet``, fetched only with
``fetch.negatives``) take precedence: a question with a list there keeps that list (gold
articles and articles not in the clean corpus removed, the first ``k`` kept), as the
authors' code trains on the negatives file it was given (gdsr ``src/data/bsard_module.py``,
``hard_negatives_filepath``; the lists made by ``src/tasks/bm25_negatives.py``); the other
questions (doc2query ones, or every one when nothing was fetched) are mined here. Question
ids are unique across splits (``fetch``), so a carved dev question keeps its train list.
The fetched synthetic questions are rows of both inputs (``generate_queries`` copies them
from the clean questions into the synthetic file, ids included): they count once, as clean
questions, and so take the hub's synthetic lists.

Output (``data/negatives/negatives.parquet``): ``question_id`` int64, ``split`` str,
``negative_ids`` list[int64], one row per selected question, in input order.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import polars as pl
from pydantic import Field, field_validator

from lexgraph.core.config import HELD_OUT_SPLIT, refuse_held_out
from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.core.progress import progress_bar
from lexgraph.core.settings import Expect, Float, Int, Section
from lexgraph.core.stage import StageContext, stage_paths
from lexgraph.data.schema import SPLITS
from lexgraph.search.bm25 import BM25
from lexgraph.text.analyzer import FrenchAnalyzer

log = logging.getLogger(__name__)

ARTICLE_COLUMNS = ("id", "article")
QUESTION_COLUMNS = ("id", "question", "article_ids", "split")
SCHEMA = {"question_id": pl.Int64, "split": pl.String, "negative_ids": pl.List(pl.Int64)}
SECTION = "negatives"


#: the splits negatives may be mined for (``test`` refused by the section's validator: it is held out)
TRAINING_SPLITS = ", ".join(s for s in SPLITS if s != HELD_OUT_SPLIT)


class NegativesConfig(Section, section=SECTION):
    """The ``negatives`` section of params.yaml (read by ``mine_negatives``)."""

    k1: Annotated[Float, Field(ge=0, description="BM25 of its own (G-DSR: 1.0, 0.6)")]
    b: Annotated[Float, Field(ge=0, le=1)]
    depth: Annotated[Int, Field(gt=0, description="negatives from BM25's top-depth")]
    k: Annotated[Int, Field(gt=0, description="negatives kept per question")]
    splits: Annotated[
        list[Literal[SPLITS]],
        Field(min_length=1),
        Expect(f"a non-empty list of split names among {TRAINING_SPLITS}"),
    ]

    @field_validator("splits")
    @classmethod
    def _not_held_out(cls, splits: list[str]) -> list[str]:
        refuse_held_out(SECTION, "splits", splits, f"training splits only ({TRAINING_SPLITS})")  # a ConfigError
        return splits


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
    if len(question_tokens) != len(gold):
        raise LexgraphError(f"negatives: {len(question_tokens)} questions but {len(gold)} gold lists")
    out: list[np.ndarray] = []
    n = len(question_tokens)
    with progress_bar(n, "mine negatives", unit="q", disable=n < 2000) as bar:
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
        raise DataError(
            path, f"expected a list of int64 article ids (clean stage output), got {dtype}", column="article_ids"
        )


def load_questions(path, splits: Sequence[str]) -> pl.DataFrame:
    """Read a questions Parquet file (clean schema) and keep the rows whose split is in ``splits``."""
    from lexgraph.core.io import read_parquet

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
            counts.size,
            counts.mean(),
            int((counts < k).sum()),
            k,
        )
    return pl.DataFrame(
        {
            "question_id": questions["id"].cast(pl.Int64),
            "split": questions["split"].cast(pl.String),
            "negative_ids": [n.tolist() for n in negatives],
        },
        schema=SCHEMA,
    )


def hub_lists(path, corpus: set[int]) -> dict[int, list[int]]:
    """The fetched hub negatives (``data/raw/negatives.parquet``): ``{question id: article ids}``,
    articles outside the clean corpus dropped."""
    from lexgraph.core.io import read_parquet

    df = read_parquet(path, ["question_id", "split", "article_ids"])
    out: dict[int, list[int]] = {}
    for qid, ids in zip(df["question_id"].to_list(), df["article_ids"].to_list()):
        out.setdefault(int(qid), []).extend(int(a) for a in (ids or []) if int(a) in corpus)
    return out


def with_hub_lists(questions: pl.DataFrame, hub: dict[int, list[int]], mine, k: int, fetched: int) -> pl.DataFrame:
    """Negatives of ``questions`` in input order: the hub's list where it has one (gold removed,
    the first ``k``), else ``mine(subset)``'s (a negatives frame of the other questions). Only
    the first ``fetched`` rows (the clean questions, which the hub's ids number) may take a
    hub list; the generated questions after them are always mined."""
    has = [row < fetched and int(q) in hub for row, q in enumerate(questions["id"].to_list())]
    rest = questions.filter(~pl.Series(has, dtype=pl.Boolean))
    mined = mine(rest)["negative_ids"].to_list() if rest.height else []
    rows, pending = [], iter(mined)
    for qid, gold, from_hub in zip(questions["id"].to_list(), questions["article_ids"].to_list(), has):
        golds = set(gold or [])
        rows.append(list(dict.fromkeys(a for a in hub[int(qid)] if a not in golds))[:k] if from_hub else next(pending))
    log.info("negatives: %d questions take the hub's lists, %d are mined here", sum(has), len(has) - sum(has))
    return pl.DataFrame(
        {
            "question_id": questions["id"].cast(pl.Int64),
            "split": questions["split"].cast(pl.String),
            "negative_ids": rows,
        },
        schema=SCHEMA,
    )


def without_clean_rows(synthetic: pl.DataFrame, clean: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``synthetic`` (the synthetic file) that are not rows of ``clean``: the fetched
    synthetic questions that ``generate_queries`` copied (same id, text, gold and split) are
    left to the clean file's rows; a generated question, or a copy that differs, stays."""
    known = {(q, t, tuple(a or ()), s) for q, t, a, s in clean.iter_rows()}
    keep = [(q, t, tuple(a or ()), s) not in known for q, t, a, s in synthetic.iter_rows()]
    return synthetic.filter(pl.Series(keep, dtype=pl.Boolean)) if not all(keep) else synthetic


def mine(config: NegativesConfig, articles_path, questions_path, synthetic_path=None, hub_path=None) -> pl.DataFrame:
    """The negatives of :func:`run_mine_negatives`: read the inputs, take the hub's lists
    (``hub_path``, the fetched ``data/raw/negatives.parquet``) where there are some, mine the
    others with ``config``."""

    from lexgraph.core.io import read_parquet

    k1, b, depth, k, splits = config.k1, config.b, config.depth, config.k, config.splits

    articles = read_parquet(articles_path, ARTICLE_COLUMNS)
    frames = [load_questions(questions_path, splits)]
    if synthetic_path is not None:
        if Path(synthetic_path).is_file():
            frames.append(without_clean_rows(load_questions(synthetic_path, splits), frames[0]))
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
    log.info(
        "mining negatives for %d questions (splits %s) over %d articles", questions.height, splits, articles.height
    )
    if questions.height == 0:
        log.warning("no question has a split in %s: writing an empty negatives file", splits)

    def mine_subset(subset: pl.DataFrame) -> pl.DataFrame:
        return mine_negatives(articles, subset, k1=k1, b=b, depth=depth, k=k)

    hub = hub_lists(hub_path, set(articles["id"].to_list())) if hub_path is not None else {}
    return with_hub_lists(questions, hub, mine_subset, k, frames[0].height) if hub else mine_subset(questions)


NegativesPaths = stage_paths("mine_negatives")


def run_mine_negatives(paths: NegativesPaths, config: NegativesConfig, context: StageContext) -> None:
    """The ``mine_negatives`` stage: BM25 hard negatives (top-depth BM25 articles minus gold, best
    k kept) -> ``paths.out``."""
    from lexgraph.core.io import write_parquet

    write_parquet(mine(config, paths.articles, paths.questions, paths.synthetic, paths.hub_negatives), paths.out)
