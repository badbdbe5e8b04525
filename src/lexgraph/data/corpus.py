"""The field's corpus format (``fetch.source: corpus``): a JSON-lines, CSV or Parquet file of
articles and, optionally, one of questions, read into BSARD's raw schema.

Corpus, one record per article:

- ``id``: the article's id, a string (a JSON integer is read as its decimal string), non-empty,
  without whitespace or control characters (it is written into TREC runs), each id once;
- ``text``: the article's text, not empty;
- ``path``: the heading labels from the top, a list of strings of any depth (``[]``: no heading);
  in a CSV file a JSON array (``["Livre I", "Titre II"]``);
- optional ``number`` (as printed), ``title`` and ``code`` (the code or act it belongs to).

Questions, one record per question: ``id`` (a string, as above), ``question``, ``article_ids``
(a list of corpus ids; in CSV a JSON array), ``split`` (``train``, ``dev`` or ``test``).

lexgraph keeps integer ids inside (search pads with ``-1``; arrays are int64): the n-th article
(the n-th question) of the file gets id n - 1, and :func:`read_corpus_source` returns the
table of the user's ids (``kind``, ``id``, ``key``) that ``fetch`` writes to
``data/raw/keys.parquet`` and ``clean`` carries to ``data/clean/keys.parquet``.

The raw articles table adds a ``path`` column (list of str, the user's path as given), from
which ``clean`` builds the headings, at any depth, under the article's ``code``
(:func:`lexgraph.data.clean.hierarchy_path`). The path also fills BSARD's heading columns below
``code`` from the top, one level each (:data:`LEVEL_COLUMNS`), for readers of BSARD's layout; a
path deeper than those columns keeps its deepest levels in the last one, joined by ``" / "``.

Every error names the file, the 1-based record (and the line it is on) and the field.
"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

import polars as pl

from lexgraph.core.errors import DataError
from lexgraph.core.inputs import id_problem, text_problem
from lexgraph.data.keys import keys_table
from lexgraph.data.readers import Source, file_problem, json_line
from lexgraph.data.schema import ARTICLE_COLUMNS, HIERARCHY_LEVELS, MIN_ARTICLES, QUESTION_COLUMNS

log = logging.getLogger(__name__)

#: BSARD's heading columns below ``code``, from the top, that a path fills in order
LEVEL_COLUMNS: tuple[str, ...] = HIERARCHY_LEVELS[2:]
ARTICLE_FIELDS: tuple[str, ...] = ("id", "text", "path")
OPTIONAL_ARTICLE_FIELDS: tuple[str, ...] = ("number", "title", "code")
QUESTION_FIELDS: tuple[str, ...] = ("id", "question", "article_ids", "split")
QUESTION_SPLITS: tuple[str, ...] = ("train", "dev", "test")
#: the list fields, which a CSV file writes as JSON arrays
LIST_FIELDS = ("path", "article_ids")
ONE_OBJECT = "expected one JSON object a line"


def _jsonl_records(path: Path):
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for line_no, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                rec = json_line(path, line_no, line)
                if not isinstance(rec, dict):
                    raise DataError(path, f"line {line_no}: a JSON {type(rec).__name__}; {ONE_OBJECT}")
                yield line_no, rec
    except UnicodeDecodeError as exc:
        raise DataError(path, f"not valid UTF-8 ({exc.reason}); expected a UTF-8 JSON-lines file") from None
    except (OSError, EOFError) as exc:  # a damaged or truncated .gz
        raise DataError(path, f"not readable ({exc or type(exc).__name__}); expected a JSON-lines file") from None


def _table_records(path: Path, df: pl.DataFrame, first_line: int):
    lists = [c for c in LIST_FIELDS if c in df.columns and df.schema[c] == pl.Utf8]
    for i, rec in enumerate(df.iter_rows(named=True)):
        for column in lists:  # CSV: a JSON array in the cell
            try:
                rec[column] = json.loads(rec[column]) if rec[column] is not None else None
            except json.JSONDecodeError:
                pass  # left a string: refused as "not a list" with its row
        yield i + first_line, rec


def read_records(path: Path) -> tuple[list[dict[str, Any]], Source]:
    """The records of a JSON-lines (``.jsonl``, ``.jsonl.gz``), CSV or Parquet file, with the
    :class:`Source` whose lines name each record's line (the Parquet row otherwise)."""
    problem = file_problem(path)  # a directory, a pipe, /dev/null: said as what it is
    if problem:
        raise DataError(path, f"{problem}; expected a JSON-lines, CSV or Parquet file")
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson", ".json")):
        pairs = list(_jsonl_records(path))
    elif name.endswith(".csv"):
        try:
            df = pl.read_csv(path, infer_schema=False)
        except pl.exceptions.PolarsError as exc:
            raise DataError(path, f"not a readable CSV ({str(exc).splitlines()[0]})") from None
        pairs = list(_table_records(path, df, 2))
    elif name.endswith(".parquet"):
        try:
            df = pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError) as exc:
            raise DataError(path, f"not a readable Parquet file ({str(exc).splitlines()[0]})") from None
        pairs = list(_table_records(path, df, 1))
    else:
        raise DataError(path, "unknown file type; expected .jsonl, .jsonl.gz, .csv or .parquet")
    if not pairs:
        raise DataError(path, "no records; expected at least one")
    lines = tuple(n for n, _ in pairs) if not name.endswith(".parquet") else None
    return [rec for _, rec in pairs], Source(path, lines)


