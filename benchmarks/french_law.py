"""Benchmark: the sample's test questions against all of French law (issue 26, item 3).

    .venv/bin/python benchmarks/french_law.py --corpus PATH/articles.jsonl.gz --workspace W --out OUT.json
        [--sizes 2760 22633 all] [--systems bm25 zeroshot dsr hprior] [--cache DIR] [--seed 13] [--resamples 10000]
    .venv/bin/python benchmarks/french_law.py --table OUT.json   # the Markdown tables of a saved result

``--corpus`` is fr-codes-2020's ``articles.jsonl.gz`` (one JSON object a line: ``id``, ``code``,
``path`` a list of headings, ``text``); nothing is read from ``../shared`` by default. Its own
"Code civil" is dropped (the sample is the complete Code: the export's holds 1,799 articles in the
same pre-2016 numbering, 1,728 of them with the sample's text, docs/scale.md) and the
sample's clean articles (``W/data/clean/articles.parquet``) stand in for it; the other codes'
articles are distractors, with ids ``DISTRACTOR_OFFSET + id``. A size is the number of articles
searched: the sample plus the first ``size - sample`` distractors of one seeded permutation, so the
sizes are nested (``all``: every distractor). A few distractors may answer a question too
(consumer or rural law): the scores are a lower bound.

The workspace ``W`` is a reproduced lexgraph workspace (``dvc repro``), read only: its trained
models encode the distractors, with no retraining.

* ``bm25``: refitted on each size with the workspace index's k1, b, idf floor and analyzer.
* ``zeroshot``, ``dsr``: the distractors are cut into the chunk windows of the workspace's
  ``encode_chunks`` cache and encoded once by the frozen base encoder (``models/pretrain``: the
  DSR's chunk encoder is frozen, and the zeroshot windows are the same); the chunk vectors are
  aggregated by the DSR article encoder (``dsr``) or by a token-count-weighted mean (``zeroshot``).
  The sample's own vectors are the workspace's. A fine-tuned chunk encoder is refused.
* ``hprior`` and the graph encoders (gdsr, qabisar, hgraph, hgraph_qa): over each size's statute
  graph (the sample's headings, then the distractors' code and ``path`` built as ``clean`` builds a
  corpus's, :func:`read_statute`), the train questions as nodes as in the workspace's graph,
  applied with :mod:`lexgraph.methods.gnn.inductive`; the title features encode the distractors'
  headings once.
* ``hybrid`` and ``xrerank``: the workspace's own loaders over this size's systems
  (:meth:`SizeRun.loader`); the re-ranker encodes the token states of the distractors that reach
  its first stage's candidates.

Per size and system: search the test questions (top-``--k``) and score them with lexgraph's
metrics. Two families of paired tests on recall@100, map and ndcg@10 (randomisation test,
bootstrap CI, p Holm-adjusted within each family): per system, the largest size against the
smallest; per system, its drop against BM25's. Every step reports its wall and CPU seconds and the
peak resident memory sampled while it ran; the chunk encoding is incremental over the nested
sizes. ``--cache DIR`` keeps the distractors' chunk vectors in blocks of :data:`BLOCK` (keyed by
the corpus, the seed, the windows and the base encoder) with each block's encoding time: an
interrupted run resumes there, and the cost table's ``encode_s`` is each size's distractors at the
measured rate (:func:`encode_rate`). Writes everything to ``--out`` (JSON) and prints the tables
(:func:`markdown_tables`); ``--plots CSV`` writes the cost per size for ``dvc plots``.

The measured run is in docs/scale.md ("All of French law"): the chunk encoding is nearly the whole
cost (about 18 distractors a second on 2 threads).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import resource
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lexgraph.core.arguments import OneLineParser, at_least, positive_int
from lexgraph.core.errors import DataError, LexgraphError

log = logging.getLogger("french_law")

DISTRACTOR_OFFSET = 1_000_000
DROPPED_CODE = "Code civil"
SYSTEMS = ("bm25", "zeroshot", "dsr", "hprior", "gdsr", "qabisar", "hgraph", "hgraph_qa", "hybrid", "xrerank")
COMPARED = ("recall@100", "map", "ndcg@10")
REPORTED = ("recall@10", "recall@100", "recall@500", "map", "ndcg@10")


# --------------------------------------------------------------------------- input


@dataclass
class Distractors:
    ids: np.ndarray  # (n,) lexgraph ids (DISTRACTOR_OFFSET + corpus id)
    texts: list[str]
    paths: list[tuple[str, ...]]  # (code, *path)
    dropped: int = 0  # articles of DROPPED_CODE


def _field(rec: dict, name: str, ok, expected: str, path: Path, row: int):
    value = rec.get(name)
    if not ok(value):
        raise DataError(path, f"{name!r} is {value!r}; expected {expected}", row=row, column=name)
    return value


def read_corpus(path: Path) -> Distractors:
    """The distractors of ``path`` (every code but :data:`DROPPED_CODE`); a line that is not such
    an article is a :class:`DataError` naming the file, line and field."""
    from lexgraph.data.clean import clean_text

    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            lines = fh.readlines()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DataError(path, f"cannot read the corpus ({exc}); expected a gzipped JSON-lines file") from None
    ids, texts, paths, seen, dropped = [], [], [], set(), 0
    for row, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(path, f"not JSON ({exc.msg}); expected one article object a line", row=row) from None
        if not isinstance(rec, dict):
            raise DataError(path, "not a JSON object; expected one article object a line", row=row)
        art = _field(
            rec, "id", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0", path, row
        )
        if art in seen:
            raise DataError(path, f"duplicate id {art}", row=row, column="id")
        seen.add(art)
        code = _field(rec, "code", lambda v: isinstance(v, str) and v.strip(), "a code name", path, row)
        heads = _field(
            rec,
            "path",
            lambda v: isinstance(v, list) and all(isinstance(h, str) for h in v),
            "a list of headings",
            path,
            row,
        )
        text = _field(rec, "text", lambda v: isinstance(v, str) and v.strip(), "a non-empty text", path, row)
        if code == DROPPED_CODE:
            dropped += 1
            continue
        ids.append(DISTRACTOR_OFFSET + art)
        texts.append(clean_text(text)[0])
        paths.append((code, *heads))
    if not ids:
        raise DataError(path, f"no article outside the {DROPPED_CODE!r}; expected the distractor codes")
    return Distractors(np.asarray(ids, dtype=np.int64), texts, paths, dropped)


@dataclass
class Sample:
    ids: np.ndarray  # (A,)
    texts: list[str]
    qids: list[int]
    questions: list[str]
    qrels: dict[int, list[int]]


def read_sample(workspace: Path, split: str = "test") -> Sample:
    from lexgraph.core import layout
    from lexgraph.core.io import read_parquet

    articles = read_parquet(layout.articles(workspace), ["id", "article"])
    questions = read_parquet(
        layout.CLEAN.under(workspace, "questions.parquet"), ["id", "question", "article_ids", "split"]
    )
    questions = questions.filter(questions["split"] == split)
    qids = [int(q) for q in questions["id"].to_list()]
    return Sample(
        articles["id"].to_numpy().astype(np.int64),
        ["" if t is None else str(t) for t in articles["article"].to_list()],
        qids,
        [str(q) for q in questions["question"].to_list()],
        {q: [int(a) for a in ids] for q, ids in zip(qids, questions["article_ids"].to_list())},
    )


def resolve_sizes(sizes: Sequence[str], n_sample: int, n_distractors: int, where: str = "--sizes") -> list[int]:
    """Sorted distinct sizes; each between the sample and sample + distractors (``all``: that)."""
    out = set()
    top = n_sample + n_distractors
    for size in sizes:
        value = top if size == "all" else int(size)
        if not n_sample <= value <= top:
            raise LexgraphError(
                f"{where}: {size} articles, expected a size in [{n_sample}, {top}] (the sample's {n_sample} "
                f"articles plus up to {n_distractors} distractors) or 'all'"
            )
        out.add(value)
    return sorted(out)


# --------------------------------------------------------------------------- measuring


def rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Steps:
    rows: list[dict[str, Any]] = field(default_factory=list)

    @contextmanager
    def measure(self, step: str, system: str, size: int | None, **extra: Any):
        """Wall and CPU seconds of the block and the peak RSS sampled (every 20 ms) while it ran."""
        peak, done = [rss_mib()], threading.Event()

        def sample() -> None:
            while not done.wait(0.02):
                peak[0] = max(peak[0], rss_mib())

        watcher = threading.Thread(target=sample, daemon=True)
        watcher.start()
        wall, cpu = time.perf_counter(), time.process_time()
        extra = dict(extra)
        try:
            yield extra  # the block may add to its row
        finally:
            done.set()
            watcher.join()
            row = {
                "step": step,
                "system": system,
                "size": size,
                "wall_s": round(time.perf_counter() - wall, 3),
                "cpu_s": round(time.process_time() - cpu, 3),
                "peak_rss_mib": round(max(peak[0], rss_mib()), 1),
                **extra,
            }
            self.rows.append(row)
            log.info(
                "%-9s %-16s size %-6s %8.1f s  peak %7.0f MiB", system, step, size, row["wall_s"], row["peak_rss_mib"]
            )


# --------------------------------------------------------------------------- systems


def chunk_encoder(workspace: Path):
    """The frozen base encoder cutting the windows of the workspace's ``encode_chunks`` cache,
    and the DSR (chunk-level module only), checked to read those windows."""
    from lexgraph.core import layout
    from lexgraph.encoding.chunks import SETTINGS, check_settings, load_chunk_table
    from lexgraph.models.article_encoder import HierarchicalArticleEncoder
    from lexgraph.models.dsr import DSR

    dsr = DSR.load(layout.DSR.under(workspace), device="cpu", with_article_backbone=False)
    if not dsr.article_encoder.freeze_backbone:
        raise LexgraphError(
            f"{layout.DSR.under(workspace)}: the DSR's chunk encoder was fine-tuned (dsr.chunk_encoder: finetune); "
            "this benchmark encodes distractors only with a frozen one"
        )
    cache = layout.CHUNKS.under(workspace, "articles.safetensors")
    table = load_chunk_table(cache)
    check_settings(table, dsr.article_encoder, cache)
    encoder = HierarchicalArticleEncoder.from_pretrained(
        layout.PRETRAIN.under(workspace),
        max_chunk_length=int(table.settings["max_chunk_length"]),
        max_document_length=int(table.settings["max_document_length"]),
        token_pooling=table.settings["token_pooling"],
        pooling="token_mean",
        num_layers=0,
    ).eval()
    got = {key: str(getattr(encoder, key)) for key in SETTINGS}
    if got != table.settings:
        raise LexgraphError(f"{cache}: chunked with {table.settings}, the base encoder gives {got}; run `dvc repro`")
    return encoder, dsr, table.settings


BLOCK = 2000  # distractors per cached block of chunk vectors


def cache_key(workspace: Path, corpus: Path, seed: int, settings: dict[str, str]) -> dict[str, Any]:
    """What a ``--cache`` directory's chunk vectors depend on: the corpus, the permutation, the
    windows and the base encoder's weights (their size and a hash of their first MiB)."""
    import hashlib

    from lexgraph.core import layout

    weights = sorted(layout.PRETRAIN.under(workspace).glob("*.safetensors"))
    digest = hashlib.sha256()
    for path in weights:
        with open(path, "rb") as fh:
            digest.update(fh.read(1 << 20))
        digest.update(str(path.stat().st_size).encode())
    return {
        "corpus": corpus.name,
        "corpus_bytes": corpus.stat().st_size,
        "seed": seed,
        "block": BLOCK,
        "settings": settings,
        "base_encoder": digest.hexdigest(),
    }


