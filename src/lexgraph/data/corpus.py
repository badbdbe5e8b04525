"""The field's corpus format (``fetch.source: corpus``): a JSON-lines, CSV or Parquet file of
articles and, optionally, one of questions, read into BSARD's raw schema.

Corpus, one record per article:

- ``id``: the article's id, a string (a JSON integer is read as its decimal string), non-empty,
  without whitespace or control characters (it is written into TREC runs), each id once (or once per version);
- ``text``: the article's text, not empty;
- ``path``: the heading labels from the top, a list of strings of any depth (``[]``: no heading);
  in a CSV file a JSON array (``["Livre I", "Titre II"]``);
- optional ``number`` (as printed), ``title`` and ``code`` (the code or act it belongs to);
- optional ``valid_from``, ``valid_to`` (ISO dates ``YYYY-MM-DD``; ``valid_to`` is the first day the
  version no longer applies) and ``act`` (the act that made it): one version of the article
  (:mod:`lexgraph.data.versions`). Records of one id are the versions of one article, their
  intervals not overlapping; ``lexgraph index`` keeps each, the pipeline (``fetch``) one state.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from lexgraph.core.errors import DataError
from lexgraph.core.hub import first_line
from lexgraph.core.inputs import id_problem, text_problem
from lexgraph.data.integrity import first_duplicate, refuse_repeat
from lexgraph.data.keys import keys_table
from lexgraph.data.readers import Source, file_problem, json_line, validate_articles
from lexgraph.data.schema import ARTICLE_COLUMNS, HIERARCHY_LEVELS, QUESTION_COLUMNS
from lexgraph.data.versions import DATE_FIELDS, VERSION_FIELDS, date_problem, first_undated_repeat, overlapping

log = logging.getLogger(__name__)

#: BSARD's heading columns below ``code``, from the top, that a path fills in order
LEVEL_COLUMNS: tuple[str, ...] = HIERARCHY_LEVELS[2:]
OPTIONAL_ARTICLE_FIELDS: tuple[str, ...] = ("number", "title", "code")
QUESTION_SPLITS: tuple[str, ...] = ("train", "dev", "test")
#: the list fields, which a CSV file writes as JSON arrays
LIST_FIELDS = ("path", "article_ids")


# --------------------------------------------------------------------------- files


def _jsonl_records(path: Path):
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if line.strip():
                yield line_no, json_line(path, line_no, line)


def _table_records(df: pl.DataFrame, first_line: int):
    lists = [c for c in LIST_FIELDS if c in df.columns and df.schema[c] == pl.Utf8]
    for i, rec in enumerate(df.iter_rows(named=True)):
        for column in lists:  # CSV: a JSON array in the cell
            try:
                rec[column] = json.loads(rec[column]) if rec[column] is not None else None
            except json.JSONDecodeError:
                pass  # left a string: refused as "not a list" with its row
        yield i + first_line, rec


#: the files read, by how their names end: (suffixes, what such a file must be, its (line, record) pairs)
FORMATS = (
    ((".jsonl", ".jsonl.gz", ".ndjson", ".json"), "a UTF-8 JSON-lines file", _jsonl_records),
    ((".csv",), "a UTF-8 CSV file", lambda path: _table_records(pl.read_csv(path, infer_schema=False), 2)),
    ((".parquet",), "a Parquet file", lambda path: _table_records(pl.read_parquet(path), 1)),
)
FORMAT_SUFFIXES = tuple(suffix for suffixes, _, _ in FORMATS for suffix in suffixes)


def read_records(path: Path) -> tuple[list[dict[str, Any]], Source]:
    """The records of a JSON-lines (``.jsonl``, ``.jsonl.gz``), CSV or Parquet file, with the
    :class:`Source` whose lines name each record's line (the Parquet row otherwise)."""
    form = next((f for f in FORMATS if path.name.lower().endswith(f[0])), None)
    problem = file_problem(path) or (None if form else f"its name ends in none of {', '.join(FORMAT_SUFFIXES)}")
    if problem:  # a directory, a pipe, /dev/null: said as what it is
        raise DataError(path, f"{problem}; expected a JSON-lines, CSV or Parquet file")
    suffixes, expected, records_of = form
    try:
        pairs = list(records_of(path))
    except (UnicodeDecodeError, OSError, EOFError, pl.exceptions.PolarsError) as exc:  # EOFError: a truncated .gz
        raise DataError(path, f"not readable ({first_line(exc)}); expected {expected}") from None
    if not pairs:
        raise DataError(path, "no records; expected at least one")
    lines = tuple(n for n, _ in pairs) if suffixes != (".parquet",) else None
    return [rec for _, rec in pairs], Source(path, lines)


# --------------------------------------------------------------------------- fields

#: a field's rule: (record, field, the record as messages name it) -> what is wrong with the field, or None
Rule = Callable[[dict, str, str], str | None]


