"""Benchmark: lexgraph's BM25 against bm25s and rank_bm25 on French statute text.

    python benchmarks/bm25.py [--corpus PATH] [--copies N] [--queries 300] [--rank-bm25-queries 30] [--repeat 5]

Needs the ``dev`` extras (``pip install -e '.[dev]'``: rank_bm25, bm25s; numba is optional).

Corpus, ``--corpus PATH``, one of:

* a directory in BSARD's file layout: ``articles.csv`` (columns ``id``, ``article``) and
  ``questions_<split>.csv`` (``question``, ``article_ids``). The default is the project's
  embedded sample, ``data/sample`` (2,760 Code civil articles, 330 questions); a BSARD
  download (the hub's files) works the same way;
* JSON lines, one article per line with ``id`` (an integer) and ``text``: a ``.jsonl`` or
  ``.jsonl.gz`` file, or a directory holding ``articles.jsonl.gz`` or ``articles.jsonl``.
  That is the layout of the export of every French code in force, ``fr-codes-2020``
  (90,078 articles of 75 codes, 74 MB of text; Légifrance via Etalab's
  ``codes-juridiques-francais``, Licence Ouverte / Open Licence), four times BSARD's size:
  ``--corpus ../shared/data/fr-codes-2020`` where that folder exists. Nothing reads it by
  default.

Queries: the first ``--queries`` questions of the corpus' ``questions_<split>.csv`` (train,
dev, test, then any other but the synthetic ones); a corpus without questions (the JSON
lines exports) is searched with the embedded sample's questions.

``--copies`` replicates the articles (default 8 for the embedded sample: 22,080 articles,
about BSARD's 22,633; 1 for any other corpus). Copy 0 is the original; every other copy
shuffles the order of an article's sentences and the words inside each sentence, drops
~15 % of its words and inserts ~10 % words drawn from the corpus' own word distribution
(fixed seed), so the vocabulary and its document frequencies stay those of real statute
text while no two articles are identical (exact duplicates would make many exact score
ties, which real corpora do not have).

All systems get the same pre-tokenised input (lexgraph's FrenchAnalyzer: elisions,
stopwords, Snowball stemming); tokenisation is not timed. Index = build from tokens.
Search = top-100 for every query, from tokens, single-threaded (bm25s ``n_threads=1``;
lexgraph's kernel is single-threaded). Timings are process CPU time (``time.process_time``),
which stays meaningful on a shared machine; wall-clock queries/s are printed too. The
searches are timed in ``--repeat`` interleaved rounds (every system once per round, best
round kept), so a burst of load on the machine hits every system alike; rank_bm25, which
scores one query at a time in Python, on ``--rank-bm25-queries`` queries and two rounds.
Ratios are ``lexgraph / peer`` for queries/s and ``peer / lexgraph`` for index time and
memory: above 1 means lexgraph is better.

Memory. Each system is built and searched again in a fresh subprocess (this script with
``--memory-worker``) that loads the same token lists, warms the system up on a 200-article
slice (numba compiles there, not in the measurement), resets the kernel's peak-RSS counter
(``/proc/self/clear_refs``), then builds the index and runs the same searches. "peak MiB" is
the process' peak resident set (``VmHWM``) minus its resident set before the build: index
construction and search transients, numpy, numba and Python allocations alike (tracemalloc
would miss what numba allocates). "index MiB" is the resident growth once the index is
built (what it keeps, plus what the allocator did not give back). Linux only; "n/a"
elsewhere.

Agreement. The three differ only in how they treat a negative idf (terms in more than
half of the documents), so lexgraph is run with the matching policy for each check:

* rank_bm25 ``BM25Okapi`` replaces a negative idf by ``epsilon * mean(idf)``
  (epsilon = 0.25): lexgraph is given ``idf_floor = 0.25 * mean(raw idf)``, computed
  from its own document frequencies (and checked against rank_bm25's value).
* bm25s ``method="robertson"`` clamps a negative idf to 0 (lexgraph's ``idf_floor=0.0``,
  its default before issue 41) and leaves out the constant ``(k1 + 1)`` factor of the tf
  part, so its scores are multiplied by ``k1 + 1`` before comparing.

Reported: top-100 and top-10 lists identical (% of queries), mean overlap of the top-100
sets (%), and the largest relative score difference over the top-100. rank_bm25 and bm25s
break ties arbitrarily; lexgraph by lower article id. The same tie rule is applied to the
reference scores before comparing lists (the reference's full score vector, ranked by
(-score, id)), so "identical" means the scores order the articles the same way.
"""

