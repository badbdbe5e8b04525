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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from lexgraph.core.errors import DataError
from lexgraph.core.hub import first_line
from lexgraph.core.inputs import DuplicateKeyError, id_problem, json_object
from lexgraph.core.io import unreadable
from lexgraph.data.integrity import (
    HUMAN_SPLITS,
    check_csv_layout,
    csv_layout,
    duplicated_column,
    expected_columns,
    first_duplicate,
    integer_id,
)
from lexgraph.data.schema import (
    HIERARCHY_LEVELS,
    ID_EXPECTED,
    MIN_ARTICLES,
    id_problem_of,
    parse_article_ids,
)

log = logging.getLogger(__name__)


NEGATIVES_SCHEMA = {"question_id": pl.Int64, "split": pl.Utf8, "article_ids": pl.List(pl.Int64)}


# --------------------------------------------------------------------------- readers


def json_line(path: Path, line_no: int, line: str) -> Any:
    """The JSON value on line ``line_no`` of the JSON-lines file ``path`` (a key repeated within
    an object refused); a :class:`DataError` naming the file and line otherwise."""
    try:
        return json_object(line)
    except json.JSONDecodeError as exc:
        raise DataError(path, f"line {line_no}: not valid JSON ({exc.msg}); expected one JSON object a line") from None
    except DuplicateKeyError as exc:
        raise DataError(path, f"line {line_no}: {exc}") from None


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


@dataclass(frozen=True)
class Source:
    """Where a table's rows come from, for error messages: ``path`` is what the user edits (a
    CSV file, or ``<repo>@<revision> (<config>/<split>)`` on the hub) and ``lines[i]`` the line
    of the file on which data row ``i + 1`` starts (CSV files only; a quoted field may span lines)."""

    path: Any
    lines: tuple[int, ...] | None = None
    #: the file's 1-based row of each table row, where a table holds some rows of a file (one split
    #: of a questions file that mixes splits, ``fetch.source: corpus``); None: row ``i`` is ``i + 1``
    rows: tuple[int, ...] | None = None

    def line(self, index: int) -> int | None:
        return self.lines[index] if self.lines is not None and 0 <= index < len(self.lines) else None

    def row(self, index: int) -> int:
        return self.rows[index] if self.rows is not None and 0 <= index < len(self.rows) else index + 1

    def error(self, index: int, message: str, column: str | None = None) -> DataError:
        """A :class:`DataError` at the 0-based row ``index``: reported as the 1-based data row
        and, for a file, the line it starts on."""
        line = self.line(index)
        if line is not None:
            message += f" (row {self.row(index)} starts on line {line})"
        return DataError(self.path, message, row=self.row(index), column=column)

    def where(self, index: int) -> str:
        """``row 3 of data/sample/questions_dev.csv (line 4)``: another row, in a message."""
        line = self.line(index)
        return f"row {self.row(index)} of {self.path}" + (f" (line {line})" if line is not None else "")


def read_csv_source(path: Path, required: tuple[str, ...], columns: tuple[str, ...]) -> tuple[pl.DataFrame, Source]:
    """Read a UTF-8 CSV with every value as text; check required columns and ids; add absent
    optional columns. Returns the table and its :class:`Source` (for row-level messages)."""
    problem = file_problem(path)
    if problem:
        raise DataError(path, f"{problem}; expected a CSV file")
    raw = path.read_bytes()
    if not raw.strip():
        raise DataError(path, f"file is empty; expected a CSV header with columns {list(required)} and rows")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(
            path, f"not valid UTF-8 at byte {exc.start} (line {line}); expected a UTF-8 encoded CSV"
        ) from exc
    layout = csv_layout(text)
    if layout is not None:
        check_csv_layout(path, layout, required, columns)
    try:
        df = pl.read_csv(io.StringIO(text), infer_schema=False)
    except pl.exceptions.PolarsError as exc:
        raise DataError(path, f"not a readable CSV ({first_line(exc)}); {expected_columns(required, columns)}") from exc
    source = Source(path, layout.row_lines(df.height) if layout is not None else None)
    return conform(df, required, columns, source), source


def read_csv_table(path: Path, required: tuple[str, ...], columns: tuple[str, ...]) -> pl.DataFrame:
    """:func:`read_csv_source` without the source."""
    return read_csv_source(path, required, columns)[0]


