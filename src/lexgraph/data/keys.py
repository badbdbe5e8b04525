"""The user's string ids of a corpus of one's own (``fetch.source: corpus``,
:mod:`lexgraph.data.corpus`): ``keys.parquet`` beside data/raw's and data/clean's tables, one row
per article and question (``kind``, lexgraph's integer ``id``, the user's ``key``). Read where ids
leave lexgraph: evaluate's runs, qrels and per-question reports, and ``lexgraph search``."""

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


def read_keys(directory) -> IdKeys | None:
    """``directory/keys.parquet`` (written for ``fetch.source: corpus``), or None (BSARD's layout:
    the integer ids are the user's)."""
    import polars as pl

    path = Path(directory) / KEYS_FILE
    if not path.is_file():
        return None
    keys = pl.read_parquet(path, columns=["kind", "id", "key"])
    of = {kind: dict(keys.filter(pl.col("kind") == kind).select("id", "key").iter_rows()) for kind in KEY_KINDS}
    return IdKeys(of["article"], of["question"])
