"""The ``clean`` stage: raw BSARD-schema tables → clean articles, headings, questions.

- Text: Unicode NFC, hard-wrapped lines unwrapped (a single newline inside a paragraph
  becomes a space; blank lines separate paragraphs, kept as one ``\\n``), whitespace
  collapsed, amendment artefacts removed (Justel's ``<L 2006-05-10/33, art. 3, 004; En
  vigueur : …>`` notes and ``[1 … ]1`` insertion markers, "Alinéa abrogé" items).
- Articles that end up empty, that are only a repeal notice ("(Abrogé)"), or shorter
  than ``clean.min_words`` words are dropped, each with its reason in ``metrics/data.json``.
- Hierarchy: one heading node per distinct *path* (the sequence of non-empty hierarchy
  values from the top level down), so two sections both called "Dispositions
  générales" under different titles are different nodes.
- Questions: ``article_ids`` parsed to a list of ints (duplicates removed, order kept);
  an id absent from the raw corpus is an error; an id whose article was dropped is
  removed (and counted); questions left without any relevant article are dropped.
- The test set is the benchmark: cleaning that would drop a test question, or any of a test
  question's gold articles, is an error naming the questions, the articles and the rule that
  dropped them, unless ``clean.allow_test_changes`` is true (then a warning lists them).
  Train and dev questions may lose gold articles or be dropped (counted in the stats).
- A question text in two of the train, dev and test splits is an error
  (:mod:`lexgraph.data.integrity`, as in ``fetch``).
- Ids follow :mod:`lexgraph.data.schema`'s rule again (no negative id: ``-1`` is padding in
  search), and a cleaning that keeps fewer than ``MIN_ARTICLES`` articles is an error.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections import Counter
from typing import Annotated

import polars as pl
from pydantic import Field

from lexgraph.core.errors import DataError
from lexgraph.core.io import atomic_path, read_parquet, write_json
from lexgraph.core.settings import Bool, Int, Section
from lexgraph.core.stage import StageContext, stage_paths
from lexgraph.data.integrity import HUMAN_SPLITS, SHARED_TEXT_RULE, shared_text
from lexgraph.data.keys import KEYS_FILE, IdKeys, keys_of, keys_table, name_of
from lexgraph.data.schema import (
    CLEAN_QUESTION_SCHEMA,
    HIERARCHY_LEVELS,
    ID_EXPECTED,
    MIN_ARTICLES,
    parse_article_ids,
)

log = logging.getLogger(__name__)

SECTION = "clean"


class CleanConfig(Section, section=SECTION):
    """The ``clean`` section of params.yaml."""

    min_words: Annotated[Int, Field(ge=0, description="shorter articles are dropped")]
    drop_repealed: Bool = Field(description="drop articles whose whole text is a repeal notice")
    allow_test_changes: Bool = Field(description="may cleaning drop test questions or their gold articles?")


_JUSTEL_NOTE = re.compile(r"<\s*(?:L|W|AR|A|DCE|DRW|ORD|DCFR|DWG|ARR|AGW|AGCF|DECR)[ .][^<>]{0,400}?>")
_INSERTION_OPEN = re.compile(r"\[\d+\s*")
_INSERTION_CLOSE = re.compile(r"\s*\]\d+")
_REPEALED_ITEM = re.compile(
    r"^\s*(?:\d+°|[a-z]\))?\s*(?:Alinéa|Paragraphe|Disposition)s?\s+abrogée?s?\s*[;.]?\s*$", re.I
)
_REPEAL_NOTICE = re.compile(r"^\W*(?:article\s+)?(?:abrogée?s?|supprimée?s?|\[?abrogé\]?)(?:\s+par\b.*)?\W*$", re.I)


def clean_text(text: str | None) -> tuple[str, int]:
    """Return ``(clean text, number of artefacts removed)``."""
    if not text:
        return "", 0
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\u00a0", " ").replace("\u202f", " ").replace("\t", " ")
    artefacts = 0
    text, n = _JUSTEL_NOTE.subn(" ", text)
    artefacts += n
    text, n = _INSERTION_OPEN.subn("", text)
    artefacts += n
    text, n = _INSERTION_CLOSE.subn("", text)
    artefacts += n
    paragraphs = []
    for para in re.split(r"\n\s*\n", text):
        para = " ".join(para.split())
        if not para:
            continue
        if _REPEALED_ITEM.match(para):
            artefacts += 1
            continue
        paragraphs.append(para)
    return "\n".join(paragraphs), artefacts


def is_repeal_notice(text: str) -> bool:
    return bool(_REPEAL_NOTICE.match(text))


def hierarchy_path(row: dict) -> list[tuple[str, str]]:
    """Non-empty hierarchy values from the top, as ``(level_name, value)``: BSARD's columns, or
    (``fetch.source: corpus``) the raw ``path`` list of any depth under the article's ``code``,
    its levels named ``level1``, ``level2``, …"""
    if row.get("path") is not None:
        items = [("code", row.get("code"))] + [(f"level{d}", v) for d, v in enumerate(row["path"], 1)]
    else:
        items = [(level, row.get(level)) for level in HIERARCHY_LEVELS]
    out = []
    for level, value in items:
        if value is None:
            continue
        value = " ".join(unicodedata.normalize("NFC", str(value)).split())
        if value:
            out.append((level, value))
    return out


def _drop_reason(text: str, min_words: int, drop_repealed: bool) -> str | None:
    """Why a cleaned article is dropped (``empty``, ``repealed``, ``too_short``), or None to keep it."""
    if not text:
        return "empty"
    if drop_repealed and is_repeal_notice(text):
        return "repealed"
    if len(text.split()) < min_words:
        return "too_short"
    return None


def refuse_negative_ids(raw: pl.DataFrame, path) -> None:
    """The id rule (:mod:`lexgraph.data.schema`) on a ``data/raw`` table, whose ids are int64:
    no negative id (search uses -1 as padding)."""
    negative = (raw["id"] < 0).arg_true()
    if len(negative):
        row = int(negative[0])
        raise DataError(
            path, f"id {raw['id'][row]} is negative; expected {ID_EXPECTED} (rerun fetch)", row=row + 1, column="id"
        )


#: the types of the clean tables' columns other than strings: the ids and levels, and the heading paths
_COLUMN_TYPES = dict.fromkeys(("id", "heading_id", "parent_id", "level"), pl.Int64) | {"path": pl.List(pl.Utf8)}


def _table(rows: list[dict], columns: tuple[str, ...]) -> pl.DataFrame:
    """``rows`` as a table of ``columns`` in that order, each of its :data:`_COLUMN_TYPES` type or a string."""
    return pl.DataFrame(rows, schema={column: _COLUMN_TYPES.get(column, pl.Utf8) for column in columns})


def clean_articles(raw: pl.DataFrame, path, min_words: int, drop_repealed: bool):
    """Return (articles, headings, stats, {dropped article id: reason}) from the raw corpus table."""
    refuse_negative_ids(raw, path)
    dup = (~raw["id"].is_first_distinct()).arg_true()
    if len(dup):
        row = int(dup[0])
        raise DataError(path, f"duplicate article id {raw['id'][row]}; ids must be unique", row=row + 1, column="id")
    dropped: Counter = Counter()
    reasons: dict[int, str] = {}
    artefacts = 0
    heading_index: dict[tuple[str, ...], int] = {}
    headings: list[dict] = []
    rows = []
    for rec in raw.sort("id").iter_rows(named=True):
        text, n = clean_text(rec["article"])
        artefacts += n
        reason = _drop_reason(text, min_words, drop_repealed)
        if reason:
            dropped[reason] += 1
            reasons[rec["id"]] = reason
            continue
        levels = hierarchy_path(rec)
        values = tuple(v for _, v in levels)
        for depth in range(1, len(values) + 1):
            key = values[:depth]
            if key not in heading_index:
                heading_index[key] = len(headings)
                headings.append(
                    {
                        "heading_id": len(headings),
                        "parent_id": heading_index[key[:-1]] if depth > 1 else -1,
                        "level": depth,
                        "level_name": levels[depth - 1][0],
                        "label": key[-1],
                        "path": list(key),
                        "text": key[-1],
                    }
                )
        reference = " ".join((rec.get("reference") or "").split()) or f"Art. id {rec['id']}"
        rows.append(
            {
                "id": rec["id"],
                "article": text,
                "reference": reference,
                "path": list(values),
                "heading_id": heading_index[values] if values else -1,
            }
        )
    articles = _table(rows, ("id", "article", "reference", "path", "heading_id"))
    heads = _table(headings, ("heading_id", "parent_id", "level", "level_name", "label", "path", "text"))
    stats = {
        "in": raw.height,
        "out": articles.height,
        "dropped": dict(sorted(dropped.items())),
        "artefacts_removed": artefacts,
    }
    return articles, heads, stats, reasons


def article_ids_of(value, path, row: int) -> list[int]:
    """A ``data/raw`` question's ``article_ids`` cell → unique ids in order (a DataError naming the row)."""
    try:
        return list(dict.fromkeys(parse_article_ids(value)))
    except ValueError as exc:
        raise DataError(
            path, f"{exc}; expected a comma-separated list of integers", row=row, column="article_ids"
        ) from None