def _as_key(value: Any) -> Any:
    """A record's id as the user's key: a JSON integer is read as its decimal string."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _unicode(value: Any, what: str) -> str | None:
    """A text that cannot be stored as UTF-8 (a lone surrogate such as ``"\\udc80"``, which a JSON
    escape gives) is refused."""
    problem = text_problem(value) if isinstance(value, str) else None
    return f"{what} {problem}; expected valid Unicode text" if problem else None


def _found(rec: dict, field: str) -> str:
    value = rec.get(field)
    return "missing" if field not in rec else f"a {type(value).__name__} ({value!r:.60})"


def _text(rec: dict, field: str, what: str) -> str | None:
    value = rec.get(field)
    if not isinstance(value, str) or not value.strip():
        found = "missing" if field not in rec else f"{value!r}"
        return f"{what} has no {field} ({found}); expected a non-empty string"
    return _unicode(value, f"the {field} of {what}")


def _path(rec: dict, field: str, what: str) -> str | None:
    labels = rec.get(field)
    if not isinstance(labels, list):
        return f"path is {_found(rec, field)}; expected a list of heading labels from the top (may be empty)"
    problems = (
        f"path holds {label!r}; expected non-empty heading labels"
        if not isinstance(label, str) or not label.strip()
        else _unicode(label, f"heading {n} of the path")
        for n, label in enumerate(labels, 1)
    )
    return next(filter(None, problems), None)


def _optional(rec: dict, field: str, what: str) -> str | None:
    value = rec.get(field)
    if value is not None and not isinstance(value, (str, int)):
        return f"{field} is a {type(value).__name__}; expected a string or nothing"
    return _unicode(value, f"the {field}")


def _cited(article_of: dict[str, int], corpus: Any) -> Rule:
    """The rule of a question's ``article_ids``: a non-empty list of ids of ``corpus``'s articles."""

    def rule(rec: dict, field: str, what: str) -> str | None:
        cited = rec.get(field)
        if not isinstance(cited, list):
            return f"{field} is {_found(rec, field)}; expected a list of article ids of {corpus}"
        if not cited:
            return f"{what} cites no article; expected at least one"
        unknown = [v for v in cited if not isinstance(v, (str, int)) or str(v) not in article_of]
        return f"{what} cites article id {unknown[0]!r}, which is not in {corpus}" if unknown else None

    return rule


def _split(rec: dict, field: str, what: str) -> str | None:
    split = rec.get(field)
    return None if split in QUESTION_SPLITS else f"split {split!r}; expected one of {', '.join(QUESTION_SPLITS)}"


def _date(rec: dict, field: str, what: str) -> str | None:
    """An optional date of a version (:mod:`lexgraph.data.versions`); ``valid_to`` after ``valid_from``."""
    value = rec.get(field)
    if value is None:
        return None
    problem = date_problem(value)
    if problem:
        return f"{field} {problem}; expected a date YYYY-MM-DD or nothing"
    start = rec.get("valid_from")
    if field == "valid_to" and isinstance(start, str) and not date_problem(start) and value <= start:
        return f"valid_to {value} is not after valid_from {start}; expected the first day the version no longer applies"
    return None


ARTICLE_RULES: tuple[tuple[str, Rule], ...] = (
    ("text", _text),
    ("path", _path),
    *((field, _optional) for field in OPTIONAL_ARTICLE_FIELDS),
    *((field, _date) for field in DATE_FIELDS),
    ("act", _optional),
)


def _id(key: Any, kind: str) -> str | None:
    if not isinstance(key, str):
        return f"{kind} id {key!r} is not a string; expected a string id"
    problem = id_problem(key)
    return f"{kind} id {key!r} {problem}; expected an id without whitespace" if problem else None


def _span(rec: dict) -> tuple[str | None, str | None]:
    return rec.get("valid_from"), rec.get("valid_to")


def _repeat(kind: str, key: str, span, other, where: str) -> str:
    """Why record ``key`` (dates ``span``) may not repeat the id of ``where`` (dates ``other``)."""
    if span == (None, None) and other == (None, None):
        return f"{kind} id {key!r} is already used by {where}; expected each id once"
    return (
        f"{kind} id {key!r} is already used by {where}, one of them without valid_from or valid_to; expected each id "
        "once, or versions of one id, each with its dates"
    )


def _checked(records: list[dict], source: Source, kind: str, rules: tuple[tuple[str, Rule], ...]) -> list[str]:
    """The user's id of each record, after every record's fields passed their rules (``id`` first)
    and no id repeats an earlier one but as another dated version
    (:func:`lexgraph.data.versions.first_undated_repeat`: a question has none); refused otherwise, naming
    the record and the field."""
    keys = [_as_key(rec.get("id")) for rec in records]
    for i, (rec, key) in enumerate(zip(records, keys)):
        problems = (("id", _id(key, kind)), *((field, rule(rec, field, f"{kind} {key!r}")) for field, rule in rules))
        field, problem = next(((f, p) for f, p in problems if p), (None, None))
        if problem:
            raise source.error(i, problem, column=field)
    spans = [_span(rec) for rec in records]
    refuse_repeat(
        first_undated_repeat(keys, spans),
        source,
        lambda n, m, where: _repeat(kind, keys[n], spans[n], spans[m], where),
    )
    shared = overlapping(keys, spans)
    if shared:
        log.info(
            "%s: %d versions share days with an earlier version of their article; on those days the one that "
            "began later is in force",
            source.path,
            shared,
        )
    return keys


# --------------------------------------------------------------------------- tables


def _article_row(rec: dict, i: int, key: str) -> dict[str, Any]:
    labels = rec["path"]
    values = (rec.get(field) for field in OPTIONAL_ARTICLE_FIELDS)
    number, title, code = (None if v is None or str(v).strip() == "" else str(v) for v in values)
    row: dict[str, Any] = {c: None for c in (*ARTICLE_COLUMNS, "path")}
    row.update(id=i, article=rec["text"], code=code, path=labels)
    n = len(LEVEL_COLUMNS)
    for column, label in zip(LEVEL_COLUMNS, labels[: n - 1]):
        row[column] = label
    if len(labels) >= n:
        row[LEVEL_COLUMNS[-1]] = " / ".join(labels[n - 1 :])
    name = f"Art. {number}" if number else key
    row["reference"] = ", ".join(x for x in (name, title, code) if x)
    row["description"] = " > ".join([*([code] if code else []), *labels])
    return row


def read_corpus(path: Path) -> tuple[pl.DataFrame, Source, list[str], list[tuple] | None]:
    """The corpus file as BSARD's raw articles table (ids 0..n-1, at least ``MIN_ARTICLES``), its
    :class:`Source`, the user's id of each row and, when a record has one of
    :data:`~lexgraph.data.versions.VERSION_FIELDS`, each row's ``(valid_from, valid_to, act)`` (else None)."""
    records, source = read_records(path)
    keys = _checked(records, source, "article", ARTICLE_RULES)
    schema = {c: (pl.Int64 if c == "id" else pl.Utf8) for c in ARTICLE_COLUMNS} | {"path": pl.List(pl.Utf8)}
    rows = [_article_row(rec, i, key) for i, (rec, key) in enumerate(zip(records, keys))]
    articles = pl.DataFrame(rows, schema=schema, orient="row")
    validate_articles(articles, source)
    versioned = any(field in rec for rec in records for field in VERSION_FIELDS)
    versions = [tuple(rec.get(f) for f in VERSION_FIELDS) for rec in records] if versioned else None
    return articles, source, keys, versions