from __future__ import annotations

import argparse
import csv
import gc
import gzip
import json
import pickle
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from lexgraph.core.arguments import OneLineParser, non_negative_int, positive_int
from lexgraph.core.inputs import json_lines, json_object
from lexgraph.data.schema import parse_article_ids
from lexgraph.methods.dsr.negatives import mine_from_index
from lexgraph.search.bm25 import BM25
from lexgraph.search.bm25_kernels import robertson_idf
from lexgraph.text.analyzer import FrenchAnalyzer

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "sample"
SPLIT_ORDER = ("train", "dev", "test")
K = 100
K1, B = 1.5, 0.75  # rank_bm25's defaults; any values work for the comparison
WARMUP_DOCS = 200


def fail(message: str) -> None:
    sys.exit(f"benchmarks/bm25.py: error: {message}")


def read_csv(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        fail(
            f"{path} not found; expected a corpus directory in BSARD's layout (articles.csv, "
            "questions_<split>.csv) or JSON lines (articles.jsonl[.gz]), see --corpus"
        )
    csv.field_size_limit(sys.maxsize)  # BSARD has long articles
    with path.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    missing = [c for c in columns if rows and c not in rows[0]]
    if not rows or missing:
        fail(
            f"{path} has {'no rows' if not rows else f'no column(s) {missing}'}; "
            f"expected the columns {', '.join(columns)}"
        )
    return rows


def read_questions(corpus: Path) -> list[dict]:
    """The questions of ``corpus/questions_<split>.csv`` (train, dev, test, then the others
    but synthetic), each ``{"question", "article_ids": [int, ...]}``; ``[]`` when there are none."""
    files = sorted(
        corpus.glob("questions_*.csv") if corpus.is_dir() else [],
        key=lambda p: (SPLIT_ORDER.index(p.stem[10:]) if p.stem[10:] in SPLIT_ORDER else len(SPLIT_ORDER), p.name),
    )
    out = []
    for path in (p for p in files if "synthetic" not in p.stem):
        for row in read_csv(path, ("question", "article_ids")):
            out.append({"question": row["question"], "article_ids": parse_article_ids(row["article_ids"])})
    return out


def jsonl_path(corpus: Path) -> Path | None:
    """The JSON-lines file ``corpus`` names (itself, or ``articles.jsonl[.gz]`` inside it), or None."""
    if corpus.is_file() and corpus.name.endswith((".jsonl", ".jsonl.gz")):
        return corpus
    for name in ("articles.jsonl.gz", "articles.jsonl"):
        if (corpus / name).is_file():
            return corpus / name
    return None


def read_articles(corpus: Path) -> list[tuple[int, str]]:
    """``(id, text)`` of every article of ``corpus`` (see the module docstring for the layouts)."""
    path = jsonl_path(corpus)
    if path is None:
        return [(int(row["id"]), row["article"]) for row in read_csv(corpus / "articles.csv", ("id", "article"))]
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        text = fh.read()
    out = []
    for n, line in json_lines(text):
        try:
            row = json_object(line)
            article_id, body = row["id"], row["text"]
        except (ValueError, KeyError, TypeError) as exc:
            fail(f"{path}, line {n}: {exc!r}; expected a JSON object with 'id' (integer) and 'text'")
        if not isinstance(article_id, int) or not isinstance(body, str):
            fail(f"{path}, line {n}: 'id' must be an integer and 'text' a string")
        out.append((article_id, body))
    if not out:
        fail(f"{path}: no articles")
    return out


def build_corpus(articles: list[tuple[int, str]], copies: int, seed: int) -> tuple[list[str], list[int]]:
    stride = 10 ** len(str(max(i for i, _ in articles)))  # copy c of article i: id c * stride + i
    rng = random.Random(seed)
    pool = [w for _, text in articles for w in text.split()] if copies > 1 else []  # the word distribution
    texts, ids = [], []
    for copy in range(copies):
        for article_id, body in articles:
            text = " ".join(body.split())
            if copy:
                sentences = [s.split() for s in re.split(r"(?<=[.;:])\s+", text) if s]
                rng.shuffle(sentences)
                words = []
                for sentence in sentences:
                    rng.shuffle(sentence)
                    for w in sentence:
                        if rng.random() > 0.15:
                            words.append(w)
                        if rng.random() < 0.10:
                            words.append(rng.choice(pool))
                text = " ".join(words or (sentences[0] if sentences else []))
            texts.append(text)
            ids.append(copy * stride + article_id)
    return texts, ids


# ------------------------------------------------------------------ the systems, alike for timing and memory


def make_index(system: str, corpus_tokens, doc_ids):
    if system == "lexgraph":
        return BM25(k1=K1, b=B, idf_floor=0.0).fit(corpus_tokens, doc_ids)  # bm25s robertson's floor (0)
    if system.startswith("bm25s-"):
        import bm25s

        model = bm25s.BM25(method="robertson", k1=K1, b=B, backend=system.removeprefix("bm25s-"))
        model.index(corpus_tokens, show_progress=False)
        return model
    import rank_bm25

    return rank_bm25.BM25Okapi(corpus_tokens, k1=K1, b=B, epsilon=0.25)


def search(system: str, index, queries, k: int = K):
    if system == "lexgraph":
        return index.search_tokens(queries, k)
    if system.startswith("bm25s-"):
        return index.retrieve(queries, k=k, show_progress=False, n_threads=1)
    out = []
    for q in queries:
        s = index.get_scores(q)
        out.append((s, np.argsort(s)[::-1][:k]))  # what rank_bm25's get_top_n does
    return out


def _status() -> dict[str, int]:
    with open("/proc/self/status", encoding="ascii") as fh:
        return {line.split(":")[0]: int(line.split()[1]) for line in fh if line.startswith(("VmRSS:", "VmHWM:"))}


def memory_worker(system: str, tokens_file: str) -> None:
    """``--memory-worker``: print ``{"peak": MiB, "index": MiB}`` for one system (module docstring)."""
    with open(tokens_file, "rb") as fh:
        corpus_tokens, doc_ids, queries, n_rank_bm25 = pickle.load(fh)
    if system == "rank_bm25":
        queries = queries[:n_rank_bm25]
    warm = make_index(system, corpus_tokens[:WARMUP_DOCS], doc_ids[:WARMUP_DOCS])
    search(system, warm, queries[:5], min(K, WARMUP_DOCS))
    del warm
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")  # reset VmHWM to the current RSS
        before = _status()["VmRSS"]
    except OSError:
        print(json.dumps({"peak": None, "index": None}))
        return
    index = make_index(system, corpus_tokens, doc_ids)
    built = _status()["VmRSS"]
    search(system, index, queries)
    print(json.dumps({"peak": (_status()["VmHWM"] - before) / 1024, "index": (built - before) / 1024}))


def measure_memory(system: str, tokens_file: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--memory-worker", system, str(tokens_file)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        print(f"memory worker for {system} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return {"peak": None, "index": None}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ agreement


def reference_topk(scores: np.ndarray, doc_ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank a reference system's full score vectors with lexgraph's tie rule (-score, then id)."""
    ids = np.empty((len(scores), k), dtype=np.int64)
    vals = np.empty((len(scores), k), dtype=np.float64)
    for i, row in enumerate(scores):
        order = np.lexsort((doc_ids, -row))[:k]
        ids[i], vals[i] = doc_ids[order], row[order]
    return ids, vals


def agreement(ours_ids, ours_scores, ref_ids, ref_scores) -> dict[str, float]:
    rel = np.abs(ours_scores.astype(np.float64) - ref_scores) / np.maximum(np.abs(ref_scores), 1e-9)
    return {
        f"top{ours_ids.shape[1]}_identical_%": float(np.mean(np.all(ours_ids == ref_ids, axis=1)) * 100),
        "top10_identical_%": float(np.mean(np.all(ours_ids[:, :10] == ref_ids[:, :10], axis=1)) * 100),
        "overlap@100_%": float(np.mean([len(set(a) & set(b)) / len(a) for a, b in zip(ours_ids, ref_ids)]) * 100),
        "max_rel_score_diff": float(rel.max()),
    }


def fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def main() -> None:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--corpus",
        type=Path,
        default=DATA,
        help="BSARD-layout directory, or JSON lines (.jsonl[.gz] file, or a directory with "
        "articles.jsonl[.gz]) with 'id' and 'text' (default: the embedded sample, data/sample)",
    )
    parser.add_argument(
        "--copies",
        type=positive_int,
        default=None,
        help="replicate the articles (default: 8 for the embedded sample, else 1)",
    )
    parser.add_argument("--queries", type=positive_int, default=300)
    parser.add_argument("--rank-bm25-queries", type=positive_int, default=30)
    parser.add_argument("--repeat", type=positive_int, default=5, help="interleaved search rounds (best kept)")
    parser.add_argument(
        "--index-repeat", type=positive_int, default=2, help="index builds per system but rank_bm25 (best kept)"
    )
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--no-memory", action="store_true", help="skip the per-system memory subprocesses")
    parser.add_argument(
        "--negatives",
        type=non_negative_int,
        default=120_000,
        help="also time BM25 negative mining (k1=1.0, b=0.6, depth 500, k 10) for this many "
        "queries (the questions repeated); 0 to skip",
    )
    parser.add_argument("--memory-worker", nargs=2, metavar=("SYSTEM", "TOKENS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_worker:
        memory_worker(*args.memory_worker)
        return

    copies = args.copies if args.copies is not None else (8 if args.corpus.resolve() == DATA.resolve() else 1)
    texts, ids = build_corpus(read_articles(args.corpus), copies, args.seed)
    records = read_questions(args.corpus)
    query_source = args.corpus
    if not records:
        records, query_source = read_questions(DATA), DATA
    questions = [r["question"] for r in records][: args.queries]
    analyzer = FrenchAnalyzer()
    start = time.perf_counter()
    corpus_tokens = [[sys.intern(t) for t in doc] for doc in analyzer.analyze_many(texts)]
    query_tokens = analyzer.analyze_many(questions)
    t_analyze = time.perf_counter() - start
    del texts
    n_tok = sum(map(len, corpus_tokens))
    print(
        f"corpus: {args.corpus} x {copies}: {len(corpus_tokens)} articles, {n_tok} tokens "
        f"({n_tok / len(corpus_tokens):.1f}/article), {len({t for d in corpus_tokens for t in d})} terms; "
        f"{len(questions)} queries from {query_source} ({np.mean([len(q) for q in query_tokens]):.1f} tokens/query); "
        f"analysis {t_analyze:.2f} s (untimed below)",
        flush=True,
    )
    # rank_bm25 ranks in corpus order and lexgraph by article id: give everyone the corpus sorted by id
    order = np.argsort(ids, kind="stable")
    corpus_tokens = [corpus_tokens[i] for i in order]
    doc_ids = np.asarray(ids, dtype=np.int64)[order]

    systems = ["lexgraph", "bm25s-numpy"]
    try:
        import numba  # noqa: F401

        systems.insert(1, "bm25s-numba")
    except ImportError:
        pass
    systems.append("rank_bm25")
    sub = query_tokens[: args.rank_bm25_queries]
    timed = {s: (sub if s == "rank_bm25" else query_tokens) for s in systems}

    index, t_index = {}, {}
    for system in systems:
        t_index[system] = float("inf")
        for _ in range(1 if system == "rank_bm25" else args.index_repeat):
            gc.collect()
            start = time.process_time()
            index[system] = make_index(system, corpus_tokens, doc_ids)
            t_index[system] = min(t_index[system], time.process_time() - start)
        search(system, index[system], timed[system][:5])  # warm-up (numba compiles on first call)
        print(f"  built {system} in {t_index[system]:.2f} s CPU", flush=True)

    t_search = {s: float("inf") for s in systems}
    wall = dict(t_search)
    results = {}
    for r in range(args.repeat):
        for system in systems:
            if system == "rank_bm25" and r >= 2:
                continue
            gc.collect()
            start, start_wall = time.process_time(), time.perf_counter()
            results[system] = search(system, index[system], timed[system])
            t_search[system] = min(t_search[system], time.process_time() - start)
            wall[system] = min(wall[system], time.perf_counter() - start_wall)
    qps = {s: len(timed[s]) / t_search[s] for s in systems}

    # agreement, each peer under lexgraph's tie rule and the peer's idf policy
    ours_ids, ours_scores = results["lexgraph"]
    agree, raw_top10 = {}, {}
    for system in systems[1:-1]:
        bs = index[system]
        full = np.stack([bs.get_scores(q) for q in query_tokens]) * (K1 + 1)
        agree[system] = agreement(ours_ids, ours_scores, *reference_topk(full, doc_ids, K))
        bs_docs = results[system][0]
        raw_top10[system] = float(
            np.mean([np.array_equal(ours_ids[i, :10], doc_ids[bs_docs[i, :10]]) for i in range(len(query_tokens))])
            * 100
        )
    rb = index["rank_bm25"]
    floor = 0.25 * float(np.mean(robertson_idf(index["lexgraph"].doc_freq, index["lexgraph"].n_docs, None)))
    assert abs(floor - rb.average_idf * rb.epsilon) < 1e-9 * max(1.0, abs(floor)), (floor, rb.average_idf)
    matched = BM25(k1=K1, b=B, idf_floor=floor).fit(corpus_tokens, doc_ids)
    m_ids, m_scores = matched.search_tokens(sub, K)
    rb_out = results["rank_bm25"]
    agree["rank_bm25"] = agreement(m_ids, m_scores, *reference_topk(np.stack([s for s, _ in rb_out]), doc_ids, K))
    raw_top10["rank_bm25"] = float(
        np.mean([np.array_equal(m_ids[i, :10], doc_ids[top[:10]]) for i, (_, top) in enumerate(rb_out)]) * 100
    )
    del matched, results

    memory = {s: {"peak": None, "index": None} for s in systems}
    if not args.no_memory:
        del index
        gc.collect()
        with tempfile.TemporaryDirectory() as tmp:
            tokens_file = Path(tmp) / "tokens.pkl"
            with tokens_file.open("wb") as fh:
                pickle.dump((corpus_tokens, doc_ids, query_tokens, len(sub)), fh, protocol=pickle.HIGHEST_PROTOCOL)
            for system in systems:
                memory[system] = measure_memory(system, tokens_file)
                print(f"  memory of {system}: {memory[system]}", flush=True)

    print()
    print(f"top-{K} search, k1={K1}, b={B}, single thread, process CPU time; index = build from tokens")
    header = (
        f"{'system':<22}{'index s':>9}{'peak MiB':>10}{'index MiB':>11}{'queries/s':>11}{'ms/query':>10}"
        f"{'wall q/s':>10}{'n timed':>9}"
    )
    print(header)
    print("-" * len(header))
    for s in systems:
        print(
            f"{s:<22}{t_index[s]:>9.2f}{fmt(memory[s]['peak'], '.0f'):>10}{fmt(memory[s]['index'], '.0f'):>11}"
            f"{qps[s]:>11.1f}{1000 / qps[s]:>10.3f}{len(timed[s]) / wall[s]:>10.1f}{len(timed[s]):>9}"
        )
    print()
    print(
        "lexgraph against each peer (above 1: lexgraph better): queries/s = lexgraph / peer (CPU; wall in "
        "brackets); index time and memory = peer / lexgraph"
    )
    for s in systems[1:]:
        mem = memory[s]["peak"], memory["lexgraph"]["peak"]
        peak = "n/a" if None in mem else f"{mem[0] / max(mem[1], 1e-9):.2f}x"
        wall_ratio = (len(timed["lexgraph"]) / wall["lexgraph"]) / (len(timed[s]) / wall[s])
        print(
            f"  vs {s:<18} queries/s {qps['lexgraph'] / qps[s]:8.2f}x ({wall_ratio:.2f}x)   "
            f"index time {t_index[s] / t_index['lexgraph']:6.2f}x   peak memory {peak}"
        )
    print()
    print("agreement with lexgraph (same idf policy; the peer's scores ranked by lexgraph's tie rule):")
    for s, a in agree.items():
        print(
            f"  {s:<18} "
            + ", ".join(f"{k} {v:.4g}" for k, v in a.items())
            + f"; raw top-10 in the peer's own tie order {raw_top10[s]:.1f} %"
        )
    print(f"median tokens/query {statistics.median(len(q) for q in query_tokens)}")

    if args.negatives:
        all_tokens = analyzer.analyze_many([r["question"] for r in records])
        reps = -(-args.negatives // len(records))
        tokens = (all_tokens * reps)[: args.negatives]
        gold = ([r["article_ids"] for r in records] * reps)[: args.negatives]
        miner = BM25(k1=1.0, b=0.6).fit(corpus_tokens, doc_ids)
        start, start_wall = time.process_time(), time.perf_counter()
        negs = mine_from_index(miner, tokens, gold, k=10, depth=500)
        t_neg, t_neg_wall = time.process_time() - start, time.perf_counter() - start_wall
        print(
            f"negative mining: {len(tokens)} queries x {miner.n_docs} articles (k=10 of top-500, gold removed): "
            f"{t_neg:.1f} s CPU, {t_neg_wall:.1f} s wall = {len(tokens) / t_neg_wall:.0f} queries/s "
            f"wall; mean {np.mean([len(n) for n in negs]):.2f} negatives/query"
        )


if __name__ == "__main__":
    main()