def conform(
    df: pl.DataFrame, required: tuple[str, ...], columns: tuple[str, ...], source: Any, extra: str = "refuse"
) -> pl.DataFrame:
    """Check required columns, add missing optional ones as nulls, cast ``id`` to int64.

    ``source``: a :class:`Source`, or the path/label to name in messages. ``extra``: a column
    outside ``columns`` is refused (``"refuse"``: a file the user edits) or logged as a warning
    and left out (``"warn"``: the hub's tables, which a new revision may widen)."""
    source = source if isinstance(source, Source) else Source(source)
    repeated = duplicated_column(df.columns)
    if repeated:
        raise DataError(
            source.path,
            f"column {repeated[0]!r} appears twice in the header (the second read as "
            f"{repeated[1]!r}); expected each column once",
        )
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise DataError(
            source.path, f"missing column(s) {missing}; expected at least {list(required)}, found {df.columns}"
        )
    unknown = [c for c in df.columns if c not in columns]
    if unknown and extra == "warn":
        log.warning("%s: %s; left out", source.path, unexpected_columns(unknown, required, columns))
    elif unknown:
        raise DataError(
            source.path, f"{unexpected_columns(unknown, required, columns)}: remove or merge the extra column(s)"
        )
    if df.height == 0:
        raise DataError(source.path, "no rows; expected at least one")
    df = df.with_columns([pl.lit(None, dtype=pl.Utf8).alias(c) for c in columns if c not in df.columns])
    df = df.select([pl.col(c).cast(pl.Utf8) if c != "id" else pl.col(c) for c in columns])
    ids = df["id"].cast(pl.Utf8)
    for row, value in enumerate(ids.to_list()):
        if not value:
            raise source.error(row, "the id is empty; expected an integer id", column="id")
        problem = id_problem(value)  # whitespace and control characters are refused, not stripped
        if problem:
            raise source.error(row, f"id {value!r} {problem}; expected an integer id", column="id")
        problem = id_problem_of(value)  # the id rule: no sign, leading zero, overflow or negative id
        if problem:
            raise source.error(row, f"id {value!r} {problem}; expected {ID_EXPECTED}", column="id")
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
        raise DataError(
            source.path,
            f"{articles.height} article(s); expected at least {MIN_ARTICLES} (training needs, for every "
            "question, an article it does not cite as a negative)",
        )
    dup = first_duplicate(articles["id"].to_list())
    if dup:
        i, j = dup
        raise source.error(
            i,
            f"article id {articles['id'][i]} is already used by {source.where(j)}; expected each article id once",
            column="id",
        )


def article_ids_of(value: Any, source: Source, index: int, corpus: Source) -> list[int]:
    """A question's ``article_ids`` cell, parsed as clean parses it; errors name the source row."""
    try:
        return parse_article_ids(value)
    except ValueError as exc:
        raise source.error(
            index, f"{exc}; expected a comma-separated list of integer ids of {corpus.path}", column="article_ids"
        ) from None


def validate_questions(
    questions: dict[str, tuple[pl.DataFrame, Source]],
    article_ids: set[int],
    corpus: Source,
    names: dict[int, str] | None = None,
) -> None:
    """Question texts are not empty, ``article_ids`` are integers of the corpus that leave at
    least one article uncited, and question ids are unique across the train, dev and test questions.
    ``names``: the user's id of each question (``fetch.source: corpus``), named instead of lexgraph's."""
    for df, source in questions.values():
        for i, (qid, text, cited) in enumerate(df.select("id", "question", "article_ids").iter_rows()):
            qid = repr(names[qid]) if names is not None else qid
            if not " ".join(unicodedata.normalize("NFC", text or "").split()):
                raise source.error(i, f"question {qid} has no text; expected the question", column="question")
            ids = article_ids_of(cited, source, i, corpus)
            unknown = [a for a in dict.fromkeys(ids) if a not in article_ids]
            if unknown:
                raise source.error(
                    i,
                    f"question {qid} cites article id(s) {unknown} that are not in {corpus.path}; "
                    f"expected ids of its 'id' column",
                    column="article_ids",
                )
            if len(set(ids)) >= len(article_ids):
                raise source.error(
                    i,
                    f"question {qid} cites all {len(article_ids)} articles of {corpus.path}; expected a question "
                    "that leaves at least one article uncited (training needs a negative)",
                    column="article_ids",
                )
    seen: dict[int, tuple[Source, int]] = {}
    for split in HUMAN_SPLITS:
        if split not in questions:
            continue
        df, source = questions[split]
        for i, qid in enumerate(df["id"].to_list()):
            if qid in seen:
                other, j = seen[qid]
                raise source.error(
                    i,
                    f"question id {qid} is already used by {other.where(j)}; expected each question id once "
                    "across the train, dev and test questions",
                    column="id",
                )
            seen[qid] = (source, i)


def _negatives_from_json(obj: Any, split: str, path: Any) -> pl.DataFrame:
    """BM25 negatives, either ``{qid: [ids]}`` or a list of ``{question_id|id, article_ids|negatives}``."""
    rows: list[tuple[int, list[int]]] = []
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, list):
        items = []
        for i, rec in enumerate(obj, 1):
            if not isinstance(rec, dict):
                raise DataError(path, "expected a JSON object with keys question_id and article_ids", row=i)
            qid = next((rec[k] for k in ("question_id", "id", "qid") if k in rec), None)
            ids = next((rec[k] for k in ("article_ids", "negatives", "negative_ids") if k in rec), None)
            if qid is None or ids is None:
                raise DataError(path, "expected keys question_id and article_ids (or negatives)", row=i)
            items.append((qid, ids))
    else:
        raise DataError(path, "expected a JSON object {question_id: [article ids]} or a list of records")
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
    except DuplicateKeyError as exc:
        raise DataError(label, str(exc)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(label, f"not valid UTF-8 JSON ({exc})") from exc
    return _negatives_from_json(obj, split, label)


def empty_negatives() -> pl.DataFrame:
    return pl.DataFrame(schema=NEGATIVES_SCHEMA)
