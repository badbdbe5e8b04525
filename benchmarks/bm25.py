"""Benchmark: lexgraph's BM25 against rank_bm25 and bm25s on a BSARD-sized French corpus.

    .venv/bin/python benchmarks/bm25.py [--corpus data/sample] [--copies 8] [--queries 300] [--rank-bm25-queries 30]

Needs the ``dev`` extras (``pip install -e '.[dev]'``: rank_bm25, bm25s; numba is optional).

Corpus: ``--corpus DIR``, a directory in BSARD's file layout: ``articles.csv`` (columns
``id``, ``article``) and ``questions_<split>.csv`` (``question``, ``article_ids``). The
default is the project's own embedded sample, ``data/sample`` (2,760 Code civil
articles, 330 questions); a BSARD download (the hub's files) works the same way, with
``--copies 1``. The articles are replicated ``--copies`` times (default 8: 22,080 sample
articles, about BSARD's 22,633). Copy 0 is the original; every other copy shuffles the
order of an article's sentences and the words inside each sentence, drops ~15 % of its
words and inserts ~10 % words drawn from the corpus' own word distribution (fixed seed),
so the vocabulary and its document frequencies stay those of real statute text while no
two articles are identical (exact duplicates would make many exact score ties, which real
BSARD does not have). Queries: the first ``--queries`` questions of the train, dev and test
files, in that order (then any other ``questions_*.csv`` but the synthetic ones).

All three systems get the same pre-tokenised input (lexgraph's FrenchAnalyzer:
elisions, stopwords, Snowball stemming); tokenisation is not timed. Search = top-100
for every query, timed end to end from tokens (best of ``--repeat`` runs; rank_bm25,
which scores one query at a time in Python, on a subset and reported per query).
Timings are process CPU time (``time.process_time``, every system single-threaded),
which stays meaningful on a shared machine; wall-clock numbers are printed too.

Agreement. The three differ only in how they treat a negative idf (terms in more than
half of the documents), so lexgraph is run with the matching policy for each check:

* rank_bm25 ``BM25Okapi`` replaces a negative idf by ``epsilon * mean(idf)``
  (epsilon = 0.25): lexgraph is given ``idf_floor = 0.25 * mean(raw idf)``, computed
  from its own document frequencies (and checked against rank_bm25's value).
* bm25s ``method="robertson"`` clamps a negative idf to 0 (lexgraph's default
  ``idf_floor=0.0``) and leaves out the constant ``(k1 + 1)`` factor of the tf part,
  so its scores are multiplied by ``k1 + 1`` before comparing.

Reported: top-10 lists identical (%), mean overlap of the top-100 sets (%), and the
largest relative score difference over the top-100. rank_bm25 and bm25s break ties
arbitrarily; lexgraph by lower article id. The same tie rule is applied to the
reference scores before comparing lists (the reference's full score vector, ranked
by (-score, id)), so "identical" means the scores order the articles the same way.
"""

from __future__ import annotations

import argparse
import csv
import random
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from lexgraph.data.schema import parse_article_ids  # noqa: E402
from lexgraph.negatives import mine_from_index  # noqa: E402
from lexgraph.retrieval.bm25 import BM25  # noqa: E402
from lexgraph.retrieval.bm25_kernels import robertson_idf  # noqa: E402
from lexgraph.text import FrenchAnalyzer  # noqa: E402

DATA = ROOT / "data" / "sample"
SPLIT_ORDER = ("train", "dev", "test")
K = 100
K1, B = 1.5, 0.75  # rank_bm25's defaults; any values work for the comparison


