"""Integrity rules for the data ``fetch`` reads and ``clean`` checks again on ``data/raw``.

* CSV layout (:func:`csv_layout`, :func:`check_csv_layout`): the header names each column
  once and is comma-separated, and every row has as many fields as the header (polars would
  read a repeated ``id`` as ``id_duplicated_0``, refuse a longer row with advice about its own
  options and fill a shorter one with empty cells);
* column names of a table read by the hub's CSV reader (:func:`duplicated_column`): pandas
  renames a repeated ``id`` to ``id.1``;
* identifiers (:func:`integer_id`; :func:`lexgraph.core.inputs.id_problem` for id cells): ids are
  written into whitespace-separated TREC runs, so whitespace, control characters (NUL
  included) and lone surrogates are refused, not stripped or read past;
* question texts across splits (:func:`question_key`, :func:`refuse_shared_texts`): a
  question of one of the train, dev and test splits whose text is also a question of
  another is train → test leakage. Texts are compared by :func:`question_key`: Unicode NFKC
  (``ﬁ`` is ``fi``), casefolded, punctuation ignored and spacing collapsed, so "Qui paie le
  mur ?" and "qui paie le mur" are the same question. Synthetic questions are not compared
  (they are generated, and never evaluated).
* question ids across every split, synthetic included (:func:`synthetic_offset`,
  :func:`refuse_shared_ids`): the hub numbers its synthetic questions 1..N, over the human
  ids, so ``fetch`` moves them past the largest human id (by one offset, decided by the
  sets of ids alone, never by the order the splits arrive in) and then checks that no id
  is used twice; ``clean`` checks it again.

Each check raises :class:`lexgraph.core.errors.DataError` naming the file the user edits.
"""

from __future__ import annotations

import csv
import io
import logging
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lexgraph.core.errors import DataError
from lexgraph.core.inputs import id_problem
from lexgraph.data.schema import ID_EXPECTED, id_problem_of

log = logging.getLogger(__name__)

#: question splits whose ids are unique together and whose texts must not repeat across them
HUMAN_SPLITS = ("train", "dev", "test")

SHARED_TEXT_RULE = (
    "expected each question text in only one of the train, dev and test splits (texts compared "
    "NFKC-normalised and casefolded, punctuation and spacing ignored)"
)


# --------------------------------------------------------------------------- CSV layout


@dataclass(frozen=True)
class CsvLayout:
    """The records of a CSV text: its header, and for each record after it the line it starts
    on and its number of fields (0 for a blank line)."""

    header: tuple[str, ...]
    starts: tuple[int, ...]
    widths: tuple[int, ...]

    def row_lines(self, height: int) -> tuple[int, ...] | None:
        """The line on which each of the ``height`` rows of the parsed table starts, or None if
        the records do not match the table's rows (with or without the blank lines)."""
        if len(self.starts) == height:
            return self.starts
        kept = tuple(line for line, width in zip(self.starts, self.widths) if width)
        return kept if len(kept) == height else None


def csv_layout(text: str) -> CsvLayout | None:
    """The :class:`CsvLayout` of ``text``, or None if Python's CSV reader cannot parse it."""
    reader = csv.reader(io.StringIO(text, newline=""))
    header: list[str] | None = None
    starts, widths, end = [], [], 0
    try:
        for record in reader:
            if header is None:
                header = record
            else:
                starts.append(end + 1)
                widths.append(len(record))
            end = reader.line_num
    except csv.Error:
        return None
    return None if header is None else CsvLayout(tuple(header), tuple(starts), tuple(widths))


def expected_columns(required: tuple[str, ...], columns: tuple[str, ...]) -> str:
    optional = [c for c in columns if c not in required]
    return f"expected comma-separated columns {', '.join(required)}" + (
        f" and optionally {', '.join(optional)}" if optional else ""
    )


def check_csv_layout(path: Path, layout: CsvLayout, required: tuple[str, ...], columns: tuple[str, ...]) -> None:
    """Refuse a header that repeats a column or is not comma-separated, and a row whose number
    of fields differs from the header's (blank lines are left to the id check)."""
    seen: dict[str, int] = {}
    for n, name in enumerate(layout.header, 1):
        if name in seen:
            raise DataError(
                path,
                f"column {name!r} appears twice in the header (columns {seen[name]} and {n}); "
                "expected each column once",
            )
        seen[name] = n
    expected = expected_columns(required, columns)
    if len(layout.header) == 1 and len(required) > 1:
        raise DataError(
            path, f"the header {layout.header[0]!r} is a single column, so the file is not comma-separated; {expected}"
        )
    for i, (line, width) in enumerate(zip(layout.starts, layout.widths)):
        if width and width != len(layout.header):
            raise DataError(
                path,
                f"{width} fields where the header has {len(layout.header)}; {expected} (a value "
                f"holding a comma must be quoted) (row {i + 1} starts on line {line})",
                row=i + 1,
            )


def duplicated_column(columns: list[str]) -> tuple[str, str] | None:
    """``(name, renamed)`` for a column that a reader renamed because the header repeats it
    (pandas: ``id.1``, polars: ``id_duplicated_0``), or None."""
    for name in columns:
        match = re.fullmatch(r"(.+?)(?:\.\d+|_duplicated_\d+)", name)
        if match and match.group(1) in columns:
            return match.group(1), name
    return None


# --------------------------------------------------------------------------- ids


