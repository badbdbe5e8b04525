"""Reading and validating a source's tables (BSARD's CSV layout, the BM25 negatives' JSON) where
the file the user edits is known: :mod:`lexgraph.data.fetch` reads a directory with them and
:mod:`lexgraph.data.fetch_hub` the hub's files. Errors name the file, the 1-based data row and
the column."""

from __future__ import annotations

import io
import json
import logging
import os
import stat
import unicodedata
from pathlib import Path
from typing import Any

import polars as pl

from lexgraph.core.errors import DataError
from lexgraph.core.hub import first_line
from lexgraph.core.inputs import DuplicateKeyError, json_object
from lexgraph.core.io import unreadable
from lexgraph.data.integrity import (
    HUMAN_SPLITS,
    ONCE,
    Source,
    csv_layout,
    duplicated_column,
    expected_columns,
    first_duplicate,
    id_cell_problem,
    integer_id,
    layout_problems,
    refuse_repeat,
)
from lexgraph.data.schema import HIERARCHY_LEVELS, MIN_ARTICLES, parse_article_ids

log = logging.getLogger(__name__)


NEGATIVES_SCHEMA = {"question_id": pl.Int64, "split": pl.Utf8, "article_ids": pl.List(pl.Int64)}
ONE_OBJECT = "expected one JSON object a line"
#: what a corpus of too few articles is told
TOO_FEW = (
    f"expected at least {MIN_ARTICLES} (training needs, for every question, an article it does not cite as a negative)"
)
#: a negatives record's keys: its question's id, then its negatives (the first of each found)
NEGATIVES_KEYS = (("question_id", "id", "qid"), ("article_ids", "negatives", "negative_ids"))


# --------------------------------------------------------------------------- readers


def json_line(path: Path, line_no: int, line: str) -> dict:
    """The JSON object on line ``line_no`` of the JSON-lines file ``path`` (a key repeated within
    it refused); a :class:`DataError` naming the file and line otherwise."""
    try:
        value = json_object(line)
        problem = None if isinstance(value, dict) else f"a JSON {type(value).__name__}; {ONE_OBJECT}"
    except json.JSONDecodeError as exc:
        problem = f"not valid JSON ({exc.msg}); {ONE_OBJECT}"
    except DuplicateKeyError as exc:
        problem = str(exc)
    if problem:
        raise DataError(path, f"line {line_no}: {problem}") from None
    return value


#: what a path that is no regular file is, in words (``stat``'s tests)
_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device (such as /dev/null)"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_problem(path: Path) -> str | None:
    """What ``path`` is when it is no regular file to read a table from (``"file not found"``, ``"a
    directory, not a regular file"``, ``"a named pipe (FIFO), not a regular file"``, a broken link,
    ...), or None. Nothing is opened but a regular file (a pipe would block, a device reads empty)."""
    reason = unreadable(Path(path))
    if reason is None:
        return None
    if reason == "missing":
        return "file not found"
    if reason == "not a regular file":
        try:
            mode = os.stat(path).st_mode
        except OSError:
            mode = 0
        return next((kind for test, kind in _KINDS if test(mode)), "something else") + ", not a regular file"
    return f"{reason}, not a regular file" if reason == "a directory" else reason


def _csv_text(path: Path, required: tuple[str, ...]) -> tuple[str, None] | tuple[None, str]:
    """``(text, None)`` of the CSV file ``path``, or ``(None, why not)``: no regular file, empty, not UTF-8."""
    problem = file_problem(path)
    if problem:
        return None, f"{problem}; expected a CSV file"
    raw = path.read_bytes()
    if not raw.strip():
        return None, f"file is empty; expected a CSV header with columns {list(required)} and rows"
    try:
        return raw.decode("utf-8-sig"), None
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        return None, f"not valid UTF-8 at byte {exc.start} (line {line}); expected a UTF-8 encoded CSV"


