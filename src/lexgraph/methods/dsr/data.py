"""DSR's training data: (question, gold article) pairs with their BM25 negatives, the dev
questions for model selection, and the hard-negative draw (:mod:`lexgraph.methods.dsr.train`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lexgraph.core.errors import DataError
from lexgraph.core.io import read_parquet

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# Training data
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    """One (question, gold article) training pair."""

    query: str
    key: tuple[str, int]  # (split, question id): the negatives' key
    gold: frozenset[int]  # all gold articles of the question
    positive: int
    negatives: tuple[int, ...]  # BM25 negatives of the question (never gold)


@dataclass
class TrainingData:
    pairs: list[Pair]  # real training pairs, used every epoch
    article_ids: list[int]  # corpus order
    article_texts: list[str]
    synthetic_pairs: list[Pair] = field(default_factory=list)  # sampled per epoch (synthetic_per_epoch)
    dev_questions: list[str] = field(default_factory=list)
    dev_qrels: dict[int, set[int]] = field(default_factory=dict)  # question id -> gold ids
    dev_ids: list[int] = field(default_factory=list)
    dev_pairs: list[Pair] = field(default_factory=list)  # (dev question, gold) pairs: the refit's extra pairs
    chunks: Any = None  # lexgraph.encoding.chunks.ChunkTable of the corpus (frozen chunk encoder), else None


def _negatives_index(negatives, corpus: set[int]) -> dict[tuple[str, int], list[int]]:
    index: dict[tuple[str, int], list[int]] = {}
    dropped = 0
    for qid, split, neg in zip(
        negatives["question_id"].to_list(), negatives["split"].to_list(), negatives["negative_ids"].to_list()
    ):
        kept = [int(a) for a in (neg or []) if int(a) in corpus]
        dropped += len(neg or []) - len(kept)
        index.setdefault((str(split), int(qid)), []).extend(kept)
    if dropped:
        log.warning("%d negative ids are not in the corpus and were dropped", dropped)
    return index


def build_pairs(questions, negatives, corpus: set[int], path="questions") -> list[Pair]:
    """Pairs (question, gold article) of a questions table, with their BM25 negatives.

    ``questions`` needs ``id``, ``question``, ``article_ids`` (list[int]), ``split``;
    ``negatives`` ``question_id``, ``split``, ``negative_ids``. Gold articles missing from
    ``corpus`` raise :class:`DataError`; negatives that are gold are dropped.
    """
    index = _negatives_index(negatives, corpus)
    pairs: list[Pair] = []
    rows = zip(
        questions["id"].to_list(),
        questions["question"].to_list(),
        questions["article_ids"].to_list(),
        questions["split"].to_list(),
    )
    for row, (qid, text, gold, split) in enumerate(rows):
        gold_ids = [int(a) for a in (gold or [])]
        if not gold_ids:
            raise DataError(path, "question without gold article", row=row, column="article_ids")
        missing = [a for a in gold_ids if a not in corpus]
        if missing:
            raise DataError(path, f"gold article ids {missing} are not in the corpus", row=row, column="article_ids")
        gold_set = frozenset(gold_ids)
        negs = tuple(dict.fromkeys(a for a in index.get((str(split), int(qid)), []) if a not in gold_set))
        for article in dict.fromkeys(gold_ids):
            pairs.append(Pair(str(text), (str(split), int(qid)), gold_set, article, negs))
    return pairs


def split_pairs(questions, negatives, corpus: set[int], splits: Sequence[str], path="questions") -> list[Pair]:
    """:func:`build_pairs` of the questions whose split is in ``splits``, split after split."""
    import polars as pl

    pairs: list[Pair] = []
    for split in splits:
        pairs += build_pairs(questions.filter(pl.col("split") == split), negatives, corpus, path)
    return pairs


def load_training_data(
    articles_path, questions_path, synthetic_path, negatives_path, use_synthetic: bool, refit: bool = False
) -> TrainingData:
    """Read the stage inputs into :class:`TrainingData` (train + optional synthetic pairs, dev qrels;
    with ``refit`` the dev pairs too)."""
    import polars as pl

    articles = read_parquet(articles_path, ["id", "article"])
    qcols = ["id", "question", "article_ids", "split"]
    questions = read_parquet(questions_path, qcols)
    negatives = read_parquet(negatives_path, ["question_id", "split", "negative_ids"])
    article_ids = [int(a) for a in articles["id"].to_list()]
    corpus = set(article_ids)
    if len(corpus) != len(article_ids):
        raise DataError(articles_path, "article ids are not unique", column="id")
    train = questions.filter(pl.col("split") == "train")
    if train.height == 0:
        raise DataError(questions_path, "no question with split 'train'", column="split")
    pairs = split_pairs(questions, negatives, corpus, ["train"], questions_path)
    log.info("%d training pairs from %d train questions", len(pairs), train.height)
    synthetic_pairs: list[Pair] = []
    if use_synthetic:
        synthetic = read_parquet(synthetic_path, qcols)
        synthetic_pairs = build_pairs(synthetic, negatives, corpus, synthetic_path)
        log.info("%d synthetic pairs from %s", len(synthetic_pairs), synthetic_path)
    dev = questions.filter(pl.col("split") == "dev")
    texts = ["" if t is None else str(t) for t in articles["article"].to_list()]
    data = TrainingData(pairs, article_ids, texts, synthetic_pairs)
    data.dev_ids = [int(q) for q in dev["id"].to_list()]
    data.dev_questions = [str(q) for q in dev["question"].to_list()]
    data.dev_qrels = {int(q): {int(a) for a in gold} for q, gold in zip(data.dev_ids, dev["article_ids"].to_list())}
    if refit:  # the refit trains on dev: its questions need BM25 negatives as train's have (negatives.splits)
        refuse_unmined(data.dev_ids, negatives, negatives_path)
        data.dev_pairs = split_pairs(questions, negatives, corpus, ["dev"], questions_path)
        log.info(
            "%d dev pairs for the refit (%d with BM25 negatives; a dev question BM25 found no non-gold "
            "article for draws a random one, as a train question does)",
            len(data.dev_pairs),
            sum(1 for p in data.dev_pairs if p.negatives),
        )
    return data


def refuse_unmined(dev_ids: Sequence[int], negatives, path) -> None:
    """Every dev question has a row in the negatives file (mined, even if BM25 found none):
    otherwise the refit would train it on random negatives where train questions get BM25's."""
    mined = {
        int(q) for q, split in zip(negatives["question_id"].to_list(), negatives["split"].to_list()) if split == "dev"
    }
    missing = [q for q in dev_ids if q not in mined]
    if missing:
        raise DataError(
            path,
            f"{len(missing)} of {len(dev_ids)} dev questions (first: {missing[0]}) have no mined "
            "BM25 negatives, but 'dsr.refit' trains on them; add dev to 'negatives.splits' in "
            "params.yaml",
        )


def sample_negatives(pairs: Sequence[Pair], article_ids: Sequence[int], rng: np.random.Generator) -> list[int]:
    """One hard negative per pair (uniform over its BM25 negatives; a random non-gold
    article when it has none)."""
    out = []
    for pair in pairs:
        if pair.negatives:
            out.append(pair.negatives[int(rng.integers(len(pair.negatives)))])
            continue
        if len(pair.gold) >= len(article_ids):
            raise DataError("negatives", f"question {pair.key} cites every article; no negative exists")
        while True:
            candidate = int(article_ids[int(rng.integers(len(article_ids)))])
            if candidate not in pair.gold:
                out.append(candidate)
                break
    return out
