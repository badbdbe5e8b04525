"""A loaded system with what shows its hits: the one path of ``lexgraph search`` and ``lexgraph serve``.

:func:`open_searcher` loads a system from a workspace (or an index of ``lexgraph index``) through
:func:`lexgraph.systems.registry.load_retriever`, with the display that turns its rankings into
:class:`lexgraph.text.display.Hit` lists (article number, heading path, snippet with the question's
terms marked), naming articles by the user's ids on a corpus of one's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lexgraph.core import layout


def read_articles(corpus: Path):
    """The clean articles table the hits are shown from (the workspace's, or an index's)."""
    from lexgraph.core.io import read_parquet

    return read_parquet(layout.articles(corpus), ["id", "article", "reference", "path"])


def read_corpus_keys(corpus: Path):
    """The user's string ids of the corpus (``fetch.source: corpus``), or None."""
    from lexgraph.data.keys import read_keys

    return read_keys(corpus / layout.CLEAN.path)


class NamedDisplay:
    """A :class:`lexgraph.text.display.Display` whose hits name articles by the user's ids (a
    corpus of one's own, ``fetch.source: corpus``)."""

    def __init__(self, display, names: dict[int, str]) -> None:
        self.display, self.names = display, names

    def hits(self, question: str, ids, scores):
        hits = self.display.hits(question, ids, scores)
        for hit in hits:
            hit.id = self.names[hit.id]
        return hits


def make_display(retriever, articles, keys, versions=None):
    """The display of ``retriever``'s hits over ``articles``: terms marked with the retriever's own
    analyzer (BM25) or the project's default one; the user's ids where ``keys`` has them; each
    hit's version where the corpus has ``versions``."""
    from lexgraph.text.analyzer import FrenchAnalyzer
    from lexgraph.text.display import Display

    analyzer = getattr(retriever, "analyzer", None)
    display = Display(articles, analyzer if isinstance(analyzer, FrenchAnalyzer) else None, versions=versions)
    return display if keys is None else NamedDisplay(display, keys.articles)


def index_config(workspace: Path):
    """``evaluate.index`` of the workspace's params.yaml (the settings ``evaluate`` searched
    with), or the defaults when the workspace has no params.yaml."""
    from lexgraph.core.config import load_params
    from lexgraph.evaluation.evaluate import EvaluateConfig
    from lexgraph.search.index import IndexConfig

    path = workspace / "params.yaml"
    if not path.exists():  # a directory or an unreadable file is an error (load_params says which), not defaults
        return IndexConfig()
    _, raw = load_params("evaluate", path)
    return EvaluateConfig.from_params(raw).index


def real_results(retriever, ids, scores) -> np.ndarray:
    """``(n, k)`` bool: the entries of ``retriever``'s results that are results
    (:func:`lexgraph.text.display.ranked_entries`: ``-1`` padding never, and for BM25 no
    article scoring 0, which matches no term of the question)."""
    from lexgraph.search.bm25 import BM25
    from lexgraph.text.display import ranked_entries

    return ranked_entries(ids, scores, drop_zero=isinstance(retriever, BM25))


#: the most questions of one system call: a micro-batch (up to ``serve.max_batch`` questions) is
#: searched in length order, this many at a time, so that a dense encoder pads each call's questions
#: to a length near their own. 32 questions of random lengths in one call cost dsr, gdsr and hybrid
#: 15-25 % of their throughput against calls of 8 in length order; BM25 is as fast either way
#: (benchmarks/serve.py, on 2 cores)
SEARCH_CHUNK = 8


class InForce:
    """The law in force on a date over a corpus of versions (:mod:`lexgraph.data.versions`):
    :meth:`search` keeps a system's ranking to the versions in force
    (:func:`lexgraph.search.in_force.search_in_force`), on ``as_of`` or, without one, today."""

    #: the dates whose masks are kept (a server answers a few dates many times)
    KEPT = 64

    def __init__(self, versions) -> None:
        import threading

        self.versions = versions
        self._masks: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()  # the server's worker threads share the masks

    def check(self, as_of: str | None, label: str) -> str | None:
        """Why ``as_of`` (given as ``label``) cannot be answered (one line), or None."""
        return None if as_of is None else self.versions.check_date(as_of, label)

    def mask(self, as_of: str | None) -> np.ndarray | None:
        """Which article ids are in force on ``as_of`` (None: today); None when nothing is dated."""
        from lexgraph.data.versions import today

        if not self.versions.dated:
            return None
        date = as_of or today()
        with self._lock:
            if date not in self._masks:
                if len(self._masks) >= self.KEPT:
                    self._masks.pop(next(iter(self._masks)))
                self._masks[date] = self.versions.in_force(date)
            return self._masks[date]

    def search(self, retriever, questions: list[str], k: int, as_of: str | None):
        from lexgraph.search.in_force import search_in_force

        mask = self.mask(as_of)
        return retriever.search(questions, k) if mask is None else search_in_force(retriever, questions, k, mask)


