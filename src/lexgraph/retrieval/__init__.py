"""Retrieval systems behind one interface.

A system is anything with ``search(questions, k) -> (ids, scores)`` over the cleaned
corpus; ``ids`` is an int64 array ``(n_questions, k)`` of article ids, best first, and
``scores`` the float32 scores ``(n_questions, k)``; an id of ``-1`` is padding (a row
of ``-1`` means no article matches the question at all: BM25 when no term of the
question occurs in the corpus). A system also exposes ``article_ids`` (the ids it
ranks) and ``source`` (the artefact they come from). Systems are loaded from the
artefacts that ``dvc repro`` wrote in a workspace, by name, so the ``evaluate`` stage
and ``lexgraph search`` share exactly the same code path; loading checks that they were
built on the workspace's ``data/clean/articles.parquet``.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from lexgraph.errors import LexgraphError

# system name -> "module:function"; the function takes (workspace: Path, device: str) and,
# for dense systems, the keyword ``index`` (an IndexConfig: how the article embeddings are
# searched, ``evaluate.index``), and returns a Retriever. Imported lazily so BM25 never
# pays for torch or faiss imports.
SYSTEMS: dict[str, str] = {
    "bm25": "lexgraph.retrieval.bm25:load_system",
    "zeroshot": "lexgraph.zeroshot:load_system",
    "dsr": "lexgraph.retrieval.dense:load_dsr",
    "hprior": "lexgraph.retrieval.hprior:load_hprior",
    "gdsr": "lexgraph.retrieval.gnn:load_gdsr",
    "qabisar": "lexgraph.retrieval.gnn:load_qabisar",
    "hybrid": "lexgraph.retrieval.hybrid:load_hybrid",
    "mvcl": "lexgraph.retrieval.rerank:load_mvcl",
}


ARTICLES = Path("data/clean/articles.parquet")


class Retriever(Protocol):
    name: str
    article_ids: np.ndarray
    source: str

    def search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]: ...


def load_retriever(system: str, workspace: str | Path = ".", device: str = "auto", index=None) -> Retriever:
    """Load system ``system`` from the artefacts under ``workspace``; ``index`` (an
    :class:`lexgraph.retrieval.index.IndexConfig`, default: its defaults) goes to loaders
    that take it (the dense systems)."""
    if system not in SYSTEMS:
        raise LexgraphError(f"unknown system '{system}'; expected one of {', '.join(SYSTEMS)}")
    module, func = SYSTEMS[system].split(":")
    loader = getattr(importlib.import_module(module), func)
    takes_index = "index" in inspect.signature(loader).parameters
    retriever = loader(Path(workspace), device, index=index) if takes_index else loader(Path(workspace), device)
    check_corpus(retriever, Path(workspace) / ARTICLES)
    return retriever


def check_corpus(retriever: Retriever, articles_path: str | Path) -> None:
    """Raise when ``retriever`` ranks other articles than ``articles_path`` holds (its
    artefacts were built on another corpus); a missing ``articles_path`` is not checked."""
    from lexgraph.io import read_parquet

    articles_path = Path(articles_path)
    ids = getattr(retriever, "article_ids", None)
    if ids is None or not articles_path.is_file():
        return
    corpus = read_parquet(articles_path, ["id"])["id"].to_numpy().astype(np.int64)
    built = np.asarray(ids, dtype=np.int64)
    stale = np.setdiff1d(built, corpus)  # ranked, but no longer in the corpus
    unseen = np.setdiff1d(corpus, built)  # in the corpus, but never indexed
    if stale.size or unseen.size:
        parts = []
        if stale.size:
            parts.append(f"has {stale.size} article id{'s' * (stale.size > 1)} not in the corpus, e.g. {int(stale[0])}")
        if unseen.size:
            parts.append(f"lacks {unseen.size} corpus article{'s' * (unseen.size > 1)}, e.g. {int(unseen[0])}")
        source = getattr(retriever, "source", None) or f"the {retriever.name} system"
        raise LexgraphError(
            f"{source} was built on a different corpus than {articles_path} (it {', and '.join(parts)}); "
            "run `dvc repro`"
        )
