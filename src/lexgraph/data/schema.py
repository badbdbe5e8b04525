"""BSARD's schema, shared by the embedded sample, the hub and local copies.

Corpus (hub config ``corpus``, file ``articles.csv``): one row per article with the
columns below. The hierarchy columns, from the top, name the heading an article sits
under at each level; any of them may be empty (missing level).

Questions (hub config ``questions``, files ``questions_<split>.csv``): ``article_ids``
is a comma-separated string of corpus ids.
"""

from __future__ import annotations

HIERARCHY_LEVELS: tuple[str, ...] = (
    "law_type",
    "code",
    "book",
    "part",
    "act",
    "chapter",
    "section",
    "subsection",
)

ARTICLE_COLUMNS: tuple[str, ...] = ("id", "article", "reference", *HIERARCHY_LEVELS, "description")
QUESTION_COLUMNS: tuple[str, ...] = (
    "id",
    "question",
    "category",
    "subcategory",
    "extra_description",
    "article_ids",
)
# Columns that must be present; the others are filled with nulls when absent.
REQUIRED_ARTICLE_COLUMNS: tuple[str, ...] = ("id", "article")
REQUIRED_QUESTION_COLUMNS: tuple[str, ...] = ("id", "question", "article_ids")


def _clean_question_schema():
    import polars as pl

    return {
        "id": pl.Int64,
        "question": pl.Utf8,
        "category": pl.Utf8,
        "subcategory": pl.Utf8,
        "extra_description": pl.Utf8,
        "article_ids": pl.List(pl.Int64),
        "split": pl.Utf8,
    }


#: Schema of the clean questions table (``data/clean/questions.parquet``), which synthetic
#: queries (``data/queries/synthetic.parquet``) share.
CLEAN_QUESTION_SCHEMA = _clean_question_schema()

SPLITS: tuple[str, ...] = ("train", "dev", "test", "synthetic")

# Hub file layout (``maastrichtlawtech/bsard``), reproduced by a ``local`` directory.
CORPUS_FILES: tuple[str, ...] = ("articles.csv", "articles_fr.csv")
QUESTION_FILES: dict[str, tuple[str, ...]] = {
    split: (f"questions_{split}.csv", f"questions_fr_{split}.csv") for split in SPLITS
}
NEGATIVE_FILES: dict[str, str] = {
    "train": "negatives/bm25_negatives_train.json",
    "synthetic": "negatives/bm25_negatives_synthetic.json",
}


def parse_article_ids(value) -> list[int]:
    """A question's ``article_ids`` cell as BSARD writes it (``"12,15"``; ``;`` also
    separates; spaces around an id are ignored) → the ids in order. Raises :class:`ValueError`
    with the reason; callers turn it into an error naming their file and row. Refused: a cell
    that holds no id (``""``, ``","``: one error for both), an empty item (``"12,,15"``,
    ``"12,"``: an id was lost), and an item that is not plain digits 0-9 (``"x4"``, ``"1_0"``,
    ``"٣"`` or ``"+3"``, which Python's ``int`` would read as 10, 3 and 3)."""
    parts = [] if value is None else [part.strip() for part in str(value).replace(";", ",").split(",")]
    if not any(parts):
        raise ValueError("no relevant article ids")
    out: list[int] = []
    for n, part in enumerate(parts, 1):
        if not part:
            raise ValueError(f"article ids {str(value)!r} have an empty item (item {n} of {len(parts)})")
        if not (part.isascii() and part.isdigit()):
            raise ValueError(f"article id {part!r} is not an integer")
        out.append(int(part))
    return out


def split_questions(questions, split: str) -> tuple[list[int], list[str], dict[int, list[int]]]:
    """``(qids, question texts, {qid: gold ids})`` of one split of the clean questions table, by id."""
    import polars as pl

    sub = questions.filter(pl.col("split") == split).sort("id")
    qids = sub["id"].to_list()
    return qids, sub["question"].to_list(), dict(zip(qids, sub["article_ids"].to_list()))