def read_csv_source(path: Path, required: tuple[str, ...], columns: tuple[str, ...]) -> tuple[pl.DataFrame, Source]:
    """Read a UTF-8 CSV with every value as text; check its layout, required columns and ids; add
    absent optional columns. Returns the table and its :class:`Source` (for row-level messages)."""
    text, problem = _csv_text(path, required)
    layout = csv_layout(text) if text is not None else None
    message, row = next(layout_problems(layout, required, columns), (problem, None))
    if message:
        raise DataError(path, message, row=row)
    try:
        df = pl.read_csv(io.StringIO(text), infer_schema=False)
    except pl.exceptions.PolarsError as exc:
        raise DataError(path, f"not a readable CSV ({first_line(exc)}); {expected_columns(required, columns)}") from exc
    source = Source(path, layout.row_lines(df.height) if layout is not None else None)
    return conform(df, required, columns, source), source


def _columns_problem(df: pl.DataFrame, required: tuple[str, ...], columns: tuple[str, ...], unknown: list[str]):
    """What is wrong with the table's columns (one repeated, a required one missing, an
    ``unknown`` one) or rows (none), or None."""
    repeated = duplicated_column(df.columns)
    missing = [c for c in required if c not in df.columns]
    if repeated:
        return f"column {repeated[0]!r} appears twice in the header (the second read as {repeated[1]!r}); {ONCE}"
    if missing:
        return f"missing column(s) {missing}; expected at least {list(required)}, found {df.columns}"
    if unknown:
        return f"{unexpected_columns(unknown, required, columns)}: remove or merge the extra column(s)"
    return "no rows; expected at least one" if df.height == 0 else None


def conform(
    df: pl.DataFrame, required: tuple[str, ...], columns: tuple[str, ...], source: Any, extra: str = "refuse"
) -> pl.DataFrame:
    """Check the columns (:func:`_columns_problem`) and the ids (:func:`id_cell_problem`: refused,
    never stripped), add missing optional columns as nulls, cast ``id`` to int64.

    ``source``: a :class:`Source`, or the path/label to name in messages. ``extra``: a column
    outside ``columns`` is refused (``"refuse"``: a file the user edits) or logged as a warning
    and left out (``"warn"``: the hub's tables, which a new revision may widen)."""
    source = source if isinstance(source, Source) else Source(source)
    unknown = [c for c in df.columns if c not in columns]
    if unknown and extra == "warn":
        log.warning("%s: %s; left out", source.path, unexpected_columns(unknown, required, columns))
    problem = _columns_problem(df, required, columns, unknown if extra != "warn" else [])
    if problem:
        raise DataError(source.path, problem)
    df = df.with_columns([pl.lit(None, dtype=pl.Utf8).alias(c) for c in columns if c not in df.columns])
    df = df.select([pl.col(c).cast(pl.Utf8) if c != "id" else pl.col(c) for c in columns])
    ids = df["id"].cast(pl.Utf8)
    for row, value in enumerate(ids.to_list()):
        problem = id_cell_problem(value or "")
        if problem:
            raise source.error(row, f"{f'id {value!r}' if value else 'the id'} {problem}", column="id")
    return df.with_columns(ids.cast(pl.Int64).alias("id"))


def unexpected_columns(unknown: list[str], required: tuple[str, ...], columns: tuple[str, ...]) -> str:
    """The message for columns outside BSARD's layout: refused, not dropped (a ninth hierarchy
    level would silently vanish from every path)."""
    levels = ""
    if "article" in required:
        levels = f" (BSARD's hierarchy has {len(HIERARCHY_LEVELS)} levels, {', '.join(HIERARCHY_LEVELS)})"
    return f"unexpected column(s) {unknown}; {expected_columns(required, columns)} and no other{levels}"


# --------------------------------------------------------------------------- validation


def validate_articles(articles: pl.DataFrame, source: Source) -> None:
    """Article ids are unique, and the corpus has at least ``MIN_ARTICLES`` articles."""
    if articles.height < MIN_ARTICLES:
        raise DataError(source.path, f"{articles.height} article(s); {TOO_FEW}")
    ids = articles["id"].to_list()
    refuse_repeat(
        first_duplicate(ids),
        source,
        lambda n, _, where: f"article id {ids[n]} is already used by {where}; expected each article id once",
    )