def open_cache(cache: Path | None, key: dict[str, Any]) -> Path | None:
    """``cache`` (created, its key written) if it holds nothing or vectors of this very ``key``;
    vectors of another corpus, permutation or model are one line naming the directory."""
    if cache is None:
        return None
    from lexgraph.core.io import write_json

    manifest = cache / "cache.json"
    if manifest.is_file():
        try:
            held = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(manifest, f"unreadable cache key ({exc}); remove {cache} or name another --cache") from None
        if held != key:
            diff = sorted(k for k in key if held.get(k) != key[k]) if isinstance(held, dict) else ["all"]
            raise DataError(
                manifest,
                f"chunk vectors of another {', '.join(diff)} than this run's; remove {cache} or name another --cache",
            )
    elif cache.exists() and not cache.is_dir():
        raise DataError(cache, "is a file; expected --cache to name a directory")
    else:
        write_json(key, manifest)
    return cache


def blocks(sizes: list[int], n_sample: int) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of distractors cutting at every BLOCK and at every size."""
    top = sizes[-1] - n_sample
    cuts = sorted({0, top, *range(BLOCK, top, BLOCK), *(s - n_sample for s in sizes)})
    return list(zip(cuts, cuts[1:]))


def block_table(encoder, dis: Distractors, start: int, end: int, batch: int, cache: Path | None):
    """The chunk table of distractors ``[start, end)``: read from ``cache`` when it holds it, else
    encoded (and written there atomically, so an interrupted run resumes at this block)."""
    from lexgraph.encoding.chunks import encode_chunk_table, load_chunk_table, save_chunk_table

    path = cache / f"{start}-{end}.safetensors" if cache is not None else None
    if path is not None and path.is_file():
        table = load_chunk_table(path)
        if np.array_equal(table.ids, dis.ids[start:end]):
            return table, True
    wall = time.perf_counter()
    table = encode_chunk_table(encoder, dis.ids[start:end], dis.texts[start:end], batch, desc="encode distractors")
    if path is not None:
        save_chunk_table(table, path)
        from lexgraph.core.io import write_json

        timing = {"articles": end - start, "wall_s": round(time.perf_counter() - wall, 3), "threads": threads()}
        write_json(timing, path.with_suffix(".json"))
    return table, False


def threads() -> int:
    import torch

    return torch.get_num_threads()


def encode_rate(cache: Path | None, steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Distractors encoded a second, from the blocks whose encoding was timed (``--cache`` keeps
    each block's time beside it, whichever run encoded it), else from this run's encode steps."""
    timed = []
    if cache is not None:
        for path in sorted(cache.glob("*-*.json")):
            row = json.loads(path.read_text(encoding="utf-8"))
            if row.get("threads") == threads():
                timed.append((row["articles"], row["wall_s"]))
    if not timed:
        timed = [(s["encoded"], s["wall_s"]) for s in steps if s.get("encoded")]
    if not timed:
        return None
    articles, wall = sum(a for a, _ in timed), sum(w for _, w in timed)
    return {"articles": articles, "wall_s": round(wall, 1), "per_s": round(articles / wall, 2), "threads": threads()}