def corpus_search(retriever, in_force: InForce | None, questions: list[str], k: int, as_of: str | None = None):
    """``retriever``'s ``(ids, scores)`` of ``questions``, kept to the law in force on ``as_of``
    (today's without it) on a corpus of versions."""
    if in_force is None:
        return retriever.search(questions, k)
    return in_force.search(retriever, questions, k, as_of)


@dataclass
class Searcher:
    """One loaded system of a workspace with its display; :meth:`hits` answers questions."""

    name: str
    retriever: Any
    display: Any
    in_force: InForce | None = None

    def search(self, questions: list[str], k: int, as_of: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, scores)``, each ``(n, k)``: the system's results of ``questions``, searched in
        length order :data:`SEARCH_CHUNK` at a time (each question's results are its own), kept to
        the law in force on ``as_of`` on a corpus of versions."""

        def run(batch: list[str]):
            return corpus_search(self.retriever, self.in_force, batch, k, as_of)

        if len(questions) <= SEARCH_CHUNK:
            return run(questions)
        order = sorted(range(len(questions)), key=lambda i: len(questions[i]))
        chunks = [order[start : start + SEARCH_CHUNK] for start in range(0, len(order), SEARCH_CHUNK)]
        parts = [run([questions[i] for i in rows]) for rows in chunks]
        width = max(part_ids.shape[1] for part_ids, _ in parts)
        ids = np.full((len(questions), width), -1, dtype=np.result_type(*(p[0] for p in parts)))
        scores = np.zeros((len(questions), width), dtype=np.result_type(*(p[1] for p in parts)))
        for rows, (part_ids, part_scores) in zip(chunks, parts):
            ids[rows, : part_ids.shape[1]], scores[rows, : part_scores.shape[1]] = part_ids, part_scores
        return ids, scores

    def hits(self, questions: list[str], k: int, as_of: str | None = None) -> list[list]:
        """Each question's real hits (:func:`real_results`), best first, at most ``k``, of the law
        in force on ``as_of`` (today's without it) on a corpus of versions."""
        top, scores = self.search(questions, k, as_of)  # (n, k), (n, k)
        real = real_results(self.retriever, top[:, :k], scores[:, :k])
        return [self.display.hits(q, top[i, :k][real[i]], scores[i, :k][real[i]]) for i, q in enumerate(questions)]


@dataclass(frozen=True)
class Corpus:
    """What a workspace's systems search: the clean articles, the user's ids (None: lexgraph's) and
    the articles' versions (None: a corpus of one state)."""

    root: Path
    articles: Any
    keys: Any
    versions: Any = None
    #: the filter of searches by date, shared by every system over this corpus (None: one state)
    in_force: InForce | None = None

    @classmethod
    def read(cls, root: Path, snapshot: str | None = None) -> Corpus:
        """The corpus under ``root`` (a workspace, or an index of ``lexgraph index``, ``snapshot``
        its snapshot date)."""
        from lexgraph.data.keys import KEYS_FILE
        from lexgraph.data.versions import read_versions

        versions = read_versions(root / layout.CLEAN.path / KEYS_FILE, snapshot)
        in_force = InForce(versions) if versions is not None else None
        return cls(root, read_articles(root), read_corpus_keys(root), versions, in_force)


def open_searcher(system: str, workspace: Path, device: str, corpus: Corpus, index: Path | None = None) -> Searcher:
    """Load ``system`` from ``workspace``'s models over ``corpus`` (``index``: the ``lexgraph index``
    directory it was read from, searched with them)."""
    from lexgraph.systems.registry import load_retriever

    retriever = load_retriever(system, workspace, device, index=index_config(workspace), corpus=index)
    display = make_display(retriever, corpus.articles, corpus.keys, corpus.versions)
    return Searcher(system, retriever, display, corpus.in_force)