def _key(value: Any, source: Source, i: int, field: str, what: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise source.error(i, f"{what} {value!r} is not a string; expected a string id", column=field)
    problem = id_problem(value)
    if problem:
        raise source.error(i, f"{what} {value!r} {problem}; expected an id without whitespace", column=field)
    return value


def _unicode(value: str, field: str, source: Source, i: int, what: str) -> str:
    """``value``, refused when it cannot be stored as UTF-8 (a lone surrogate such as ``"\\udc80"``,
    which a JSON escape gives): one line naming the file, the record and the field."""
    problem = text_problem(value)
    if problem:
        raise source.error(i, f"{what} {problem}; expected valid Unicode text", column=field)
    return value


def _text(rec: dict, field: str, source: Source, i: int, what: str) -> str:
    value = rec.get(field)
    if not isinstance(value, str) or not value.strip():
        found = "missing" if field not in rec else f"{value!r}"
        raise source.error(i, f"{what} has no {field} ({found}); expected a non-empty string", column=field)
    return _unicode(value, field, source, i, f"the {field} of {what}")


def _string_list(rec: dict, field: str, source: Source, i: int, expected: str) -> list:
    value = rec.get(field)
    if not isinstance(value, list):
        found = "missing" if field not in rec else f"a {type(value).__name__} ({value!r:.60})"
        raise source.error(i, f"{field} is {found}; expected {expected}", column=field)
    return value


def _optional(rec: dict, field: str, source: Source, i: int) -> str | None:
    value = rec.get(field)
    if value is not None and not isinstance(value, (str, int)):
        raise source.error(i, f"{field} is a {type(value).__name__}; expected a string or nothing", column=field)
    if isinstance(value, str):
        _unicode(value, field, source, i, f"the {field}")
    return None if value is None or str(value).strip() == "" else str(value)


def _article_row(rec: dict, source: Source, i: int, key: str) -> dict[str, Any]:
    text = _text(rec, "text", source, i, f"article {key!r}")
    labels = _string_list(rec, "path", source, i, "a list of heading labels from the top (may be empty)")
    for n, label in enumerate(labels, 1):
        if not isinstance(label, str) or not label.strip():
            raise source.error(i, f"path holds {label!r}; expected non-empty heading labels", column="path")
        _unicode(label, "path", source, i, f"heading {n} of the path")
    number, title, code = (_optional(rec, f, source, i) for f in OPTIONAL_ARTICLE_FIELDS)
    row: dict[str, Any] = {c: None for c in (*ARTICLE_COLUMNS, "path")}
    row.update(id=i, article=text, code=code, path=labels)
    n = len(LEVEL_COLUMNS)
    for column, label in zip(LEVEL_COLUMNS, labels[: n - 1]):
        row[column] = label
    if len(labels) >= n:
        row[LEVEL_COLUMNS[-1]] = " / ".join(labels[n - 1 :])
    name = f"Art. {number}" if number else key
    row["reference"] = ", ".join(x for x in (name, title, code) if x)
    row["description"] = " > ".join([*([code] if code else []), *labels])
    return row


def read_corpus(path: Path) -> tuple[pl.DataFrame, Source, list[str]]:
    """The corpus file as BSARD's raw articles table (ids 0..n-1), its :class:`Source` and the
    user's id of each row."""
    records, source = read_records(path)
    keys: list[str] = []
    seen: dict[str, int] = {}
    rows = []
    for i, rec in enumerate(records):
        key = _unique_key(rec, source, i, seen, "article id")
        keys.append(key)
        rows.append(_article_row(rec, source, i, key))
    if len(rows) < MIN_ARTICLES:
        raise DataError(path, f"{len(rows)} article(s); expected at least {MIN_ARTICLES}")
    schema = {c: (pl.Int64 if c == "id" else pl.Utf8) for c in ARTICLE_COLUMNS} | {"path": pl.List(pl.Utf8)}
    return pl.DataFrame(rows, schema=schema, orient="row"), source, keys


def _unique_key(rec: dict, source: Source, i: int, seen: dict[str, int], what: str) -> str:
    """Record ``i``'s ``id`` as the user's string key, refused when record ``seen[key]`` has it."""
    key = _key(rec.get("id"), source, i, "id", what)
    if key in seen:
        raise source.error(
            i, f"{what} {key!r} is already used by {source.where(seen[key])}; expected each id once", "id"
        )
    seen[key] = i
    return key


def read_questions(path: Path, article_of: dict[str, int], corpus: Path) -> tuple[dict, list[str]]:
    """The questions file as ``{split: (BSARD questions table, Source)}`` (ids 0..m-1, in file
    order) and the user's id of each question."""
    records, source = read_records(path)
    rows: dict[str, list[dict]] = {}
    lines: dict[str, list[int | None]] = {}
    file_rows: dict[str, list[int]] = {}
    keys: list[str] = []
    seen: dict[str, int] = {}
    for i, rec in enumerate(records):
        key = _unique_key(rec, source, i, seen, "question id")
        question = _text(rec, "question", source, i, f"question {key!r}")
        cited = _string_list(rec, "article_ids", source, i, f"a list of article ids of {corpus}")
        if not cited:
            raise source.error(i, f"question {key!r} cites no article; expected at least one", column="article_ids")
        ids = []
        for value in cited:
            if not isinstance(value, (str, int)) or str(value) not in article_of:
                raise source.error(
                    i, f"question {key!r} cites article id {value!r}, which is not in {corpus}", column="article_ids"
                )
            ids.append(article_of[str(value)])
        split = rec.get("split")
        if split not in QUESTION_SPLITS:
            raise source.error(i, f"split {split!r}; expected one of {', '.join(QUESTION_SPLITS)}", column="split")
        row = {c: None for c in QUESTION_COLUMNS}
        row.update(id=i, question=question, article_ids=",".join(map(str, ids)))
        rows.setdefault(split, []).append(row)
        lines.setdefault(split, []).append(source.line(i))
        file_rows.setdefault(split, []).append(i + 1)
        keys.append(key)
    schema = {c: (pl.Int64 if c == "id" else pl.Utf8) for c in QUESTION_COLUMNS}
    sources = {
        split: (
            pl.DataFrame(rows[split], schema=schema, orient="row"),
            Source(path, tuple(lines[split]), tuple(file_rows[split])),  # rows named as the file's
        )
        for split in QUESTION_SPLITS
        if split in rows
    }
    return sources, keys


def read_corpus_source(corpus: Path, questions: Path | None):
    """``fetch.source: corpus``: (articles, {split: (questions, Source)}, keys)."""
    articles, source, article_keys = read_corpus(corpus)
    if questions is None:
        raise DataError(corpus, "no questions file ('fetch.questions_file'); the pipeline needs train and test ones")
    sources, question_keys = read_questions(questions, {k: i for i, k in enumerate(article_keys)}, source.path)
    for split in ("train", "test"):
        if split not in sources:
            raise DataError(questions, f"no {split} question; expected questions with split {split!r}")
    counts = {split: df.height for split, (df, _) in sources.items()}
    log.info("corpus %s: %d articles; questions %s", corpus, articles.height, counts)
    return articles, sources, keys_table(article_keys, question_keys)