def encode_distractors(encoder, dsr, dis: Distractors, sizes: list[int], n_sample: int, batch: int, steps, cache):
    """``{"zeroshot"|"dsr": (n, dim)}`` vectors of the distractors of the largest size, encoded
    block by block (one step per size: its ``encoded`` articles and those read ``from_cache``)."""
    import torch

    from lexgraph.encoding.chunks import embed_from_chunks

    out: dict[str, list] = {"zeroshot": [], "dsr": []}
    torch.set_grad_enabled(False)
    pending = blocks(sizes, n_sample)
    for size in sizes:
        mine = [(a, b) for a, b in pending if b <= size - n_sample]
        pending = pending[len(mine) :]
        if not mine:
            continue
        counts = {"encoded": 0, "from_cache": 0}
        with steps.measure("encode chunks", "zeroshot+dsr", size, **counts) as row:
            tables = []
            for a, b in mine:
                table, cached = block_table(encoder, dis, a, b, batch, cache)
                counts["from_cache" if cached else "encoded"] += b - a
                tables.append(table)
            row.update(counts)
        for name, aggregator in (("zeroshot", encoder), ("dsr", dsr.article_encoder)):
            with steps.measure("aggregate", name, size, articles=sum(b - a for a, b in mine)):
                out[name].extend(embed_from_chunks(aggregator, t) for t in tables)
    dim = encoder.dim
    return {name: torch.cat(parts) if parts else torch.empty(0, dim) for name, parts in out.items()}


# --------------------------------------------------------------------------- the statute's hierarchy