def clean_questions(raw: pl.DataFrame, path, raw_article_ids: set[int], kept_article_ids: set[int]):
    """Return (questions, stats, test changes); the ``row`` in errors is the 1-based row of the
    raw table. A test change is ``(row, question id, gold ids removed, question dropped)``."""
    refuse_negative_ids(raw, path)
    out, stats, test_changes = [], {}, []
    removed_gold = 0
    seen: dict[int, str] = {}
    for i, rec in enumerate(raw.iter_rows(named=True), 1):
        split = rec["split"]
        st = stats.setdefault(split, {"in": 0, "out": 0, "dropped_no_gold": 0})
        st["in"] += 1
        qid = rec["id"]
        if qid in seen:  # fetch already renumbered synthetic ids that overlap human ones
            raise DataError(
                path,
                f"duplicate question id {qid} (already used in split '{seen[qid]}'); expected each "
                "question id once across every split, synthetic included (rerun fetch)",
                row=i,
                column="id",
            )
        seen[qid] = split
        question = " ".join(unicodedata.normalize("NFC", rec["question"] or "").split())
        if not question:
            raise DataError(path, "empty question text", row=i, column="question")
        ids = article_ids_of(rec["article_ids"], path, i)
        unknown = [a for a in ids if a not in raw_article_ids]
        if unknown:
            raise DataError(
                path,
                f"question {rec['id']} cites article id(s) {unknown} that are not in the corpus",
                row=i,
                column="article_ids",
            )
        kept = [a for a in ids if a in kept_article_ids]
        removed_gold += len(ids) - len(kept)
        if split == "test" and len(kept) < len(ids):
            test_changes.append((i, qid, [a for a in ids if a not in kept_article_ids], not kept))
        if not kept:
            st["dropped_no_gold"] += 1
            continue
        st["out"] += 1
        out.append(
            {
                "id": qid,
                "question": question,
                "category": rec.get("category"),
                "subcategory": rec.get("subcategory"),
                "extra_description": rec.get("extra_description") or "",
                "article_ids": kept,
                "split": split,
            }
        )
    questions = pl.DataFrame(out, schema=CLEAN_QUESTION_SCHEMA)
    return questions, {"by_split": stats, "gold_ids_removed": removed_gold}, test_changes


