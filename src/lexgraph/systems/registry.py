"""The registry of retrieval systems and the one way to load them.

Each system is declared once, next to its code (:class:`lexgraph.systems.system.System`, a module's
``SYSTEMS``): lexgraph's own in :data:`BUILTIN`'s modules, another package's under the
``lexgraph.systems`` entry-point group (docs/systems.md). :func:`systems` collects them, and every
question about systems (which are dense, what an index of them holds, what export writes) is a
query on it. Systems are loaded from the artefacts that ``dvc repro`` wrote in a workspace, by name,
so the ``evaluate`` stage and ``lexgraph search`` share exactly the same code path; loading checks
that they were built on the workspace's ``data/clean/articles.parquet``, and first that the inputs
their artefacts record are still the workspace's (:mod:`lexgraph.core.staleness`). The registry
imports lexgraph's system modules directly (no import strings), so the import contracts
(``lint-imports``) and the stages' DVC dependencies see every module it can run (importing it
imports torch, through the dense systems; faiss is imported when an index is built).
"""

from __future__ import annotations

import inspect
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np

from lexgraph.core import layout
from lexgraph.core.errors import LexgraphError
from lexgraph.core.provenance import reads
from lexgraph.core.staleness import check_built_from
from lexgraph.systems import bm25_pipeline, dense, gnn, hprior, hybrid, rerank, zeroshot
from lexgraph.systems.index_record import check_index
from lexgraph.systems.system import Retriever, System

#: lexgraph's own systems, in the order every listing shows them
BUILTIN: tuple[System, ...] = (
    *bm25_pipeline.SYSTEMS,
    *zeroshot.SYSTEMS,
    *dense.SYSTEMS,
    *hprior.SYSTEMS,
    *gnn.SYSTEMS,
    *hybrid.SYSTEMS,
    *rerank.SYSTEMS,
)
#: the entry-point group under which another package declares its systems: each entry is a
#: :class:`System` or a sequence of them (``[project.entry-points."lexgraph.systems"]``)
GROUP = "lexgraph.systems"


def _plugins() -> list[tuple[str, tuple[System, ...]]]:
    """``(origin, systems)`` of each ``lexgraph.systems`` entry point, by its name; one that does not
    import, or holds no System, is refused in one line naming it."""
    found = []
    for entry in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        origin = f"entry point '{entry.name} = {entry.value}' (group {GROUP})"
        try:
            value = entry.load()
        except (ImportError, AttributeError) as exc:
            raise LexgraphError(f"{origin} does not load ({exc}); expected an importable System") from None
        given = (value,) if isinstance(value, System) else tuple(value) if isinstance(value, list | tuple) else ()
        if not given or not all(isinstance(s, System) for s in given):
            raise LexgraphError(f"{origin} is a {type(value).__name__}; expected a System or a list of them")
        found.append((origin, given))
    return found


@cache
def systems() -> dict[str, System]:
    """Every system, by name: :data:`BUILTIN`, then those of the ``lexgraph.systems`` entry points
    (a name declared twice is refused in one line naming both places)."""
    found: dict[str, System] = {}
    where: dict[str, str] = {}
    for origin, given in [("lexgraph", BUILTIN), *_plugins()]:
        for spec in given:
            if spec.name in found:
                raise LexgraphError(
                    f"system '{spec.name}' is declared twice: by {where[spec.name]} and by {origin}; "
                    "expected one declaration per name"
                )
            found[spec.name], where[spec.name] = spec, origin
    return found


def names(kind: str | None = None) -> tuple[str, ...]:
    """The systems' names (of ``kind`` only, when given), in the registry's order."""
    return tuple(name for name, system in systems().items() if kind is None or system.kind == kind)


def declared(name: str, label: str = "") -> System:
    """The declaration of ``name``; an unknown name is refused in one line listing the known ones,
    after ``label`` (the option or key that gave it)."""
    found = systems().get(name)
    if found is None:
        prefix = f"{label}: " if label else ""
        raise LexgraphError(f"{prefix}unknown system '{name}'; expected one of {', '.join(systems())}")
    return found


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