@dataclass
class Statute:
    """The sample's clean articles and headings and every distractor's, in the clean tables'
    columns (``id``, ``article``, ``heading_id``; the headings' own): the graph of any size is a
    part of it (:func:`statute_at`)."""

    articles: Any  # polars DataFrame
    headings: Any


def read_statute(workspace: Path, corpus: Path, dis: Distractors) -> Statute:
    """The distractors' hierarchy built as ``clean`` builds a corpus's (the code, then its ``path``;
    nothing dropped), heading ids shifted by :data:`HEADING_OFFSET`, after the sample's own."""
    import polars as pl

    from lexgraph.core import layout
    from lexgraph.core.io import read_parquet
    from lexgraph.data.clean import clean_articles

    raw = pl.DataFrame(
        {
            "id": dis.ids,
            "article": dis.texts,
            "code": [p[0] for p in dis.paths],
            "path": [list(p[1:]) for p in dis.paths],
        },
        schema={"id": pl.Int64, "article": pl.Utf8, "code": pl.Utf8, "path": pl.List(pl.Utf8)},
    )
    articles, headings, _, dropped = clean_articles(raw, corpus, 0, False)
    if dropped:
        raise DataError(corpus, f"{len(dropped)} distractors have no text once cleaned, e.g. id {min(dropped)}")

    def shift(column: str):
        return pl.when(pl.col(column) >= 0).then(pl.col(column) + HEADING_OFFSET).otherwise(pl.col(column))

    own_headings = read_parquet(layout.CLEAN.under(workspace, "headings.parquet"), headings.columns)
    own_headings = own_headings.select(headings.columns).cast(headings.schema)
    if own_headings.height and own_headings["heading_id"].max() >= HEADING_OFFSET:
        raise DataError(layout.CLEAN.under(workspace, "headings.parquet"), f"heading ids reach {HEADING_OFFSET}")
    own_articles = read_parquet(layout.articles(workspace), ["id", "article", "heading_id"])
    own_articles = own_articles.select(pl.col("id").cast(pl.Int64), "article", pl.col("heading_id").cast(pl.Int64))
    return Statute(
        pl.concat(
            [own_articles, articles.select(pl.col("id").cast(pl.Int64), "article", shift("heading_id").cast(pl.Int64))]
        ),
        pl.concat([own_headings, headings.with_columns(shift("heading_id"), shift("parent_id"))]),
    )


def statute_at(statute: Statute, ids: np.ndarray):
    """``(articles, headings)``: the articles ``ids`` and every heading above them."""
    import polars as pl

    articles = statute.articles.filter(pl.col("id").is_in(ids))
    parent = dict(zip(statute.headings["heading_id"].to_list(), statute.headings["parent_id"].to_list()))
    kept: set[int] = set()
    level = {h for h in articles["heading_id"].to_list() if h is not None and h >= 0}
    while level:
        kept |= level
        level = {parent[h] for h in level if parent[h] is not None and parent[h] >= 0} - kept
    return articles, statute.headings.filter(pl.col("heading_id").is_in(sorted(kept)))


def encode_headings(encoder, dsr, statute: Statute, ids: np.ndarray, batch: int, cache: Path | None, steps: Steps):
    """``(ids, (H, dim))`` DSR vectors of the titles of the distractors' headings above articles
    ``ids`` (the node features of the variants with ``heading_features: title``), encoded as
    ``embed`` encodes the sample's (kept in ``cache``)."""
    import polars as pl

    from lexgraph.encoding.chunks import embed_from_chunks, encode_chunk_table, load_chunk_table, save_chunk_table

    _, heads = statute_at(statute, ids)
    heads = heads.filter(pl.col("heading_id") >= HEADING_OFFSET)
    ids = heads["heading_id"].to_numpy().astype(np.int64)
    path = cache / f"headings-{len(ids)}.safetensors" if cache is not None else None
    with steps.measure("encode headings", "gdsr+qabisar", None, headings=len(ids)):
        table = load_chunk_table(path) if path is not None and path.is_file() else None
        if table is None or not np.array_equal(table.ids, ids):
            table = encode_chunk_table(encoder, ids, heads["text"].to_list(), batch, desc="encode headings")
            if path is not None:
                save_chunk_table(table, path)
        return ids, embed_from_chunks(dsr.article_encoder, table)


# --------------------------------------------------------------------------- systems


GRAPH_SYSTEMS = ("gdsr", "qabisar", "hgraph", "hgraph_qa")
HEADING_OFFSET = 10_000_000


@dataclass
class Loaded:
    """A dense system as the workspace saved it: the sample's article vectors, the test questions
    encoded by its query encoder, and that encoder only when hybrid or xrerank encode again."""

    query_encoder: Any  # None: not needed after the questions are encoded
    normalize: bool
    article_ids: np.ndarray  # (A,)
    article_embeddings: Any  # (A, dim)
    queries: Any  # (q, dim)


def load_systems(
    workspace: Path, systems: Sequence[str], sample: Sample, steps: Steps, later: set[str]
) -> dict[str, Loaded]:
    """The dense systems of ``systems`` as saved; those sharing a query encoder directory share
    one loaded encoder and its encoding of the questions (as in ``evaluate``). Only the systems
    ``later`` keep their encoder (the others' are freed: at 91k articles each is memory the graph
    passes need)."""
    from lexgraph.methods.dense import shared_query_encoders
    from lexgraph.systems.registry import load_retriever

    out = {}
    with shared_query_encoders():
        for system in systems:
            if system in ("bm25", "hybrid", "xrerank"):
                continue
            with steps.measure("load + encode questions", system, None):
                r = load_retriever(system, workspace, "cpu")
                encoder = r.query_encoder if system in later else None
                out[system] = Loaded(
                    encoder, r.normalize, r.article_ids, r.article_embeddings, r.encode(sample.questions)
                )
    return out


