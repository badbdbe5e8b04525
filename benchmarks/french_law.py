"""Benchmark: the sample's test questions against all of French law (issue 26, item 3).

    .venv/bin/python benchmarks/french_law.py --corpus PATH/articles.jsonl.gz --workspace W --out OUT.json
        [--sizes 2760 22633 all] [--systems bm25 zeroshot dsr hprior] [--cache DIR] [--seed 13] [--resamples 10000]
    .venv/bin/python benchmarks/french_law.py --table OUT.json   # the Markdown tables of a saved result

``--corpus`` is fr-codes-2020's ``articles.jsonl.gz`` (one JSON object a line: ``id``, ``code``,
``path`` a list of headings, ``text``); nothing is read from ``../shared`` by default. Its own
"Code civil" is dropped (its 2020 text renumbers the 2015 law the labels point at) and the
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
* ``hprior``: the DSR vectors of the distractors propagated through their own hierarchy (the code,
  then its ``path``) with the workspace's weight and scope; the sample's vectors are the
  workspace's (the codes' trees are disjoint, so the sample's means do not change).
* The graph systems (gdsr, qabisar, hgraph*) and those built on them are not measured yet.

Per size and system: search the test questions (top-``--k``), score them with lexgraph's metrics,
and, per system, compare the smallest size with the largest on recall@100, map and ndcg@10 (paired
randomisation test, p Holm-adjusted over every test of the run). Every step (read, fit, encode,
aggregate, search) reports its wall and CPU seconds and the peak resident memory sampled while it
ran; the chunk encoding is incremental over the nested sizes, and its cost at a size is the sum
of the increments up to it. ``--cache DIR`` keeps the distractors' chunk vectors in blocks of
:data:`BLOCK` (keyed by the corpus, the seed, the windows and the base encoder): an interrupted run
resumes there, and a step's ``from_cache`` articles cost nothing (its ``encoded`` ones are the cost).
Writes everything to ``--out`` (JSON) and prints the tables (:func:`markdown_tables`).

Measured on 1 thread of a shared 2-core machine: the chunk encoding is the whole cost (about 10
distractors a second; BM25 fits 91k articles in 7 s), so the 91k run is about 2.5 hours on one
thread; split it with ``--cache`` (each run adds a size).
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
SYSTEMS = ("bm25", "zeroshot", "dsr", "hprior")
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


def bm25_runs(workspace: Path, sample: Sample, dis: Distractors, sizes: list[int], k: int, steps: Steps):
    from lexgraph.search.bm25 import BM25, load_system

    saved = load_system(workspace)
    runs = {}
    for size in sizes:
        m = size - len(sample.ids)
        with steps.measure("fit", "bm25", size):
            index = BM25(k1=saved.k1, b=saved.b, idf_floor=saved.idf_floor, analyzer=saved.analyzer_config)
            index.fit_texts(sample.texts + dis.texts[:m], np.concatenate([sample.ids, dis.ids[:m]]))
        with steps.measure("search", "bm25", size):
            ids, _ = index.search(sample.questions, min(k, size))
        runs[size] = {q: [int(a) for a in row if a >= 0] for q, row in zip(sample.qids, ids)}
        del index
    return runs


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
    table = encode_chunk_table(encoder, dis.ids[start:end], dis.texts[start:end], batch, desc="encode distractors")
    if path is not None:
        save_chunk_table(table, path)
    return table, False


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


def path_prior(paths: Sequence[tuple[str, ...]], vectors, weight: float, scope: int):
    """``u_a + weight * mean(u_b : b under the heading scope levels above a's deepest)``, the
    hierarchy prior of :mod:`lexgraph.graph.hierarchy` over heading paths (clamped at the top)."""
    import torch
    import torch.nn.functional as F

    u = F.normalize(vectors.float(), dim=-1)  # (n, dim)
    if weight == 0 or not len(paths):
        return u
    heads: dict[tuple[str, ...], int] = {}
    rows, cols, target = [], [], []
    for a, p in enumerate(paths):
        for depth in range(1, len(p) + 1):
            rows.append(a)
            cols.append(heads.setdefault(p[:depth], len(heads)))
        target.append(heads[p[: max(1, len(p) - scope)]])
    sums = torch.zeros(len(heads), u.size(1)).index_add_(0, torch.tensor(cols), u[torch.tensor(rows)])
    counts = torch.zeros(len(heads)).index_add_(0, torch.tensor(cols), torch.ones(len(cols)))
    means = sums / counts.clamp(min=1).unsqueeze(1)
    return u + weight * means[torch.tensor(target)]


def dense_runs(args: argparse.Namespace, systems: list[str], sample: Sample, dis: Distractors, sizes, steps):
    """``{system: {size: run}}`` of the dense systems named in ``systems``."""
    import torch

    from lexgraph.core import layout
    from lexgraph.graph.hierarchy import read_hprior
    from lexgraph.systems.dense import DenseRetriever, load_dsr
    from lexgraph.systems.hprior import load_hprior
    from lexgraph.systems.zeroshot import load_system as load_zeroshot

    loaders = {"zeroshot": load_zeroshot, "dsr": load_dsr, "hprior": load_hprior}
    workspace, k = args.workspace, args.k
    with steps.measure("load models", "zeroshot+dsr", None):
        encoder, dsr, settings = chunk_encoder(workspace)
        cache = open_cache(args.cache, cache_key(workspace, args.corpus, args.seed, settings))
    vectors = encode_distractors(encoder, dsr, dis, sizes, len(sample.ids), args.batch_size, steps, cache)
    del encoder, dsr
    runs: dict[str, dict[int, dict]] = {}
    for system in systems:
        with steps.measure("load + encode questions", system, None):
            retriever = loaders[system](workspace, "cpu")
            queries = retriever.encode(sample.questions)  # (q, dim)
        own = retriever.article_embeddings  # (A, dim), sorted by id
        if system == "hprior":
            report = read_hprior(layout.HPRIOR.under(workspace))
            with steps.measure("propagate", system, sizes[-1], scope=report["scope"], weight=report["weight"]):
                extra = path_prior(dis.paths[: len(vectors["dsr"])], vectors["dsr"], report["weight"], report["scope"])
        else:
            extra = vectors[system]
        runs[system] = {}
        for size in sizes:
            m = size - len(sample.ids)
            with steps.measure("index + search", system, size):
                index = DenseRetriever(
                    None,
                    np.concatenate([retriever.article_ids, dis.ids[:m]]),
                    torch.cat([own.float(), extra[:m].float()]),
                    name=system,
                )
                ids, _ = index.search_embeddings(queries, min(k, size))
            runs[system][size] = {q: [int(a) for a in row if a >= 0] for q, row in zip(sample.qids, ids)}
            del index
    return runs


# --------------------------------------------------------------------------- scoring


def score(runs: dict[str, dict[int, dict]], qrels, n_resamples: int, seed: int) -> dict[str, Any]:
    """Metrics per system and size, and per system the smallest size against the largest (paired
    randomisation test, bootstrap CI of the difference; p Holm-adjusted over the whole family)."""
    from lexgraph.metrics.ir import evaluate_run
    from lexgraph.metrics.significance import (
        bootstrap_ci,
        holm_adjust,
        paired_randomization_test,
        per_query_scores,
    )

    quality = {
        system: {
            str(size): {m: round(v, 4) for m, v in evaluate_run(run, qrels).items() if m in REPORTED}
            for size, run in by_size.items()
        }
        for system, by_size in runs.items()
    }
    tests = []
    for system, by_size in runs.items():
        small, large = min(by_size), max(by_size)
        if small == large:
            continue
        for metric in COMPARED:
            a = per_query_scores(by_size[large], qrels, metric)
            b = per_query_scores(by_size[small], qrels, metric)
            diff = np.array([a[q] - b[q] for q in qrels])
            tests.append(
                {
                    "system": system,
                    "metric": metric,
                    "small": small,
                    "large": large,
                    "diff": round(float(diff.mean()), 4),
                    "p_value": paired_randomization_test(
                        [a[q] for q in qrels], [b[q] for q in qrels], n_resamples, seed
                    ),
                    "ci95": [round(float(x), 4) for x in bootstrap_ci(diff, n_resamples, seed=seed)],
                }
            )
    for test, p in zip(tests, holm_adjust([t["p_value"] for t in tests])):
        test["p_value"], test["p_holm"] = round(test["p_value"], 4), round(p, 4)
    return {"quality": quality, "paired": tests}


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
    lines += ["", "| System | Step | Articles | Wall s | CPU s | Peak RSS MiB |", "|:---|:---|---:|---:|---:|---:|"]
    for row in result["steps"]:
        size = "" if row["size"] is None else f"{row['size']:,}"
        note = f" ({row['encoded']:,} encoded, {row['from_cache']:,} cached)" if "encoded" in row else ""
        lines.append(
            f"| {row['system']} | {row['step']}{note} | {size} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} | "
            f"{row['peak_rss_mib']:.0f} |"
        )
    lines.append(
        f"\n{result['n_queries']} {result['split']} questions; {result['sample_articles']:,} sample articles plus "
        f"seeded distractors (seed {result['seed']}); paired randomisation test, {result['n_resamples']} resamples, "
        f"p Holm-adjusted over {len(result['paired'])} tests; {result['note']}."
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- driver


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", type=Path, metavar="JSON", help="print the tables of an earlier --out and exit")
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
    runs = {}
    if "bm25" in args.systems:
        runs["bm25"] = bm25_runs(args.workspace, sample, dis, sizes, args.k, steps)
    dense = [s for s in args.systems if s != "bm25"]
    if dense:
        runs.update(dense_runs(args, dense, sample, dis, sizes, steps))
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
        if args.table:
            print(markdown_tables(read_result(args.table)))
        else:
            print(markdown_tables(run(args)))
    except LexgraphError as exc:
        log.error("benchmarks/french_law.py: error: %s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
