"""BSARD's schema, shared by the embedded sample, the hub and local copies.

Corpus (hub config ``corpus``, file ``articles.csv``): one row per article with the
columns below. The hierarchy columns, from the top, name the heading an article sits
under at each level; any of them may be empty (missing level).

Questions (hub config ``questions``, files ``questions_<split>.csv``): ``article_ids``
is a comma-separated string of corpus ids.

Ids (an ``id`` column, each id of ``article_ids``, the BM25 negatives' ids): one rule,
:func:`id_problem_of`: a non-negative integer written in decimal digits 0-9, without sign,
leading zero, exponent or spaces, at most 2**63 - 1 (int64). ``+7`` and ``007`` are refused
rather than read as ``7`` (a question citing ``+7`` would silently cite article 7), and
negative ids because search marks padding with ``-1``: article ``-1`` could never be found.

Corpus size: at least :data:`MIN_ARTICLES` articles (``fetch`` checks the file, ``clean``
what cleaning keeps), and no question may cite all of them: training needs for every question
an article it does not cite as a negative, so a corpus of one article cannot train ``train_dsr``.
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


#: the largest id (int64)
MAX_ID = 2**63 - 1
#: what an id must be, for messages
ID_EXPECTED = "a non-negative integer id in decimal digits 0-9, without sign or leading zero, at most 2**63 - 1"
#: the fewest articles a corpus may have: each question needs an article it does not cite (a negative)
MIN_ARTICLES = 2


def id_problem_of(text: str) -> str | None:
    """Why ``text`` (an id as written in a file, or a JSON integer as text) breaks the id rule
    of the module docstring, or None."""
    digits = text[1:] if text[:1] in "+-" else text
    if not (digits and digits.isascii() and digits.isdigit()):
        return "is not an integer"
    if text[0] == "-":
        return "is negative (search uses -1 as padding, so ids must be 0 or more)"
    if text[0] == "+":
        return "has a sign"
    if len(digits) > 1 and digits[0] == "0":
        return "has a leading zero"
    if int(digits) > MAX_ID:
        return "is larger than 2**63 - 1 (int64)"
    return None


def parse_article_ids(value) -> list[int]:
    """A question's ``article_ids`` cell as BSARD writes it (``"12,15"``; ``;`` also
    separates; spaces around an id are ignored) → the ids in order. Raises :class:`ValueError`
    with the reason; callers turn it into an error naming their file and row. Refused: a cell
    that holds no id (``""``, ``","``: one error for both), an empty item (``"12,,15"``,
    ``"12,"``: an id was lost), and an item that breaks the id rule (:func:`id_problem_of`:
    ``"x4"``, ``"1_0"``, ``"٣"``, ``"+3"`` or ``"03"``, which Python's ``int`` would read as 10,
    3, 3 and 3; ``"-1"``, padding in search)."""
    parts = [] if value is None else [part.strip() for part in str(value).replace(";", ",").split(",")]
    if not any(parts):
        raise ValueError("no relevant article ids")
    out: list[int] = []
    for n, part in enumerate(parts, 1):
        if not part:
            raise ValueError(f"article ids {str(value)!r} have an empty item (item {n} of {len(parts)})")
        problem = id_problem_of(part)
        if problem:
            raise ValueError(f"article id {part!r} {problem}")
        out.append(int(part))
    return out


def split_questions(questions, split: str) -> tuple[list[int], list[str], dict[int, list[int]]]:
    """``(qids, question texts, {qid: gold ids})`` of one split of the clean questions table, by id."""
    import polars as pl

    sub = questions.filter(pl.col("split") == split).sort("id")
    qids = sub["id"].to_list()
    return qids, sub["question"].to_list(), dict(zip(qids, sub["article_ids"].to_list()))