def loaded_later(workspace: Path, systems: Sequence[str]) -> set[str]:
    """The systems that ``hybrid`` and ``xrerank`` load (through :meth:`SizeRun.loader`) at each
    size: the hybrid's two, the re-ranker's first stage."""
    from lexgraph.core import layout
    from lexgraph.methods.hybrid.system import SETTINGS, read_settings
    from lexgraph.methods.rerank.system import first_stage_of

    later = set()
    if "hybrid" in systems:
        later |= {"bm25", read_settings(layout.HYBRID.under(workspace, SETTINGS))["dense"]}
    if "xrerank" in systems:
        later.add(first_stage_of(workspace, "xrerank"))
    return later


class SizeRun:
    """Every system over the sample plus the first ``size - sample`` distractors."""

    def __init__(self, args, sample: Sample, dis: Distractors, size: int, steps: Steps, later: set[str]) -> None:
        self.args, self.sample, self.steps, self.size, self.later = args, sample, steps, size, later
        self.m = size - len(sample.ids)
        self.dis_ids = dis.ids[: self.m]
        self.texts = dict(zip(dis.ids[: self.m].tolist(), dis.texts[: self.m]))
        self.retrievers: dict[str, Any] = {}
        self.runs: dict[str, dict[int, list[int]]] = {}

    def keep(self, system: str, ids: np.ndarray) -> None:
        self.runs[system] = {q: [int(a) for a in row if a >= 0] for q, row in zip(self.sample.qids, ids)}

    def bm25(self, texts: list[str]) -> None:
        from lexgraph.search.bm25 import BM25, load_system

        saved = load_system(self.args.workspace)
        with self.steps.measure("fit", "bm25", self.size):
            index = BM25(**saved.settings())  # the saved index's scoring: k1, b, idf, floor, analyzer
            index.fit_texts(self.sample.texts + texts[: self.m], np.concatenate([self.sample.ids, self.dis_ids]))
        with self.steps.measure("search", "bm25", self.size):
            self.keep("bm25", index.search(self.sample.questions, min(self.args.k, self.size))[0])
        self.retrievers["bm25"] = index if "bm25" in self.later else None

    def dense(self, system: str, loaded: Loaded, ids: np.ndarray, vectors) -> None:
        """``system`` over article ``ids`` with ``vectors`` (its own query encoder and similarity)."""
        from lexgraph.methods.dense import DenseRetriever

        with self.steps.measure("index + search", system, self.size):
            retriever = DenseRetriever(
                loaded.query_encoder, ids, vectors, name=system, normalize=loaded.normalize, device="cpu"
            )
            self.keep(system, retriever.search_embeddings(loaded.queries, min(self.args.k, self.size))[0])
        self.retrievers[system] = retriever if system in self.later else None

    def loader(self, name: str, workspace: Path, device: str = "cpu", index=None, corpus=None):
        """The registry's ``load`` for hybrid and the re-rankers: this size's system ``name``."""
        return self.retrievers[name]

    def graph(self, workspace: Path, statute: Statute, loaded: dict[str, Loaded], dsr, headings) -> None:
        """hprior and the graph encoders over this size's statute graph (the train questions as
        nodes, as in the workspace's graph), the articles' DSR vectors ``dsr`` ``(ids, vectors)``."""
        from lexgraph.core import layout
        from lexgraph.core.io import read_parquet
        from lexgraph.encoding.embed import load_embeddings
        from lexgraph.methods.gnn import inductive
        from lexgraph.methods.hprior.system import hprior_vectors

        systems = [s for s in ("hprior", *GRAPH_SYSTEMS) if s in loaded]
        if not systems:
            return
        with self.steps.measure("build graph", "+".join(systems), self.size) as row:
            articles, heads = statute_at(statute, np.concatenate([self.sample.ids, self.dis_ids]))
            questions = read_parquet(
                layout.CLEAN.under(workspace, "questions.parquet"), ["id", "question", "article_ids", "split"]
            )
            graph = inductive.corpus_graph(articles, heads, workspace, questions=questions)
            row.update(headings=int(graph.heading_ids.numel()), edges=int(graph.edge_index.size(1)))
        own = {n: load_embeddings(layout.EMBED.under(workspace, f"{n}.safetensors")) for n in ("headings", "questions")}
        embeddings = {"articles": dsr, "questions": own["questions"]}
        if headings is not None:
            embeddings["headings"] = (
                np.concatenate([own["headings"][0], headings[0]]),
                torch_cat([own["headings"][1], headings[1]]),
            )
        for system in systems:
            with self.steps.measure("propagate" if system == "hprior" else "graph pass", system, self.size):
                if system == "hprior":
                    vectors = hprior_vectors(workspace, graph, *dsr)
                else:
                    vectors = inductive.graph_vectors(system, workspace, graph, embeddings)
            self.dense(system, loaded[system], graph.article_ids.numpy(), vectors)

    def hybrid(self, workspace: Path) -> None:
        from lexgraph.methods.hybrid.system import load_hybrid

        with self.steps.measure("fuse + search", "hybrid", self.size):
            retriever = load_hybrid(workspace, "cpu", load=self.loader)
            self.keep("hybrid", retriever.search(self.sample.questions, min(self.args.k, self.size))[0])
        self.retrievers["hybrid"] = retriever

    def xrerank(self, workspace: Path) -> None:
        """The re-ranker over its first stage of this size; the distractors among the first stage's
        top-k get their frozen token states now (the sample's come from ``data/rerank``)."""
        from lexgraph.methods.rerank.features import TokenStore
        from lexgraph.methods.rerank.system import load_xrerank

        with self.steps.measure("encode candidates + re-rank", "xrerank", self.size) as row:
            retriever = load_xrerank(workspace, "cpu", load=self.loader)
            first, _ = retriever.first.search(self.sample.questions, max(self.args.k, retriever.k))
            new = sorted({int(a) for a in first[:, : retriever.k].ravel() if a >= 0 and a not in retriever.articles})
            row.update(candidates_encoded=len(new))
            if new:
                config = retriever.settings["config"]
                tokens = retriever.encoder.tokenize(
                    [self.texts[a] for a in new],
                    retriever.encoder.passage_prefix,
                    int(config["max_article_length"]),
                    str(config["truncation"]),
                )
                store = retriever.encoder.encode_store(
                    new, [t["input_ids"] for t in tokens], int(config["encode_batch_size"]), "encode candidates"
                )
                old = retriever.articles
                keys = [int(a) for a in old.ids] + new
                states = [old.get(int(a)) for a in old.ids] + [store.get(a) for a in new]
                retriever.articles = TokenStore.from_list(keys, states, old.dim)
            self.keep("xrerank", retriever.search(self.sample.questions, min(self.args.k, self.size))[0])