def _question_problem(qid: Any, text: str | None, cited: Any, article_ids: set[int], corpus: Source):
    """``(message, column)`` for a question row without text, or whose ``article_ids`` are not
    integers of the corpus that leave at least one article uncited; None for a good one."""
    if not " ".join(unicodedata.normalize("NFC", text or "").split()):
        return f"question {qid} has no text; expected the question", "question"
    try:
        ids = parse_article_ids(cited)  # as clean parses it
    except ValueError as exc:
        return f"{exc}; expected a comma-separated list of integer ids of {corpus.path}", "article_ids"
    unknown = [a for a in dict.fromkeys(ids) if a not in article_ids]
    if unknown:
        return (
            f"question {qid} cites article id(s) {unknown} that are not in {corpus.path}; "
            "expected ids of its 'id' column",
            "article_ids",
        )
    if len(set(ids)) >= len(article_ids):
        return (
            f"question {qid} cites all {len(article_ids)} articles of {corpus.path}; expected a question that "
            "leaves at least one article uncited (training needs a negative)",
            "article_ids",
        )
    return None


def validate_questions(
    questions: dict[str, tuple[pl.DataFrame, Source]],
    article_ids: set[int],
    corpus: Source,
    names: dict[int, str] | None = None,
) -> None:
    """Every row passes :func:`_question_problem`, and question ids are unique across the train,
    dev and test questions. ``names``: the user's id of each question (``fetch.source: corpus``),
    named instead of lexgraph's."""
    for df, source in questions.values():
        for i, (qid, text, cited) in enumerate(df.select("id", "question", "article_ids").iter_rows()):
            problem = _question_problem(
                repr(names[qid]) if names is not None else qid, text, cited, article_ids, corpus
            )
            if problem:
                raise source.error(i, problem[0], column=problem[1])
    human = [
        (qid, (questions[split][1], i))
        for split in HUMAN_SPLITS
        if split in questions
        for i, qid in enumerate(questions[split][0]["id"].to_list())
    ]
    refuse_repeat(
        first_duplicate([qid for qid, _ in human]),
        [place for _, place in human],
        lambda n, _, where: (
            f"question id {human[n][0]} is already used by {where}; expected each question id once "
            "across the train, dev and test questions"
        ),
    )


def _negatives_from_json(obj: Any, split: str, path: Any) -> pl.DataFrame:
    """BM25 negatives, either ``{qid: [ids]}`` or a list of ``{question_id|id, article_ids|negatives}``."""
    if isinstance(obj, list):
        items = [
            tuple(next((rec[k] for k in keys if k in rec), None) for keys in NEGATIVES_KEYS)
            if isinstance(rec, dict)
            else (None, None)
            for rec in obj
        ]
        bad = next((n for n, item in enumerate(items, 1) if None in item), None)
        if bad:
            raise DataError(
                path, "expected a JSON object with keys question_id and article_ids (or negatives)", row=bad
            )
    elif isinstance(obj, dict):
        items = list(obj.items())
    else:
        raise DataError(path, "expected a JSON object {question_id: [article ids]} or a list of records")
    rows: list[tuple[int, list[int]]] = []
    for qid, ids in items:
        if isinstance(ids, str):
            ids = [x for x in ids.replace(" ", "").split(",") if x]
        try:
            rows.append((integer_id(qid), [integer_id(x) for x in ids]))
        except (TypeError, ValueError) as exc:
            raise DataError(path, f"question {qid!r}: negatives must be integer article ids ({exc})") from exc
    return pl.DataFrame(
        {"question_id": [r[0] for r in rows], "split": [split] * len(rows), "article_ids": [r[1] for r in rows]},
        schema=NEGATIVES_SCHEMA,
    )


def read_negatives(path: Path, split: str, label: Any) -> pl.DataFrame:
    """A BM25 negatives JSON file (``label`` names it in errors); a key repeated in one object
    is refused (``json.loads`` would keep the last one)."""
    try:
        obj = json_object(Path(path).read_text(encoding="utf-8"))
    except (DuplicateKeyError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        said = str(exc) if isinstance(exc, DuplicateKeyError) else f"not valid UTF-8 JSON ({exc})"
        raise DataError(label, said) from None
    return _negatives_from_json(obj, split, label)


def empty_negatives() -> pl.DataFrame:
    return pl.DataFrame(schema=NEGATIVES_SCHEMA)
