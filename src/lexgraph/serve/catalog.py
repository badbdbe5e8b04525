"""What one generation of the server serves: every configured system loaded once, the corpus they
search, its articles by the id users see, and the runs the inspector shows.

A :class:`Catalog` is built whole, off the event loop, then swapped in at once
(:mod:`lexgraph.serve.app`); requests hold the catalogue they started with (:meth:`Catalog.use`),
so a reload never changes the models under a request in flight, and the old catalogue's batchers
stop only when its last request is answered; :meth:`Catalog.release` then lets go of its models,
so that the memory they held is returned (``lexgraph.serve.app.trim_heap``).

Everything a request may show is read here, on the load thread: the inspector's runs too
(:meth:`lexgraph.serve.runs.Runs.read`), so a damaged run refuses the reload like any damaged
artefact, and a run rewritten after the load is not shown under the old generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lexgraph.serve.batcher import MicroBatcher
from lexgraph.serve.runs import Runs
from lexgraph.serve.searcher import Corpus, Searcher, open_searcher
from lexgraph.serve.settings import ServeConfig

log = logging.getLogger("lexgraph.serve")


class LoadStopped(Exception):
    """A load abandoned because the server is stopping (SIGTERM during a reload)."""


@dataclass
class Article:
    """One article as the API and the pages show it (``key``: the id users see)."""

    key: str
    number: str
    reference: str
    path: list[str]
    text: str
    #: on a corpus of versions: this version's ``valid_from``, ``valid_to`` and ``act``
    version: dict | None = None
    #: on a corpus of versions: every version of the article, oldest first (``text`` with the fields)
    versions: list[dict] | None = None


@dataclass
class Catalog:
    """One loaded generation: systems, corpus, articles and runs (see the module docstring)."""

    generation: int
    config: ServeConfig
    searchers: dict[str, Searcher]
    digests: dict[str, dict[str, str]]
    articles: dict[str, Article]
    siblings: dict[tuple[str, ...], list[str]]
    runs: Runs | None
    admin_token: str = ""  # serve.admin_token_file's token (lexgraph.serve.security.admin_token)
    #: the filter of searches by date on a corpus of versions (lexgraph.serve.searcher.InForce), or None
    in_force: Any = None
    batchers: dict[str, MicroBatcher] = field(default_factory=dict)
    active: int = 0
    idle: asyncio.Event | None = None

    def start(self, executor: Executor) -> None:
        """Start one batcher per system (on the running event loop)."""
        self.idle = asyncio.Event()
        self.idle.set()
        for name, searcher in self.searchers.items():
            self.batchers[name] = MicroBatcher(
                searcher, executor, self.config.max_batch, self.config.max_wait_ms / 1000
            )
            self.batchers[name].start()

    @contextlib.asynccontextmanager
    async def use(self):
        """Hold this catalogue for one request (its batchers stay up until the last is answered)."""
        self.active += 1
        self.idle.clear()
        try:
            yield self
        finally:
            self.active -= 1
            if self.active == 0:
                self.idle.set()

    async def close(self) -> None:
        """Stop the batchers once every request that holds this catalogue is answered."""
        if self.idle is not None:
            await self.idle.wait()
        for batcher in self.batchers.values():
            await batcher.stop()

    def release(self) -> None:
        """Let go of the models, corpus and runs (after :meth:`close`): what a request still refers to
        keeps only what it holds itself."""
        self.searchers, self.batchers, self.digests = {}, {}, {}
        self.articles, self.siblings, self.runs = {}, {}, None


def _articles(corpus: Corpus) -> tuple[dict[str, Article], dict[tuple[str, ...], list[str]]]:
    """The corpus's articles by the id users see, and each heading path's articles in corpus order.
    On a corpus of versions an article is shown as its version in force today (else its latest), with
    the list of all its versions, oldest first."""
    from lexgraph.data.versions import today
    from lexgraph.text.display import article_number

    names = corpus.keys.articles if corpus.keys is not None else None
    versions = corpus.versions if corpus.versions is not None and corpus.versions.dated else None
    now = versions.in_force(today()) if versions is not None else None
    rows_of: dict[str, list[dict]] = defaultdict(list)  # the rows of each id users see, in id order
    for row in corpus.articles.sort("id").iter_rows(named=True):
        rows_of[names[row["id"]] if names is not None else str(row["id"])].append(row)
    articles: dict[str, Article] = {}
    siblings: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for key, rows in rows_of.items():
        row = next((r for r in rows if now is not None and now[r["id"]]), rows[-1])
        path, reference = list(row["path"] or []), row["reference"] or ""
        articles[key] = Article(key, article_number(reference), reference, path, row["article"])
        if versions is not None:
            articles[key].version = versions.version(row["id"])
            articles[key].versions = [{**versions.version(r["id"]), "text": r["article"]} for r in rows]
        siblings[tuple(path)].append(key)
    return articles, dict(siblings)


def load_catalog(
    workspace: Path,
    config: ServeConfig,
    device: str,
    generation: int,
    index: Path | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> Catalog:
    """Load every system of ``config.systems`` from ``workspace`` (over ``index``, an index of
    ``lexgraph index``, when given) with the corpus, the runs and the admin token; raises what the
    loaders raise (one :class:`lexgraph.core.errors.LexgraphError` line for a missing or stale
    artefact), or :class:`LoadStopped` between two systems once ``stopping()``."""
    from lexgraph.methods.dense import shared_query_encoders
    from lexgraph.serve.security import admin_token, token_path
    from lexgraph.systems.index_record import model_digests, read_index

    def check() -> None:
        if stopping():
            raise LoadStopped("the server is stopping")

    token = admin_token(token_path(workspace, config.admin_token_file))
    snapshot = read_index(index).snapshot if index is not None else None
    corpus = Corpus.read(index if index is not None else workspace, snapshot)
    searchers: dict[str, Searcher] = {}
    with shared_query_encoders():  # dsr, hprior, gdsr, hgraph and the hybrid's dense side: one DSR query encoder
        for i, system in enumerate(config.systems, 1):
            check()
            start = time.perf_counter()
            searchers[system] = open_searcher(system, workspace, device, corpus, index)
            took = time.perf_counter() - start
            log.info(
                "loaded %s (%d of %d) in %.1f s%s",
                system,
                i,
                len(config.systems),
                took,
                f" (generation {generation})" if generation else "",
            )
    check()
    digests: dict[str, Any] = {s: model_digests(s, workspace) for s in config.systems}
    articles, siblings = _articles(corpus)
    runs = Runs.read(workspace, corpus, sharing=articles) if index is None else None
    check()
    return Catalog(generation, config, searchers, digests, articles, siblings, runs, token, corpus.in_force)