def integer_id(value: Any) -> int:
    """An id read from JSON: an integer, or a string of digits 0-9, either within the id rule
    (:func:`lexgraph.data.schema.id_problem_of`; :class:`ValueError` with the reason otherwise:
    ``" 7"``, ``"7\\x00"``, ``"+7"``, ``-1``, ``2**63``, ``7.5`` and ``true`` are refused, not read
    as 7, -1 or 1)."""
    if isinstance(value, int) and not isinstance(value, bool):
        problem = id_problem_of(str(value))
        if problem:
            raise ValueError(f"id {value} {problem}; expected {ID_EXPECTED}")
        return value
    if isinstance(value, str):
        problem = id_problem(value)
        if problem:
            raise ValueError(f"id {value!r} {problem}")
        problem = id_problem_of(value)
        if problem is None:
            return int(value)
        if problem != "is not an integer":
            raise ValueError(f"id {value!r} {problem}; expected {ID_EXPECTED}")
    raise ValueError(f"{value!r} is not an integer id")


# --------------------------------------------------------------------------- question texts


def question_key(text: str | None, form: str = "NFKC") -> str:
    """The text two questions share when they are the same question: Unicode normal form
    ``form`` (NFKC), casefolded, punctuation as spaces, spacing collapsed."""
    text = unicodedata.normalize(form, text or "").casefold()
    return " ".join("".join(ch if ch.isalnum() else " " for ch in text).split())


def shared_text(questions: Iterable[tuple[str, str]]) -> tuple[int, int] | None:
    """For ``(split, text)`` pairs, ``(index, earlier index)`` of the first question whose
    :func:`question_key` is that of an earlier question of another split, or None."""
    first: dict[str, tuple[str, int]] = {}
    for i, (split, text) in enumerate(questions):
        key = question_key(text)
        if key in first and first[key][0] != split:
            return i, first[key][1]
        first.setdefault(key, (split, i))
    return None


def refuse_shared_texts(
    questions: dict[str, Any], rows: dict[int, tuple[Any, int]], names: dict[int, str] | None = None
) -> None:
    """No question text in two of the train, dev and test splits (after the dev split is
    assigned, carved or not). ``questions``: split → table with ``id`` and ``question``;
    ``rows``: question id → (the :class:`~lexgraph.data.readers.Source` it was read from, its
    0-based row there), so the error names the file and row the user edits; ``names``: the
    user's id of each question (``fetch.source: corpus``), named instead of lexgraph's."""
    items = [
        (split, qid, text)
        for split in HUMAN_SPLITS
        if split in questions
        for qid, text in questions[split].select("id", "question").iter_rows()
    ]
    hit = shared_text((split, text) for split, _, text in items)
    if hit is None:
        return
    (split, qid, _), (other_split, other_qid, _) = items[hit[0]], items[hit[1]]
    (source, i), (other, j) = rows[qid], rows[other_qid]
    if names is not None:
        qid, other_qid = repr(names[qid]), repr(names[other_qid])
    raise source.error(
        i,
        f"question {qid} ({split}) has the same text as question {other_qid} ({other_split}, "
        f"{other.where(j)}); {SHARED_TEXT_RULE}",
        column="question",
    )


# --------------------------------------------------------------------------- question ids


def synthetic_offset(human_ids: Iterable[int], synthetic_ids: Iterable[int]) -> int:
    """What ``fetch`` adds to every synthetic question id: 0 when no synthetic id is also a
    train, dev or test id; otherwise ``max(human ids) + 1 - min(0, min(synthetic ids))``,
    which moves every synthetic id past the largest human one (hub ids 1..N become
    ``max + 2 .. max + N + 1``). A function of the two id sets only."""
    human, synthetic = set(human_ids), set(synthetic_ids)
    if not human & synthetic:
        return 0
    return max(human) + 1 - min(0, min(synthetic))


def first_duplicate(ids: list[int]) -> tuple[int, int] | None:
    """``(index, index of its first occurrence)`` of the first repeated id, or None."""
    seen: dict[int, int] = {}
    for i, value in enumerate(ids):
        if value in seen:
            return i, seen[value]
        seen[value] = i
    return None


def renumber_synthetic(sources: dict[str, tuple[Any, Any]], negatives):
    """Move the synthetic question ids past the human ones when they overlap (in ``sources``,
    in place) and the synthetic negatives' ``question_id`` with them; return the negatives.
    A synthetic id used twice is refused first (the negatives could not tell them apart).
    ``sources[split]`` is ``(table, lexgraph.data.readers.Source)``."""
    import polars as pl

    if "synthetic" not in sources:
        return negatives
    df, source = sources["synthetic"]
    ids = df["id"].to_list()
    dup = first_duplicate(ids)
    if dup:
        i, j = dup
        raise source.error(
            i,
            f"question id {ids[i]} is already used by {source.where(j)}; expected each synthetic question id once",
            column="id",
        )
    human = [qid for split, (frame, _) in sources.items() if split in HUMAN_SPLITS for qid in frame["id"].to_list()]
    offset = synthetic_offset(human, ids)
    if offset:
        log.info(
            "%s: synthetic question ids overlap the human ones; every synthetic id is renumbered as its id + %d "
            "(its BM25 negatives with it)",
            source.path,
            offset,
        )
        sources["synthetic"] = df.with_columns(pl.col("id") + offset), source
        negatives = negatives.with_columns(
            pl.when(pl.col("split") == "synthetic")
            .then(pl.col("question_id") + offset)
            .otherwise(pl.col("question_id"))
            .alias("question_id")
        )
    return negatives


def refuse_shared_ids(table, source: str) -> None:
    """No question id in two rows of the fetched table (to be written at ``source``), whatever their splits."""
    hit = first_duplicate(table["id"].to_list())
    if hit:
        i, j = hit
        qid, split, other = table["id"][i], table["split"][i], table["split"][j]
        raise DataError(
            source,
            f"question id {qid} ({split}) is also the id of a {other} "
            "question; expected each question id once across every split, synthetic included",
            row=i + 1,
            column="id",
        )
