"""The registry of retrieval systems and the one way to load them.

Systems are loaded from the artefacts that ``dvc repro`` wrote in a workspace, by name,
so the ``evaluate`` stage and ``lexgraph search`` share exactly the same code path;
loading checks that they were built on the workspace's ``data/clean/articles.parquet``, and
first that the inputs their artefacts record are still the workspace's (:mod:`lexgraph.core.staleness`).
The registry names its loaders directly (no import strings), so the import contracts
(``lint-imports``) and the stages' DVC dependencies see every module it can run (importing
it imports torch, through the dense systems; faiss is imported when an index is built).
Its names are :data:`lexgraph.core.config.SYSTEM_NAMES`, which settings are checked against.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from lexgraph.core import layout
from lexgraph.core.errors import LexgraphError
from lexgraph.core.provenance import reads
from lexgraph.core.staleness import check_built_from
from lexgraph.search.bm25 import load_system as load_bm25
from lexgraph.systems.dense import load_dsr
from lexgraph.systems.gnn import load_gdsr, load_hgraph, load_hgraph_qa, load_qabisar
from lexgraph.systems.hprior import load_hprior
from lexgraph.systems.hybrid import load_hybrid
from lexgraph.systems.index_record import check_index
from lexgraph.systems.rerank import load_mvcl, load_xrerank
from lexgraph.systems.zeroshot import load_system as load_zeroshot

# system name -> loader: (workspace: Path, device: str) and, for dense systems, the keyword
# ``index`` (an IndexConfig: how the article embeddings are searched, ``evaluate.index``); the
# systems built on others (hybrid, the re-rankers) take ``load``, given load_retriever itself, so that
# their modules need not import this registry back
SYSTEMS: dict[str, Callable[..., Retriever]] = {
    "bm25": load_bm25,
    "zeroshot": load_zeroshot,
    "dsr": load_dsr,
    "hprior": load_hprior,
    "gdsr": load_gdsr,
    "qabisar": load_qabisar,
    "hgraph": load_hgraph,
    "hgraph_qa": load_hgraph_qa,
    "hybrid": load_hybrid,
    "xrerank": load_xrerank,
    "mvcl": load_mvcl,
}

#: system name -> the artefacts it reads itself (those it is built on are followed through their
#: provenance records, lexgraph.core.staleness; hybrid and the re-rankers load their first stages
#: through load_retriever, which checks those too)
READS: dict[str, tuple[layout.Artifact, ...]] = {
    "bm25": (layout.BM25,),
    "zeroshot": (layout.ZEROSHOT,),
    "dsr": (layout.DSR, layout.EMBED),
    "hprior": (layout.HPRIOR, layout.DSR),
    **{variant: (artifact, layout.DSR) for variant, artifact in layout.GNN.items()},
    "hybrid": (layout.HYBRID,),
    **{variant: (artifact,) for variant, artifact in layout.RERANKERS.items()},
}


class Retriever(Protocol):
    name: str
    article_ids: np.ndarray
    source: str

    def search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]: ...


def load_retriever(
    system: str, workspace: str | Path = ".", device: str = "auto", index=None, corpus: str | Path | None = None
) -> Retriever:
    """Load system ``system`` from the artefacts under ``workspace``; ``index`` (an
    :class:`lexgraph.search.index.IndexConfig`, default: its defaults) goes to loaders
    that take it (the dense systems). ``corpus``: an index of another corpus (``lexgraph index``),
    searched with the workspace's models, after :func:`lexgraph.systems.index_record.check_index`."""
    if system not in SYSTEMS:
        raise LexgraphError(f"unknown system '{system}'; expected one of {', '.join(SYSTEMS)}")
    loader = SYSTEMS[system]
    parameters = inspect.signature(loader).parameters
    options = {
        **({"index": index} if "index" in parameters else {}),
        **({"load": load_retriever} if "load" in parameters else {}),
        **({"corpus": Path(corpus)} if corpus is not None else {}),
    }
    used = [artifact.under(workspace) for artifact in READS[system]]
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