def refuse_citing_all(questions: pl.DataFrame, raw: pl.DataFrame, path, kept: int, keys: IdKeys | None = None) -> None:
    """No clean question citing every one of the ``kept`` articles (training needs a negative);
    the row is the question's 1-based row of the raw table, the question named by the user's id
    (``keys``, a corpus of one's own)."""
    hit = questions.filter(pl.col("article_ids").list.len() >= kept)
    if hit.height:
        qid = hit["id"][0]
        raise DataError(
            path,
            f"question {name_of(keys, 'question', qid)} cites all {kept} articles that cleaning keeps; expected a "
            "question that leaves at least one article uncited (training needs a negative): fetch a larger "
            "corpus, or lower 'clean.min_words' in params.yaml",
            row=raw["id"].to_list().index(qid) + 1,
            column="article_ids",
        )


def refuse_shared_texts(raw: pl.DataFrame, path) -> None:
    """No question text in two of the train, dev and test splits of the raw table (rows 1-based)."""
    rows = [
        (i, rec)
        for i, rec in enumerate(raw.select("id", "question", "split").iter_rows(named=True), 1)
        if rec["split"] in HUMAN_SPLITS
    ]
    hit = shared_text((rec["split"], rec["question"]) for _, rec in rows)
    if hit:
        (i, rec), (j, other) = rows[hit[0]], rows[hit[1]]
        raise DataError(
            path,
            f"question {rec['id']} ({rec['split']}) has the same text as question {other['id']} "
            f"({other['split']}, row {j}); {SHARED_TEXT_RULE}",
            row=i,
            column="question",
        )


