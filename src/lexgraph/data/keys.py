"""The user's string ids of a corpus of one's own (``fetch.source: corpus``,
:mod:`lexgraph.data.corpus`): ``keys.parquet`` beside data/raw's and data/clean's tables, one row
per article and question (``kind``, lexgraph's integer ``id``, the user's ``key``). ``clean``
always writes ``data/clean/keys.parquet`` (without rows for BSARD's layout, whose integer ids are
the user's), so that ``dvc.yaml`` can declare it. Read where ids leave lexgraph: evaluate's runs,
qrels and per-question reports (``--keys``), and ``lexgraph search``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

KEYS_FILE = "keys.parquet"
KEY_KINDS = ("article", "question")


@dataclass(frozen=True)
class IdKeys:
    """The user's ids of lexgraph's integer article and question ids, and back."""

    articles: dict[int, str]
    questions: dict[int, str]

    def article_ids(self) -> dict[str, int]:
        return {key: i for i, key in self.articles.items()}

    def question_ids(self) -> dict[str, int]:
        return {key: i for i, key in self.questions.items()}


def name_of(keys: IdKeys | None, kind: str, i: int) -> str:
    """How a message names article or question ``i`` (``kind``): the user's id, quoted, on a corpus of
    one's own; lexgraph's integer id otherwise (BSARD's layout, where it is the user's)."""
    if keys is None:
        return str(i)
    return repr((keys.articles if kind == "article" else keys.questions).get(i, i))


def keys_table(article_keys: list[str], question_keys: list[str], versions: list[tuple] | None = None):
    """The user's ids: ``kind`` (article/question), lexgraph's ``id`` (0.. in file order), the
    user's ``key``; no rows when both lists are empty (BSARD's layout). With ``versions`` (each
    article's ``(valid_from, valid_to, act)``, :mod:`lexgraph.data.versions`), those three columns
    too, null for the questions."""
    import polars as pl

    from lexgraph.data.versions import VERSION_FIELDS

    kinds = ["article"] * len(article_keys) + ["question"] * len(question_keys)
    ids = list(range(len(article_keys))) + list(range(len(question_keys)))
    columns = {"kind": kinds, "id": ids, "key": article_keys + question_keys}
    schema = {"kind": pl.Utf8, "id": pl.Int64, "key": pl.Utf8}
    if versions is not None:
        for n, field in enumerate(VERSION_FIELDS):
            columns[field] = [v[n] for v in versions] + [None] * len(question_keys)
            schema[field] = pl.Utf8
    return pl.DataFrame(columns, schema=schema)


def keys_of(path) -> IdKeys | None:
    """The keys file ``path`` (clean's ``data/clean/keys.parquet``), or None when it has no rows
    (BSARD's layout: the integer ids are the user's). A missing or damaged file is a
    :class:`~lexgraph.core.errors.DataError` naming it and the stage that writes it."""
    import polars as pl

    from lexgraph.core.errors import DataError
    from lexgraph.core.io import read_parquet
    from lexgraph.core.layout import restore_hint

    if not Path(path).is_file():
        raise DataError(path, f"file not found; {restore_hint(path)}")
    keys = read_parquet(path, ["kind", "id", "key"])
    if keys.height == 0:
        return None
    of = {kind: dict(keys.filter(pl.col("kind") == kind).select("id", "key").iter_rows()) for kind in KEY_KINDS}
    return IdKeys(of["article"], of["question"])


def read_keys(directory) -> IdKeys | None:
    """:func:`keys_of` ``directory/keys.parquet``; None also where there is none (a workspace
    cleaned before clean wrote it)."""
    path = Path(directory) / KEYS_FILE
    return keys_of(path) if path.is_file() else None
