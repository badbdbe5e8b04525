"""Integrity rules for the data ``fetch`` reads and ``clean`` checks again on ``data/raw``.

* CSV layout (:func:`csv_layout`, :func:`layout_problem`): the header names each column
  once and is comma-separated, and every row has as many fields as the header (polars would
  read a repeated ``id`` as ``id_duplicated_0``, refuse a longer row with advice about its own
  options and fill a shorter one with empty cells);
* column names of a table read by the hub's CSV reader (:func:`duplicated_column`): pandas
  renames a repeated ``id`` to ``id.1``;
* identifiers (:func:`id_cell_problem`, :func:`integer_id`): ids are
  written into whitespace-separated TREC runs, so whitespace, control characters (NUL
  included) and lone surrogates are refused, not stripped or read past;
* question texts across splits (:func:`question_key`, :func:`refuse_shared_texts`): a
  question of one of the train, dev and test splits whose text is also a question of
  another is train → test leakage. Texts are compared by :func:`question_key`: Unicode NFKC
  (``ﬁ`` is ``fi``), casefolded, punctuation ignored and spacing collapsed, so "Qui paie le
  mur ?" and "qui paie le mur" are the same question. Synthetic questions are not compared
  (they are generated, and never evaluated).
* question ids across every split, synthetic included (:func:`synthetic_offset`,
  :func:`renumber_synthetic`): the hub numbers its synthetic questions 1..N, over the human
  ids, so ``fetch`` moves them past the largest human id (by one offset, decided by the
  sets of ids alone, never by the order the splits arrive in), the human ids being unique
  across train, dev and test (:func:`lexgraph.data.readers.validate_questions`) and the
  synthetic ones among themselves; ``clean`` checks it again.

Each check raises :class:`lexgraph.core.errors.DataError` naming the file the user edits, at the
row of its :class:`Source`; a value that repeats an earlier one (an id, a question text) is
refused by one rule, :func:`refuse_repeat`, at the later row, naming the earlier.
"""

from __future__ import annotations

import csv
import io
import logging
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from lexgraph.core.errors import DataError
from lexgraph.core.inputs import id_problem
from lexgraph.data.schema import ID_EXPECTED, id_problem_of

log = logging.getLogger(__name__)

#: question splits whose ids are unique together and whose texts must not repeat across them
HUMAN_SPLITS = ("train", "dev", "test")

#: what a header that repeats a column is told
ONCE = "expected each column once"
SHARED_TEXT_RULE = (
    "expected each question text in only one of the train, dev and test splits (texts compared "
    "NFKC-normalised and casefolded, punctuation and spacing ignored)"
)


# --------------------------------------------------------------------------- rows


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


def first_duplicate(ids: Sequence) -> tuple[int, int] | None:
    """``(index, index of its first occurrence)`` of the first repeated id, or None."""
    seen: dict[Any, int] = {}
    for i, value in enumerate(ids):
        if value in seen:
            return i, seen[value]
        seen[value] = i
    return None


def refuse_repeat(
    hit: tuple[int, int] | None,
    places: Source | Sequence[tuple[Source, int]],
    said: Callable[[int, int, str], str],
    column: str = "id",
) -> None:
    """The one rule for a value that must not repeat (an id, a question text across splits):
    ``hit`` is ``(n, m)``, item ``n`` repeating the earlier item ``m`` (:func:`first_duplicate`,
    :func:`shared_text`), or None. Refused at item ``n``'s row: ``places`` is the :class:`Source`
    whose row ``n`` item ``n`` is, or ``places[n]`` its ``(Source, 0-based row)``; the message is
    ``said(n, m, where)``, ``where`` naming item ``m``'s row (``row 3 of questions_dev.csv (line 4)``)."""
    if hit:
        (source, i), (other, j) = ((places, n) if isinstance(places, Source) else places[n] for n in hit)
        raise source.error(i, said(*hit, other.where(j)), column=column)


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