RULES = {
    "empty": "empty after cleaning",
    "repealed": "a repeal notice, 'clean.drop_repealed' = true",
    "too_short": "shorter than 'clean.min_words' = {min_words} words",
}


def describe_test_changes(
    changes: list, reasons: dict[int, str], config: CleanConfig, limit: int = 5, keys: IdKeys | None = None
) -> str:
    """``test question 8 (row 330) would be dropped, losing gold article(s) 2163 (empty after cleaning); …``
    (on a corpus of one's own, ``keys``: ``test question 'q-3' …  gold article(s) 'civ:4' …``)."""
    parts = []
    for row, qid, removed, dropped in changes[:limit]:
        why = ", ".join(
            f"{name_of(keys, 'article', a)} ({RULES[reasons[a]].format(min_words=config.min_words)})" for a in removed
        )
        fate = "would be dropped, losing" if dropped else "would lose"
        parts.append(f"test question {name_of(keys, 'question', qid)} (row {row}) {fate} gold article(s) {why}")
    more = f"; and {len(changes) - limit} more test question(s)" if len(changes) > limit else ""
    return "; ".join(parts) + more


def _nothing_left(path, total: int, dropped: Counter, config: CleanConfig) -> DataError:
    """The error for a corpus that cleaning empties: how many went for which reason, and
    the setting to change."""
    reasons = {
        "too_short": f"{dropped['too_short']} shorter than 'clean.min_words' = {config.min_words} words",
        "repealed": f"{dropped['repealed']} repeal notice(s)",
        "empty": f"{dropped['empty']} empty",
    }
    detail = ", ".join(text for key, text in reasons.items() if dropped[key])
    if dropped["too_short"]:
        fix = "lower 'clean.min_words' in params.yaml"
    elif dropped["repealed"]:
        fix = "set 'clean.drop_repealed' to false in params.yaml, or fetch a corpus with article texts"
    else:
        fix = "fetch a corpus with article texts (params.yaml 'fetch')"
    return DataError(path, f"cleaning dropped all {total} articles ({detail or 'the file has no rows'}); {fix}")