def torch_cat(parts):
    import torch

    return torch.cat([p.float() for p in parts])


def needed(workspace: Path, systems: Sequence[str]) -> list[str]:
    """``systems`` and those they are built on (the re-ranker's first stage, the hybrid's two
    systems, the DSR vectors under hprior and the graph encoders), in :data:`SYSTEMS` order."""
    from lexgraph.core import layout
    from lexgraph.methods.hybrid.system import SETTINGS, read_settings
    from lexgraph.methods.rerank.system import first_stage_of

    want = set(systems)
    if "xrerank" in want:
        first = first_stage_of(workspace, "xrerank")
        if first is None:  # rerank.xrerank.enabled: false
            log.warning("xrerank: switched off in %s, not measured", workspace)
            want.discard("xrerank")
        else:
            want.add(first)
    if "hybrid" in want:
        want |= {"bm25", read_settings(layout.HYBRID.under(workspace, SETTINGS))["dense"]}
    if want & {"hprior", *GRAPH_SYSTEMS}:
        want.add("dsr")
    return [s for s in SYSTEMS if s in want]


def size_runs(args, systems: Sequence[str], sample: Sample, dis: Distractors, sizes: list[int], steps: Steps):
    """``{system: {size: run}}``: the distractors encoded once (incrementally over the sizes), then
    at each size every system, the graph systems on that size's statute graph."""
    workspace = args.workspace
    systems = needed(workspace, systems)
    later = loaded_later(workspace, systems)
    loaded = load_systems(workspace, systems, sample, steps, later)
    statute, vectors, headings = None, None, None
    if "dsr" in systems or "zeroshot" in systems:
        with steps.measure("load models", "zeroshot+dsr", None):
            encoder, dsr, settings = chunk_encoder(workspace)
            cache = open_cache(args.cache, cache_key(workspace, args.corpus, args.seed, settings))
        vectors = encode_distractors(encoder, dsr, dis, sizes, len(sample.ids), args.batch_size, steps, cache)
        if "dsr" in systems:
            with steps.measure("read statute", "graph", None):
                statute = read_statute(workspace, args.corpus, dis)
        if {"gdsr", "qabisar"} & set(systems):
            top = np.concatenate([sample.ids, dis.ids[: sizes[-1] - len(sample.ids)]])
            headings = encode_headings(encoder, dsr, statute, top, args.batch_size, cache, steps)
        del encoder, dsr
    runs: dict[str, dict[int, dict]] = {s: {} for s in systems}
    for size in sizes:
        run = SizeRun(args, sample, dis, size, steps, later)
        if "bm25" in systems:
            run.bm25(dis.texts)
        sized = {}
        for system in ("zeroshot", "dsr"):
            if system in systems:
                own = loaded[system]
                sized[system] = (
                    np.concatenate([own.article_ids, run.dis_ids]),
                    torch_cat([own.article_embeddings, vectors[system][: run.m]]),
                )
                run.dense(system, own, *sized[system])
        if statute is not None:
            run.graph(workspace, statute, loaded, sized["dsr"], headings)
        if "hybrid" in systems:
            run.hybrid(workspace)
        if "xrerank" in systems:
            run.xrerank(workspace)
        for system, by_question in run.runs.items():
            runs[system][size] = by_question
    return runs


# --------------------------------------------------------------------------- scoring