def layout_problems(layout: CsvLayout | None, required: tuple[str, ...], columns: tuple[str, ...]) -> Iterator[tuple]:
    """``(message, 1-based row or None)`` for a header that repeats a column or is not
    comma-separated, then for each row whose number of fields differs from the header's (blank
    lines are left to the id check); none for no layout (a text Python's CSV reader cannot
    parse: polars' reader words it)."""
    if layout is None:
        return
    first: dict[str, int] = {}
    for n, name in enumerate(layout.header, 1):
        if first.setdefault(name, n) != n:
            yield f"column {name!r} appears twice in the header (columns {first[name]} and {n}); {ONCE}", None
    expected = expected_columns(required, columns)
    if len(layout.header) == 1 and len(required) > 1:
        yield (
            f"the header {layout.header[0]!r} is a single column, so the file is not comma-separated; {expected}",
            None,
        )
    for i, (line, width) in enumerate(zip(layout.starts, layout.widths)):
        if width and width != len(layout.header):
            yield (
                f"{width} fields where the header has {len(layout.header)}; {expected} (a value "
                f"holding a comma must be quoted) (row {i + 1} starts on line {line})",
                i + 1,
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


def id_cell_problem(text: str) -> str | None:
    """Why ``text`` (an id as written in a file, or a JSON integer as text) is no id, ending with
    what was expected, or None: whitespace, control characters and lone surrogates
    (:func:`lexgraph.core.inputs.id_problem`), then the id rule (:func:`lexgraph.data.schema.id_problem_of`:
    no sign, leading zero, overflow or negative id)."""
    problem = id_problem(text)
    if problem:
        return f"{problem}; expected an integer id"
    problem = id_problem_of(text)
    return None if problem is None else f"{problem}; expected {ID_EXPECTED}"


def integer_id(value: Any) -> int:
    """An id read from JSON: an integer, or a string of digits 0-9, either within the id rule
    (:func:`id_cell_problem`; :class:`ValueError` with the reason otherwise: ``" 7"``,
    ``"7\\x00"``, ``"+7"``, ``-1``, ``2**63``, ``7.5`` and ``true`` are refused, not read as 7, -1
    or 1)."""
    integral = isinstance(value, int) and not isinstance(value, bool)
    problem = (
        id_cell_problem(str(value))
        if integral or isinstance(value, str)
        else f"is not an integer; expected {ID_EXPECTED}"
    )
    if problem:
        raise ValueError(f"id {value!r} {problem}")
    return int(value)


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
    questions: dict[str, Any], rows: dict[int, tuple[Source, int]], names: dict[int, str] | None = None
) -> None:
    """No question text in two of the train, dev and test splits (after the dev split is
    assigned, carved or not). ``questions``: split → table with ``id`` and ``question``;
    ``rows``: question id → (the :class:`Source` it was read from, its 0-based row there), so
    the error names the file and row the user edits; ``names``: the user's id of each question
    (``fetch.source: corpus``), named instead of lexgraph's."""
    items = [
        (split, qid, text)
        for split in HUMAN_SPLITS
        if split in questions
        for qid, text in questions[split].select("id", "question").iter_rows()
    ]

    def said(n: int, m: int, where: str) -> str:
        (split, qid, _), (other_split, other_qid, _) = items[n], items[m]
        if names is not None:
            qid, other_qid = repr(names[qid]), repr(names[other_qid])
        same = f"question {qid} ({split}) has the same text as question {other_qid} ({other_split}, {where})"
        return f"{same}; {SHARED_TEXT_RULE}"

    hit = shared_text((split, text) for split, _, text in items)
    refuse_repeat(hit, [rows[qid] for _, qid, _ in items], said, column="question")


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


def renumber_synthetic(sources: dict[str, tuple[Any, Source]], negatives):
    """Move the synthetic question ids past the human ones when they overlap (in ``sources``,
    in place) and the synthetic negatives' ``question_id`` with them; return the negatives.
    A synthetic id used twice is refused first (the negatives could not tell them apart).
    ``sources[split]`` is ``(table, Source)``."""
    import polars as pl

    if "synthetic" not in sources:
        return negatives
    df, source = sources["synthetic"]
    ids = df["id"].to_list()
    refuse_repeat(
        first_duplicate(ids),
        source,
        lambda n, _, where: (
            f"question id {ids[n]} is already used by {where}; expected each synthetic question id once"
        ),
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
