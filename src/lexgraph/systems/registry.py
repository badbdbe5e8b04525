"""The one way to load a retrieval system.

The systems are those of the catalogue (:mod:`lexgraph.methods.catalog`: each declared once, next to
its code, lexgraph's own and other packages'). Systems are loaded from the artefacts that ``dvc
repro`` wrote in a workspace, by name, so the ``evaluate`` stage and ``lexgraph search`` share
exactly the same code path; loading checks that they were built on the workspace's
``data/clean/articles.parquet``, and first that the inputs their artefacts record are still the
workspace's (:mod:`lexgraph.core.staleness`). Importing it imports torch, through the dense systems;
faiss is imported when an index is built.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np

from lexgraph.core import layout
from lexgraph.core.errors import LexgraphError
from lexgraph.core.provenance import reads
from lexgraph.core.staleness import check_built_from
from lexgraph.methods.catalog import declared
from lexgraph.methods.system import Retriever
from lexgraph.systems.index_record import check_index


def load_retriever(
    system: str, workspace: str | Path = ".", device: str = "auto", index=None, corpus: str | Path | None = None
) -> Retriever:
    """Load system ``system`` from the artefacts under ``workspace``; ``index`` (an
    :class:`lexgraph.search.index.IndexConfig`, default: its defaults) goes to loaders
    that take it (the dense systems). ``corpus``: an index of another corpus (``lexgraph index``),
    searched with the workspace's models, after :func:`lexgraph.systems.index_record.check_index`."""
    spec = declared(system)
    loader = spec.load
    parameters = inspect.signature(loader).parameters
    options = {
        **({"index": index} if "index" in parameters else {}),
        **({"load": load_retriever} if "load" in parameters else {}),
        **({"corpus": Path(corpus)} if corpus is not None else {}),
    }
    used = [artifact.under(workspace) for artifact in spec.reads]
    check_built_from(used, workspace)  # before any loading
    if corpus is not None:
        check_index(corpus, system, workspace)
    for path in used:
        reads(path)  # a stage loading systems (hybrid, rerank) records what it read
    retriever = loader(Path(workspace), device, **options)
    check_corpus(retriever, layout.articles(corpus if corpus is not None else workspace))
    return retriever


def check_corpus(retriever: Retriever, articles_path: str | Path) -> None:
    """Raise when ``retriever`` ranks other articles than ``articles_path`` holds (its
    artefacts were built on another corpus); a missing ``articles_path`` is not checked."""
    from lexgraph.core.io import read_parquet

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