def read_questions(path: Path, article_of: dict[str, int], corpus: Path) -> tuple[dict, list[str]]:
    """The questions file as ``{split: (BSARD questions table, Source)}`` (ids 0..m-1, in file
    order) and the user's id of each question."""
    records, source = read_records(path)
    rules = (("question", _text), ("article_ids", _cited(article_of, corpus)), ("split", _split))
    keys = _checked(records, source, "question", rules)
    rows: dict[str, list[dict]] = {}
    lines: dict[str, list[int | None]] = {}
    file_rows: dict[str, list[int]] = {}
    for i, rec in enumerate(records):
        row = {c: None for c in QUESTION_COLUMNS}
        row.update(
            id=i, question=rec["question"], article_ids=",".join(str(article_of[str(v)]) for v in rec["article_ids"])
        )
        rows.setdefault(rec["split"], []).append(row)
        lines.setdefault(rec["split"], []).append(source.line(i))
        file_rows.setdefault(rec["split"], []).append(i + 1)
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


def read_corpus_source(corpus: Path, questions: Path):
    """``fetch.source: corpus``: (articles, {split: (questions, Source)}, keys); the questions
    hold train and test ones (the pipeline needs both)."""
    articles, source, article_keys, versions = read_corpus(corpus)
    repeated = first_duplicate(article_keys)
    if repeated:  # questions cite an article, not one of its versions
        raise source.error(
            repeated[0],
            f"article id {article_keys[repeated[0]]!r} has several versions (as record {repeated[1] + 1}); "
            "the pipeline evaluates one state of the law: expected each id once (the articles in force on one "
            "date), or "
            "`lexgraph index` to search the versions",
            column="id",
        )
    sources, question_keys = read_questions(questions, {k: i for i, k in enumerate(article_keys)}, source.path)
    missing = [split for split in ("train", "test") if split not in sources]
    if missing:
        raise DataError(questions, f"no {missing[0]} question; expected questions with split {missing[0]!r}")
    counts = {split: df.height for split, (df, _) in sources.items()}
    log.info("corpus %s: %d articles; questions %s", corpus, articles.height, counts)
    return articles, sources, keys_table(article_keys, question_keys, versions)
