"""Build the embedded sample (``data/sample/``) from the French Code civil.

The source (a folder of the code-civil-fr corpus: ``articles.jsonl``, ``headings.json``,
``questions.jsonl``) is converted to BSARD's file layout and schema, keeping its ids
and its train/dev/test splits, so that the ``sample`` fetch source reads it with the
very code that reads a local copy of the hub.

Hierarchy mapping: an article's path has 1 to 6 levels below the code (Livre, Titre,
Sous-titre, Chapitre, Section, Sous-section, Paragraphe; BSARD has the same kind of
depth). BSARD's corpus has six heading columns below ``code``: ``book``, ``part``,
``act``, ``chapter``, ``section``, ``subsection``. :func:`map_levels` puts each level in the
column its label prefers (Livre -> book, Titre -> act, Chapitre -> chapter, ...), moved
down or up only as far as needed to keep the levels in order and leave a column for each
level below; a path deeper than six levels keeps its deepest levels in ``subsection``,
joined by " / ". Only the order of the non-empty columns matters downstream (``clean``
builds one heading per distinct path), so no level is lost or reordered. ``code`` is
"Code civil"; ``law_type`` stays empty (no synthetic root). A heading value is "<label> :
<title>", e.g. "Livre II : Des biens et des différentes modifications de la propriété",
or the label alone for a heading whose title the source does not know ("Chapitre IV").
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import polars as pl

from lexgraph.core.errors import DataError, reported
from lexgraph.core.inputs import DuplicateKeyError, json_object
from lexgraph.core.io import atomic_path
from lexgraph.data.corpus import LEVEL_COLUMNS
from lexgraph.data.integrity import integer_id
from lexgraph.data.readers import json_line
from lexgraph.data.schema import ARTICLE_COLUMNS, QUESTION_COLUMNS

log = logging.getLogger(__name__)

CODE_NAME = "Code civil"


#: the column each kind of heading label prefers (first word of the label, lower-cased)
PREFERRED_COLUMN: dict[str, str] = {
    "livre": "book",
    "partie": "part",
    "titre": "act",
    "dispositions": "act",
    "sous-titre": "chapter",
    "chapitre": "chapter",
    "section": "section",
    "sous-section": "subsection",
    "paragraphe": "subsection",
}


def map_levels(labels: list[str]) -> list[tuple[str, list[int]]]:
    """Assign the levels of a path (``labels``, from the top) to BSARD's heading columns.

    Returns ``(column, [level indices])`` pairs in column order. Each level goes to its
    preferred column, clamped so that it comes after the previous level's column and
    leaves one column for each level below it; levels past the sixth share the last
    column with the sixth.
    """
    n_cols = len(LEVEL_COLUMNS)
    out: list[tuple[str, list[int]]] = []
    prev = -1
    for i, label in enumerate(labels):
        if prev == n_cols - 1:  # deeper than the columns: fold into the last one
            out[-1][1].append(i)
            continue
        kind = label.split()[0].lower() if label.split() else ""
        preferred = LEVEL_COLUMNS.index(PREFERRED_COLUMN.get(kind, LEVEL_COLUMNS[0]))
        below = min(len(labels) - i - 1, n_cols - 1)  # levels below that still need a column
        col = min(max(preferred, prev + 1), max(n_cols - 1 - below, prev + 1))
        out.append((LEVEL_COLUMNS[col], [i]))
        prev = col
    return out


def heading_value(label: str, title: str) -> str:
    """``"<label> : <title>"``, or the label alone when the title is unknown (``""``)."""
    title = (title or "").strip()
    return f"{label} : {title}" if title else label


def _records(path: Path, required: tuple[str, ...]):
    """``(line number, record)`` of a JSON-lines file, each with the ``required`` keys."""
    if not path.is_file():
        raise DataError(path, "file not found")
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            rec = json_line(path, line_no, line)
            missing = [k for k in required if not isinstance(rec, dict) or k not in rec]
            if missing:
                raise DataError(path, f"line {line_no}: missing key(s) {missing}; expected {list(required)}")
            try:
                rec["id"] = integer_id(rec["id"])  # the id rule (lexgraph.data.schema): 7.5, "+7", -1 refused
            except ValueError as exc:
                raise DataError(path, f"line {line_no}: {exc}") from None
            yield line_no, rec


def sample_articles(src: Path) -> pl.DataFrame:
    try:
        headings = json_object((src / "headings.json").read_text(encoding="utf-8"))
    except DuplicateKeyError as exc:
        raise DataError(src / "headings.json", str(exc)) from None
    except FileNotFoundError:
        raise DataError(src / "headings.json", "file not found") from None
    except json.JSONDecodeError as exc:
        raise DataError(src / "headings.json", f"line {exc.lineno}: not valid JSON ({exc.msg})") from None
    rows = []
    path = src / "articles.jsonl"
    for line_no, rec in _records(path, ("id", "text", "number", "path")):
        row = {c: None for c in ARTICLE_COLUMNS}
        row.update(id=rec["id"], article=rec["text"], law_type=None, code=CODE_NAME)
        labels = list(rec["path"])
        values = []
        for depth in range(1, len(labels) + 1):
            key = "/".join(labels[:depth])
            if key not in headings:
                raise DataError(src / "headings.json", f"no heading for path {key!r} (articles.jsonl line {line_no})")
            values.append(heading_value(labels[depth - 1], headings[key]))
        for column, levels in map_levels(labels):
            row[column] = " / ".join(values[i] for i in levels)
        row["reference"] = f"Art. {rec['number']}, {CODE_NAME} ({', '.join(labels)})"
        row["description"] = " > ".join([CODE_NAME, *values])
        rows.append(row)
    return pl.DataFrame(rows, schema={c: (pl.Int64 if c == "id" else pl.Utf8) for c in ARTICLE_COLUMNS})


def sample_questions(src: Path) -> dict[str, pl.DataFrame]:
    by_split: dict[str, list[dict]] = {}
    for _, rec in _records(src / "questions.jsonl", ("id", "question", "split", "article_ids")):
        by_split.setdefault(rec["split"], []).append(
            {
                "id": rec["id"],
                "question": rec["question"],
                "category": rec.get("category"),
                "subcategory": rec.get("subcategory"),
                "extra_description": "",
                "article_ids": ",".join(str(i) for i in rec["article_ids"]),
            }
        )
    schema = {c: (pl.Int64 if c == "id" else pl.Utf8) for c in QUESTION_COLUMNS}
    return {split: pl.DataFrame(rows, schema=schema) for split, rows in sorted(by_split.items())}


def build_sample(src: str | Path, out: str | Path) -> None:
    """Write ``articles.csv`` and ``questions_<split>.csv`` (BSARD's layout) into ``out``."""
    src, out = Path(src), Path(out)
    articles = sample_articles(src)
    questions = sample_questions(src)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "articles.csv") as tmp:
        articles.write_csv(tmp)
    for split, df in questions.items():
        with atomic_path(out / f"questions_{split}.csv") as tmp:
            df.write_csv(tmp)
    log.info("sample: %d articles, %s questions", articles.height, {s: d.height for s, d in questions.items()})


if __name__ == "__main__":
    import argparse

    logging.basicConfig(level=logging.INFO)
    parser = argparse.ArgumentParser(description="Rebuild data/sample from a folder of the code-civil-fr corpus")
    parser.add_argument("source")
    parser.add_argument("out")
    args = parser.parse_args()
    sys.exit(reported("sample", lambda: build_sample(args.source, args.out)))