def score(runs: dict[str, dict[int, dict]], qrels, n_resamples: int, seed: int) -> dict[str, Any]:
    """Metrics per system and size, and two families of paired tests, each Holm-adjusted over its
    own tests: ``paired``, per system the largest size against the smallest; ``against_bm25``,
    per system its drop against BM25's on the same questions (does it hold up better?)."""
    from lexgraph.metrics.ir import evaluate_run
    from lexgraph.metrics.significance import per_query_scores

    quality = {
        system: {
            str(size): {m: round(v, 4) for m, v in evaluate_run(run, qrels).items() if m in REPORTED}
            for size, run in by_size.items()
        }
        for system, by_size in runs.items()
    }
    drops, paired, against = {}, [], []
    for system, by_size in runs.items():
        small, large = min(by_size), max(by_size)
        if small == large:
            continue
        for metric in COMPARED:
            a = per_query_scores(by_size[large], qrels, metric)
            b = per_query_scores(by_size[small], qrels, metric)
            at_large, at_small = np.array([a[q] for q in qrels]), np.array([b[q] for q in qrels])
            drops[system, metric] = at_large - at_small  # (queries,)
            paired.append(({"system": system, "metric": metric, "small": small, "large": large}, at_large, at_small))
    for (system, metric), drop in drops.items():
        if system != "bm25" and ("bm25", metric) in drops:
            against.append(({"system": system, "metric": metric}, drop, drops["bm25", metric]))
    return {
        "quality": quality,
        "paired": paired_family(paired, n_resamples, seed),
        "against_bm25": paired_family(against, n_resamples, seed),
    }


def paired_family(tests: list[tuple[dict, np.ndarray, np.ndarray]], n_resamples: int, seed: int) -> list[dict]:
    """Each ``(row, a, b)`` (per-query arrays ``(queries,)``): ``row`` with the mean of ``a - b``,
    its bootstrap 95 % CI, the paired randomisation test's p and its Holm adjustment over ``tests``."""
    from lexgraph.metrics.significance import bootstrap_ci, holm_adjust, paired_randomization_test

    rows = [
        {
            **row,
            "diff": round(float((a - b).mean()), 4),
            "p_value": paired_randomization_test(a.tolist(), b.tolist(), n_resamples, seed),
            "ci95": [round(float(x), 4) for x in bootstrap_ci(a - b, n_resamples, seed=seed)],
        }
        for row, a, b in tests
    ]
    for row, p in zip(rows, holm_adjust([r["p_value"] for r in rows])):
        row["p_value"], row["p_holm"] = round(row["p_value"], 4), round(p, 4)
    return rows


# --------------------------------------------------------------------------- tables


def markdown_tables(result: dict[str, Any]) -> str:
    """The quality table (metrics in %, per system and size; Δ smallest -> largest size with its
    Holm-adjusted p) and the cost table (wall s and peak MiB per step and size) of a result."""
    sizes = [str(s) for s in result["sizes"]]
    lines = ["| System | Articles | " + " | ".join(REPORTED) + " |", "|:---|---:|" + "---:|" * len(REPORTED)]
    for system, by_size in result["quality"].items():
        for size in sizes:
            if size in by_size:
                cells = " | ".join(f"{100 * by_size[size][m]:.1f}" for m in REPORTED)
                lines.append(f"| {system} | {int(size):,} | {cells} |")
    lines += ["", "| System | Metric | Δ (points) | 95 % CI | p (Holm) |", "|:---|:---|---:|---:|---:|"]
    for t in result["paired"]:
        low, high = (100 * x for x in t["ci95"])
        lines.append(
            f"| {t['system']} {t['small']:,} → {t['large']:,} | {t['metric']} | {100 * t['diff']:+.1f} | "
            f"[{low:+.1f}, {high:+.1f}] | {t['p_holm']:.4f} |"
        )
    against = result.get("against_bm25", [])
    if against:
        lines += [
            "",
            "| System | Metric | its Δ − bm25's Δ (points) | 95 % CI | p (Holm) |",
            "|:---|:---|---:|---:|---:|",
        ]
    for t in against:
        low, high = (100 * x for x in t["ci95"])
        cells = f"{100 * t['diff']:+.1f} | [{low:+.1f}, {high:+.1f}] | {t['p_holm']:.4f}"
        lines.append(f"| {t['system']} | {t['metric']} | {cells} |")
    lines += ["", "| System | Step | Articles | Wall s | CPU s | Peak RSS MiB |", "|:---|:---|---:|---:|---:|---:|"]
    for row in result["steps"]:
        size = "" if row["size"] is None else f"{row['size']:,}"
        note = f" ({row['encoded']:,} encoded, {row['from_cache']:,} cached)" if "encoded" in row else ""
        lines.append(
            f"| {row['system']} | {row['step']}{note} | {size} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} | "
            f"{row['peak_rss_mib']:.0f} |"
        )
    rows = cost_rows(result)
    columns = [c for c in rows[0] if c != "articles"]
    lines += ["", "| Articles | " + " | ".join(columns) + " |", "|---:|" + "---:|" * len(columns)]
    for row in rows:
        cells = " | ".join("" if row[c] is None else f"{row[c]:g}" for c in columns)
        lines.append(f"| {row['articles']:,} | {cells} |")
    rate = result.get("encode_rate")
    if rate:
        lines.append(
            f"\nencode_s: the distractors at the measured rate, {rate['per_s']:g} articles/s on {rate['threads']} "
            f"threads ({rate['articles']:,} articles in {rate['wall_s']:,} s)."
        )
    lines.append(
        f"\n{result['n_queries']} {result['split']} questions; {result['sample_articles']:,} sample articles plus "
        f"seeded distractors (seed {result['seed']}); paired randomisation test, {result['n_resamples']} resamples, "
        f"p Holm-adjusted within each table ({len(result['paired'])} and {len(against)} tests); {result['note']}."
    )
    return "\n".join(lines)


#: the cost chart's columns (``--plots``): a step of a size -> its column (seconds, summed)
COST_COLUMNS = {
    "fit": "bm25_fit_s",
    "search": "search_s",
    "index + search": "search_s",
    "build graph": "graph_build_s",
    "propagate": "graph_pass_s",
    "graph pass": "graph_pass_s",
    "fuse + search": "hybrid_s",
    "encode candidates + re-rank": "xrerank_s",
}