def clean(
    raw_articles: pl.DataFrame,
    raw_questions: pl.DataFrame,
    params: CleanConfig | dict | None,
    paths=("articles", "questions"),
    keys: IdKeys | None = None,
):
    """Clean both tables; return (articles, headings, questions, stats for metrics/data.json).

    ``params``: the ``clean`` section (a :class:`CleanConfig` or its mapping). A corpus
    that cleaning empties is a :class:`DataError` (nothing downstream could run on it).
    ``keys``: the user's ids (``fetch.source: corpus``), by which errors name questions and articles."""
    config = params if isinstance(params, CleanConfig) else CleanConfig.from_params(params)
    articles, headings, art_stats, reasons = clean_articles(
        raw_articles, paths[0], config.min_words, config.drop_repealed
    )
    if articles.height == 0:
        raise _nothing_left(paths[0], raw_articles.height, Counter(art_stats.get("dropped", {})), config)
    questions, q_stats, test_changes = clean_questions(
        raw_questions, paths[1], set(raw_articles["id"].to_list()), set(articles["id"].to_list())
    )
    refuse_shared_texts(raw_questions, paths[1])
    emptied = [s for s, st in q_stats["by_split"].items() if st["in"] and not st["out"]]
    if emptied:
        split = emptied[0]
        raise DataError(
            paths[1],
            f"cleaning dropped all {q_stats['by_split'][split]['in']} questions of split '{split}' (every article "
            f"they cite was dropped from the corpus, {articles.height}/{raw_articles.height} articles kept); lower "
            f"'clean.min_words' (= {config.min_words}) in params.yaml",
        )
    if test_changes and not config.allow_test_changes:
        raise DataError(
            paths[1],
            f"cleaning would change the test set: {describe_test_changes(test_changes, reasons, config, keys=keys)}; "
            "expected every test question kept with all its gold articles: fix those articles in "
            "the source corpus, or set 'clean.allow_test_changes' to true in params.yaml",
        )
    if articles.height < MIN_ARTICLES:
        raise DataError(
            paths[0],
            f"cleaning kept {articles.height} of {raw_articles.height} articles; expected at least {MIN_ARTICLES} "
            "(training needs, for every question, an article it does not cite as a negative): fetch a larger "
            "corpus, or lower 'clean.min_words' in params.yaml",
        )
    refuse_citing_all(questions, raw_questions, paths[1], articles.height, keys)
    if test_changes:
        log.warning(
            "clean: the test set changes ('clean.allow_test_changes' = true): %s",
            describe_test_changes(test_changes, reasons, config, keys=keys),
        )
    stats = {
        "articles": art_stats,
        "headings": {"nodes": headings.height, "by_level": dict(Counter(headings["level_name"].to_list()))},
        "questions": q_stats,
    }
    log.info(
        "clean: %d/%d articles kept, %d headings, %d questions",
        articles.height,
        raw_articles.height,
        headings.height,
        questions.height,
    )
    return articles, headings, questions, stats


CleanPaths = stage_paths("clean")


def run_clean(paths: CleanPaths, config: CleanConfig, context: StageContext) -> None:
    """The ``clean`` stage: ``paths.raw`` -> the clean articles, headings and questions in
    ``paths.out`` (atomically) and the counts in ``paths.metrics``."""
    articles_path, questions_path = paths.raw / "articles.parquet", paths.raw / "questions.parquet"
    raw_articles = read_parquet(articles_path, ["id", "article"])
    raw_questions = read_parquet(questions_path, ["id", "question", "article_ids", "split"])
    raw_keys = keys_table([], [])  # BSARD's layout: no rows (its integer ids are the user's)
    if (paths.raw / KEYS_FILE).is_file():  # source corpus: the user's ids
        raw_keys = read_parquet(paths.raw / KEYS_FILE, ["kind", "id", "key"])
    names = keys_of(paths.raw / KEYS_FILE) if raw_keys.height else None
    articles, headings, questions, stats = clean(
        raw_articles, raw_questions, config, (articles_path, questions_path), keys=names
    )
    with atomic_path(paths.out, directory=True) as tmp:
        articles.write_parquet(tmp / "articles.parquet", statistics=False)
        headings.write_parquet(tmp / "headings.parquet", statistics=False)
        questions.write_parquet(tmp / "questions.parquet", statistics=False)
        kept_keys(raw_keys, articles, questions).write_parquet(tmp / KEYS_FILE, statistics=False)
    write_json(stats, paths.metrics)


def kept_keys(keys: pl.DataFrame, articles: pl.DataFrame, questions: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``data/raw/keys.parquet`` (``fetch.source: corpus``) whose article or
    question ``clean`` kept."""
    kept = {"article": set(articles["id"].to_list()), "question": set(questions["id"].to_list())}
    mask = [i in kept.get(kind, ()) for kind, i in keys.select("kind", "id").iter_rows()]
    return keys.filter(pl.Series(mask, dtype=pl.Boolean))