def read_csv(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        sys.exit(f"benchmarks/bm25.py: error: {path} not found; expected a corpus directory in BSARD's layout "
                 "(articles.csv, questions_<split>.csv), see --corpus")
    csv.field_size_limit(sys.maxsize)  # BSARD has long articles
    with path.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    missing = [c for c in columns if rows and c not in rows[0]]
    if not rows or missing:
        sys.exit(f"benchmarks/bm25.py: error: {path} has {'no rows' if not rows else f'no column(s) {missing}'}; "
                 f"expected the columns {', '.join(columns)}")
    return rows


def read_questions(corpus: Path) -> list[dict]:
    """The questions of ``corpus/questions_<split>.csv`` (train, dev, test, then the others
    but synthetic), each ``{"question", "article_ids": [int, ...]}``."""
    files = sorted(corpus.glob("questions_*.csv"), key=lambda p: (
        SPLIT_ORDER.index(p.stem[10:]) if p.stem[10:] in SPLIT_ORDER else len(SPLIT_ORDER), p.name))
    files = [p for p in files if "synthetic" not in p.stem]
    if not files:
        sys.exit(f"benchmarks/bm25.py: error: no questions_<split>.csv in {corpus}; see --corpus")
    out = []
    for path in files:
        for row in read_csv(path, ("question", "article_ids")):
            out.append({"question": row["question"], "article_ids": parse_article_ids(row["article_ids"])})
    return out


def build_corpus(corpus: Path, copies: int, seed: int) -> tuple[list[str], list[int]]:
    articles = read_csv(corpus / "articles.csv", ("id", "article"))
    stride = 10 ** len(str(max(int(art["id"]) for art in articles)))  # copy c of article i: id c * stride + i
    rng = random.Random(seed)
    pool = [w for art in articles for w in art["article"].split()]  # the corpus' word distribution
    texts, ids = [], []
    for copy in range(copies):
        for art in articles:
            text = " ".join(art["article"].split())
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
                text = " ".join(words or sentences[0])
            texts.append(text)
            ids.append(copy * stride + int(art["id"]))
    return texts, ids


WALL: dict[str, float] = {}


def best_time(fn, repeat: int, label: str = "") -> tuple[float, object]:
    """Best process CPU time of ``repeat`` calls (wall-clock best kept in ``WALL[label]``)."""
    best, best_wall, result = float("inf"), float("inf"), None
    for _ in range(repeat):
        start, start_wall = time.process_time(), time.perf_counter()
        result = fn()
        best = min(best, time.process_time() - start)
        best_wall = min(best_wall, time.perf_counter() - start_wall)
    WALL[label] = best_wall
    return best, result


def reference_topk(scores: np.ndarray, doc_ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank a reference system's full score vectors with lexgraph's tie rule (-score, then id)."""
    ids = np.empty((len(scores), k), dtype=np.int64)
    vals = np.empty((len(scores), k), dtype=np.float64)
    for i, row in enumerate(scores):
        order = np.lexsort((doc_ids, -row))[:k]
        ids[i], vals[i] = doc_ids[order], row[order]
    return ids, vals


def agreement(ours_ids, ours_scores, ref_ids, ref_scores) -> dict[str, float]:
    top10 = np.mean([np.array_equal(a[:10], b[:10]) for a, b in zip(ours_ids, ref_ids)]) * 100
    overlap = np.mean([len(set(a) & set(b)) / len(a) for a, b in zip(ours_ids, ref_ids)]) * 100
    rel = np.abs(ours_scores.astype(np.float64) - ref_scores) / np.maximum(np.abs(ref_scores), 1e-9)
    return {"top10_identical_%": float(top10), "overlap@100_%": float(overlap), "max_rel_score_diff": float(rel.max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=DATA,
                        help="directory with articles.csv and questions_<split>.csv (default: the embedded sample, "
                             "data/sample)")
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rank-bm25-queries", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--negatives", type=int, default=120_000,
                        help="also time BM25 negative mining (k1=1.0, b=0.6, depth 500, k 10) for this many "
                             "queries (the questions repeated); 0 to skip")
    args = parser.parse_args()

    import bm25s
    import rank_bm25

    texts, ids = build_corpus(args.corpus, args.copies, args.seed)
    records = read_questions(args.corpus)
    questions = [r["question"] for r in records][: args.queries]
    analyzer = FrenchAnalyzer()
    start = time.perf_counter()
    corpus_tokens = analyzer.analyze_many(texts)
    query_tokens = analyzer.analyze_many(questions)
    t_analyze = time.perf_counter() - start
    n_tok = sum(map(len, corpus_tokens))
    print(f"corpus: {args.corpus} x {args.copies}: {len(texts)} articles, {n_tok} tokens ({n_tok / len(texts):.1f}/article), "
          f"{len(set(t for d in corpus_tokens for t in d))} terms; {len(questions)} queries "
          f"({np.mean([len(q) for q in query_tokens]):.1f} tokens/query); analysis {t_analyze:.2f} s (untimed below)")
    # rank_bm25 ranks in corpus order and lexgraph by article id: give everyone the corpus sorted by id
    order = np.argsort(ids, kind="stable")
    corpus_tokens = [corpus_tokens[i] for i in order]
    doc_ids = np.asarray(ids, dtype=np.int64)[order]
    rows = []

    # (a) lexgraph, default idf policy (floor 0: same as bm25s robertson)
    t_index, ours = best_time(lambda: BM25(k1=K1, b=B).fit(corpus_tokens, doc_ids), 1)
    t_search, (ours_ids, ours_scores) = best_time(lambda: ours.search_tokens(query_tokens, K), args.repeat, "lexgraph")
    lex_qps = len(query_tokens) / t_search
    rows.append(("lexgraph BM25", t_index, lex_qps, len(query_tokens), "-", "lexgraph"))

    # (b) rank_bm25 BM25Okapi, on a subset of queries
    t_rb_index, rb = best_time(lambda: rank_bm25.BM25Okapi(corpus_tokens, k1=K1, b=B, epsilon=0.25), 1)
    sub = query_tokens[: args.rank_bm25_queries]

    def rank_bm25_search():
        out = []
        for q in sub:
            s = rb.get_scores(q)
            out.append((s, np.argsort(s)[::-1][:K]))  # what rank_bm25's get_top_n does
        return out

    t_rb, rb_out = best_time(rank_bm25_search, 1, "rank_bm25")
    rb_qps = len(sub) / t_rb
    floor = 0.25 * float(np.mean(robertson_idf(ours.doc_freq, ours.n_docs, None)))
    assert abs(floor - rb.average_idf * rb.epsilon) < 1e-9 * max(1.0, abs(floor)), (floor, rb.average_idf)
    matched = BM25(k1=K1, b=B, idf_floor=floor).fit(corpus_tokens, doc_ids)
    m_ids, m_scores = matched.search_tokens(sub, K)
    r_ids, r_scores = reference_topk(np.stack([s for s, _ in rb_out]), doc_ids, K)
    agree_rb = agreement(m_ids, m_scores, r_ids, r_scores)
    raw_top10 = np.mean([np.array_equal(m_ids[i, :10], doc_ids[top[:10]]) for i, (_, top) in enumerate(rb_out)]) * 100
    rows.append(("rank_bm25 BM25Okapi", t_rb_index, rb_qps, len(sub), agree_rb, "rank_bm25"))

    # (c) bm25s, robertson, numpy backend (its default) and numba backend when numba is installed
    backends = ["numpy"]
    try:
        import numba  # noqa: F401

        backends.append("numba")
    except ImportError:
        pass
    bm25s_qps = {}
    for backend in backends:
        def index(backend=backend):
            model = bm25s.BM25(method="robertson", k1=K1, b=B, backend=backend)
            model.index(corpus_tokens, show_progress=False)
            return model

        t_bs_index, bs = best_time(index, 1)
        retrieve = lambda: bs.retrieve(query_tokens, k=K, show_progress=False, n_threads=1)  # noqa: E731
        retrieve()  # warm-up (numba compiles on first call)
        t_bs, (bs_docs, bs_scores) = best_time(retrieve, args.repeat, f"bm25s-{backend}")
        bm25s_qps[backend] = len(query_tokens) / t_bs
        full = np.stack([bs.get_scores(q) for q in query_tokens]) * (K1 + 1)
        b_ids, b_scores = reference_topk(full, doc_ids, K)
        agree_bs = agreement(ours_ids, ours_scores, b_ids, b_scores)
        agree_bs["raw_top10_identical_%"] = float(np.mean(
            [np.array_equal(ours_ids[i, :10], doc_ids[bs_docs[i, :10]]) for i in range(len(query_tokens))]) * 100)
        rows.append((f"bm25s robertson ({backend})", t_bs_index, bm25s_qps[backend], len(query_tokens), agree_bs,
                     f"bm25s-{backend}"))

    print()
    print(f"top-{K} search, k1={K1}, b={B}, single thread; index = build from tokens")
    header = (f"{'system':<28}{'index s':>9}{'queries/s':>12}{'ms/query':>10}{'wall q/s':>10}{'n timed':>9}"
              "  agreement with lexgraph (same idf policy)")
    print(header)
    print("-" * len(header))
    for name, t_idx, qps, n, agree, label in rows:
        if isinstance(agree, dict):
            agree = ", ".join(f"{k} {v:.4g}" for k, v in agree.items())
        print(f"{name:<28}{t_idx:>9.2f}{qps:>12.1f}{1000 / qps:>10.3f}{n / WALL[label]:>10.1f}{n:>9}  {agree}")
    print()
    print(f"rank_bm25 raw top-10 (its own argsort tie order) identical to lexgraph: {raw_top10:.1f} %")
    print(f"speed-up lexgraph vs rank_bm25:            {lex_qps / rb_qps:8.1f}x  (goal >= 250x)")
    for backend, qps in bm25s_qps.items():
        print(f"speed-up lexgraph vs bm25s ({backend + ')':<7}       {lex_qps / qps:8.1f}x")
    print(f"rank_bm25 per query: {1000 / rb_qps:.2f} ms; lexgraph per query: {1000 / lex_qps:.3f} ms; "
          f"median tokens/query {statistics.median(len(q) for q in query_tokens)}")

    if args.negatives:
        all_tokens = analyzer.analyze_many([r["question"] for r in records])
        reps = -(-args.negatives // len(records))
        tokens = (all_tokens * reps)[: args.negatives]
        gold = ([r["article_ids"] for r in records] * reps)[: args.negatives]
        miner = BM25(k1=1.0, b=0.6).fit(corpus_tokens, doc_ids)
        t_neg, negs = best_time(lambda: mine_from_index(miner, tokens, gold, k=10, depth=500), 1, "negatives")
        print(f"negative mining: {len(tokens)} queries x {miner.n_docs} articles (k=10 of top-500, gold removed): "
              f"{t_neg:.1f} s CPU, {WALL['negatives']:.1f} s wall = {len(tokens) / WALL['negatives']:.0f} queries/s "
              f"wall; mean {np.mean([len(n) for n in negs]):.2f} negatives/query")


if __name__ == "__main__":
    main()