def cost_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per size: the distractors' encoding from scratch (their number at the measured
    ``encode_rate``), the seconds of each step of that size and the peak RSS of its steps."""
    rate = result.get("encode_rate")
    n_sample = result["sample_articles"]
    rows = []
    for size in result["sizes"]:
        row = {"articles": size, "encode_s": round((size - n_sample) / rate["per_s"], 1) if rate else None}
        row.update(dict.fromkeys(dict.fromkeys(COST_COLUMNS.values()), 0.0))
        mine = [s for s in result["steps"] if s["size"] == size]
        for step in mine:
            if step["step"] in COST_COLUMNS:
                row[COST_COLUMNS[step["step"]]] = round(row[COST_COLUMNS[step["step"]]] + step["wall_s"], 2)
        row["peak_rss_mib"] = max((s["peak_rss_mib"] for s in mine), default=None)
        rows.append(row)
    return rows


def write_plots(result: dict[str, Any], path: Path) -> None:
    """The cost chart's data (``dvc.yaml``'s ``french_law_cost`` plot) as CSV."""
    import csv
    import io

    from lexgraph.core.io import write_text

    rows = cost_rows(result)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(buffer.getvalue(), path)


# --------------------------------------------------------------------------- driver


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", type=Path, metavar="JSON", help="print the tables of an earlier --out and exit")
    parser.add_argument("--plots", type=Path, metavar="CSV", help="also write the cost per size as CSV (dvc plots)")
    parser.add_argument("--corpus", type=Path, help="fr-codes-2020's articles.jsonl.gz (required)")
    parser.add_argument("--workspace", type=Path, help="a reproduced lexgraph workspace, read only (required)")
    parser.add_argument("--out", type=Path, help="JSON file to write the results to (required)")
    parser.add_argument("--sizes", nargs="+", default=["2760", "22633", "all"], help="articles searched, or 'all'")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS, metavar="SYSTEM")
    parser.add_argument("--split", default="test", help="questions searched (default test)")
    parser.add_argument("--k", type=at_least(100), default=500, help="ranking depth (default 500)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="chunk windows per encoder call")
    parser.add_argument(
        "--cache", type=Path, help="directory keeping the distractors' chunk vectors: an interrupted run resumes"
    )
    parser.add_argument("--resamples", type=positive_int, default=10000)
    parser.add_argument("--seed", type=int, default=13, help="the distractors' permutation and the tests")
    return parser.parse_args(argv)


def read_result(path: Path) -> dict[str, Any]:
    """An earlier ``--out`` file, checked for the keys :func:`markdown_tables` reads."""
    from lexgraph.core.inputs import read_json_object

    return read_json_object(
        path,
        what="the JSON that benchmarks/french_law.py --out writes",
        fix="rerun benchmarks/french_law.py --out FILE",
        keys={
            key: (lambda v, t=t: isinstance(v, t), what)
            for key, t, what in (
                ("sizes", list, "a list of sizes"),
                ("quality", dict, "an object of systems"),
                ("paired", list, "a list of tests"),
                ("steps", list, "a list of steps"),
                ("note", str, "a string"),
            )
        },
    )


def check_out(out: Path) -> None:
    if out.is_dir():
        raise DataError(out, "is a directory; expected --out to name a JSON file")
    if not out.parent.is_dir():
        raise DataError(out, f"{out.parent} is not a directory; expected --out in an existing directory")


def run(args: argparse.Namespace) -> dict[str, Any]:
    missing = [f"--{name}" for name in ("corpus", "workspace", "out") if getattr(args, name) is None]
    if missing:
        raise LexgraphError(f"{', '.join(missing)} required (or --table JSON)")
    check_out(args.out)
    for size in args.sizes:
        if size != "all" and not size.isdigit():
            raise LexgraphError(f"--sizes: {size!r}, expected a number of articles or 'all'")
    steps = Steps()
    with steps.measure("read", "all", None):
        sample = read_sample(args.workspace, args.split)
        dis = read_corpus(args.corpus)
    if not sample.qids:
        raise LexgraphError(f"{args.workspace}: no {args.split!r} question in the clean questions")
    sizes = resolve_sizes(args.sizes, len(sample.ids), len(dis.ids))
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(dis.ids))
    dis = Distractors(dis.ids[order], [dis.texts[i] for i in order], [dis.paths[i] for i in order], dis.dropped)
    runs = size_runs(args, args.systems, sample, dis, sizes, steps)
    result = {
        "corpus": str(args.corpus),
        "workspace": str(args.workspace),
        "dropped_code": DROPPED_CODE,
        "dropped_articles": dis.dropped,
        "sample_articles": len(sample.ids),
        "distractors_available": len(dis.ids),
        "distractor_id_offset": DISTRACTOR_OFFSET,
        "sizes": sizes,
        "split": args.split,
        "n_queries": len(sample.qids),
        "k": args.k,
        "seed": args.seed,
        "n_resamples": args.resamples,
        "note": "distractors may answer a question too: scores at the larger sizes are a lower bound",
        **score(runs, sample.qrels, args.resamples, args.seed),
        "steps": steps.rows,
        "encode_rate": encode_rate(args.cache, steps.rows),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    from lexgraph.core.io import write_json

    write_json(result, args.out)
    log.info("wrote %s", args.out)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    try:
        result = read_result(args.table) if args.table else run(args)
        if args.plots:
            write_plots(result, args.plots)
        print(markdown_tables(result))
    except LexgraphError as exc:
        log.error("benchmarks/french_law.py: error: %s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
