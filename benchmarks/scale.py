"""Scale benchmark: dense search (FAISS Flat / IVF / HNSW) and BM25 (lexgraph vs bm25s) on a
synthetic corpus of ``--n`` articles (default 1,000,000) built from the project's sample.

    .venv/bin/python benchmarks/scale.py [--n 1000000] [--skip-bm25] [--skip-dense]

Needs ``faiss-cpu`` (a main dependency) and, for the BM25 peer, the ``dev`` extras (bm25s,
numba). Reads ``data/sample`` (texts) and ``data/embed/{articles,questions}.safetensors``
(the sample's DSR embeddings: ``dvc repro embed`` or ``dvc pull``/``dvc checkout``).

Dense corpus. Article ``i`` is the L2-normalised mix ``e[a] + 0.5 * e[b] + noise`` of two
real sample article embeddings (``a = i mod 2760``, ``b`` drawn at random) plus Gaussian
noise of norm ~0.5 (fixed seed), so the million vectors lie where real statute embeddings
lie, with no exact duplicates; rows ``0..2759`` are the real embeddings themselves. Queries:
the sample's 330 question embeddings (same DSR model). Exact = ``IndexFlatIP``; recall@100
of IVF and HNSW is measured against it, and their query-time knob (``nprobe``,
``efSearch``) is raised until recall@100 >= ``--target`` (0.99). Memory = growth of the
process' resident set while the index is built (the corpus matrix itself is allocated
before). FAISS uses every core it is given (``--threads``, default all); queries/s is
wall-clock for the whole query batch at k = 100.

BM25 corpus. The sample's 2,760 articles are analysed once (lexgraph's FrenchAnalyzer);
article ``i`` is then original ``i mod 2760`` with its tokens shuffled, ~15 % dropped and
~10 % inserted from the corpus' own token distribution (fixed seed; copy 0 unchanged), as
``benchmarks/bm25.py`` does at the word level. lexgraph's :class:`BM25` and ``bm25s``
(method robertson, numba backend when numba imports, else numpy) index the same token
lists (index time = from tokens) and search the same 330 tokenised questions for the
top-100, single-threaded; times are process CPU time (best of ``--repeat``), which stays
meaningful on a shared machine. Agreement is checked on the top-10.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import numpy as np

from lexgraph.core.arguments import OneLineParser, at_least, fraction, non_negative_int, positive_int

ROOT = Path(__file__).resolve().parents[1]

K = 100
K1, B = 1.2, 0.75


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def recall(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.mean([len(set(g[g >= 0].tolist()) & set(w.tolist())) / len(w) for g, w in zip(got, want)]))


# --------------------------------------------------------------------------- dense


def dense_corpus(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from lexgraph.encoding.embed import load_embeddings

    _, base = load_embeddings(ROOT / "data/embed/articles.safetensors")
    _, queries = load_embeddings(ROOT / "data/embed/questions.safetensors")
    base = base.numpy().astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    m, d = base.shape
    rng = np.random.default_rng(seed)
    x = np.empty((n, d), dtype=np.float32)
    block = 100_000
    for start in range(0, n, block):
        rows = np.arange(start, min(n, start + block))
        noise = rng.standard_normal((rows.size, d), dtype=np.float32) * np.float32(0.5 / np.sqrt(d))
        v = base[rows % m] + 0.5 * base[rng.integers(0, m, rows.size)] + noise
        real = rows < m
        v[real] = base[rows[real]]
        x[rows] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return x, queries.numpy().astype(np.float32)


def timed_build(ids, x, config):
    """(index, wall s, CPU s summed over threads, RSS growth MiB)."""
    from lexgraph.search.index import DenseIndex

    gc.collect()
    before = rss_mb()
    start, cpu = time.perf_counter(), time.process_time()
    index = DenseIndex(ids, x, config)
    build, build_cpu = time.perf_counter() - start, time.process_time() - cpu
    return index, build, build_cpu, rss_mb() - before


def timed_search(index, queries, repeat: int):
    """(queries per wall second, queries per CPU second, result): best of ``repeat``."""
    best, best_cpu, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        out = index.search(queries, K)
        best, best_cpu = min(best, time.perf_counter() - start), min(best_cpu, time.process_time() - cpu)
    return len(queries) / best, len(queries) / best_cpu, out


def run_dense(args) -> list[str]:
    import faiss

    from lexgraph.search.index import IndexConfig

    if args.threads:
        faiss.omp_set_num_threads(args.threads)
    start = time.perf_counter()
    x, queries = dense_corpus(args.n, args.seed)
    ids = np.arange(args.n, dtype=np.int64)
    print(
        f"dense corpus: {args.n} x {x.shape[1]} float32 ({x.nbytes / 2**20:.0f} MiB), {len(queries)} queries, "
        f"built in {time.perf_counter() - start:.1f} s; FAISS threads: {faiss.omp_get_max_threads()}",
        flush=True,
    )
    lines = [
        f"{'index':<34}{'build s':>9}{'(CPU s)':>9}{'RSS +MiB':>10}{'q/s':>9}{'q/CPU s':>9}{'recall@100':>12}  setting"
    ]

    def row(name, build, build_cpu, mem, qps, qps_cpu, r, setting):
        lines.append(
            f"{name:<34}{build:>9.1f}{build_cpu:>9.1f}{mem:>10.0f}{qps:>9.1f}{qps_cpu:>9.1f}{r:>12.4f}  {setting}"
        )
        print(lines[-1], flush=True)

    flat, t_flat, c_flat, mem = timed_build(ids, x, IndexConfig(type="flat"))
    qps_flat, cqps_flat, (exact, _) = timed_search(flat, queries, args.repeat)
    row("Flat (IndexFlatIP, exact)", t_flat, c_flat, mem, qps_flat, cqps_flat, 1.0, "-")
    del flat
    gc.collect()

    cfg = IndexConfig(type="ivf", nlist=args.nlist)
    ivf, t_ivf, c_ivf, mem = timed_build(ids, x, cfg)
    for nprobe in (16, 32, 64, 128, 256, 512):
        ivf.index.nprobe = min(nprobe, ivf.index.nlist)
        qps, cqps, (got, _) = timed_search(ivf, queries, args.repeat)
        r = recall(got, exact)
        row(
            f"IVF (IndexIVFFlat, nlist {ivf.index.nlist})",
            t_ivf,
            c_ivf,
            mem,
            qps,
            cqps,
            r,
            f"nprobe {ivf.index.nprobe}  ({cqps / cqps_flat:.1f}x flat per CPU s)",
        )
        if r >= args.target or ivf.index.nprobe == ivf.index.nlist:
            break
    del ivf
    gc.collect()

    if args.skip_hnsw:
        del x
        gc.collect()
        return lines
    cfg = IndexConfig(type="hnsw", hnsw_m=args.hnsw_m, ef_construction=args.ef_construction)
    hnsw, t_hnsw, c_hnsw, mem = timed_build(ids, x, cfg)
    for ef in (128, 256, 512, 1024, 2048):
        hnsw.config = IndexConfig(type="hnsw", hnsw_m=args.hnsw_m, ef_search=ef)
        qps, cqps, (got, _) = timed_search(hnsw, queries, args.repeat)
        r = recall(got, exact)
        row(
            f"HNSW (M {args.hnsw_m}, efC {args.ef_construction})",
            t_hnsw,
            c_hnsw,
            mem,
            qps,
            cqps,
            r,
            f"efSearch {ef}  ({cqps / cqps_flat:.1f}x flat per CPU s)",
        )
        if r >= args.target:
            break
    del hnsw, x
    gc.collect()
    return lines


# --------------------------------------------------------------------------- BM25


def bm25_corpus(n: int, seed: int):
    from bm25 import read_csv, read_questions

    from lexgraph.text.analyzer import FrenchAnalyzer

    articles = read_csv(ROOT / "data/sample/articles.csv", ("id", "article"))
    analyzer = FrenchAnalyzer()
    base = analyzer.analyze_many([a["article"] for a in articles])
    queries = analyzer.analyze_many([r["question"] for r in read_questions(ROOT / "data/sample")])
    terms = sorted({t for doc in base for t in doc})
    code = {t: i for i, t in enumerate(terms)}
    names = np.array(terms, dtype=object)
    base_ids = [np.array([code[t] for t in doc], dtype=np.int64) for doc in base]
    pool = np.concatenate(base_ids)  # the corpus' token distribution
    rng = np.random.default_rng(seed)
    m = len(base)
    docs = []
    for i in range(n):
        toks = base_ids[i % m]
        if i >= m and toks.size:
            toks = toks[rng.random(toks.size) > 0.15]
            toks = np.concatenate([toks, pool[rng.integers(0, pool.size, rng.binomial(max(1, toks.size), 0.10))]])
            rng.shuffle(toks)
            if not toks.size:
                toks = base_ids[i % m]
        docs.append(names[toks].tolist())
    return docs, queries


def process_best(fn, repeat: int):
    best, best_wall, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        gc.collect()
        start, wall = time.process_time(), time.perf_counter()
        out = fn()
        best = min(best, time.process_time() - start)
        best_wall = min(best_wall, time.perf_counter() - wall)
    return best, best_wall, out


def run_bm25(args) -> list[str]:
    import bm25s

    from lexgraph.search.bm25 import BM25

    start = time.perf_counter()
    docs, queries = bm25_corpus(args.n, args.seed)
    n_tok = sum(map(len, docs))
    print(
        f"BM25 corpus: {len(docs)} articles, {n_tok} tokens ({n_tok / len(docs):.1f}/article), {len(queries)} queries "
        f"({np.mean([len(q) for q in queries]):.1f} tokens/query), built in {time.perf_counter() - start:.1f} s",
        flush=True,
    )
    doc_ids = np.arange(len(docs), dtype=np.int64)
    lines = [f"{'system':<30}{'index s':>9}{'RSS +MiB':>10}{'queries/s':>11}{'wall q/s':>10}{'ms/query':>10}"]
    before = rss_mb()
    t_ours_index, _, ours = process_best(lambda: BM25(k1=K1, b=B, idf_floor=0.0).fit(docs, doc_ids), 1)
    mem_ours = rss_mb() - before
    t_ours, w_ours, (ours_ids, _) = process_best(lambda: ours.search_tokens(queries, K), args.repeat)
    qps_ours = len(queries) / t_ours
    lines.append(
        f"{'lexgraph BM25':<30}{t_ours_index:>9.1f}{mem_ours:>10.0f}{qps_ours:>11.1f}"
        f"{len(queries) / w_ours:>10.1f}{1000 / qps_ours:>10.2f}"
    )
    print(lines[-1], flush=True)
    try:
        import numba  # noqa: F401

        backend = "numba"
    except ImportError:
        backend = "numpy"

    def index():
        model = bm25s.BM25(method="robertson", k1=K1, b=B, backend=backend)
        model.index(docs, show_progress=False)
        return model

    before = rss_mb()
    t_bs_index, _, bs = process_best(index, 1)
    mem_bs = rss_mb() - before
    retrieve = lambda: bs.retrieve(queries, k=K, show_progress=False, n_threads=1)  # noqa: E731
    retrieve()  # warm-up: numba compiles on the first call
    t_bs, w_bs, (bs_docs, _) = process_best(retrieve, args.repeat)
    qps_bs = len(queries) / t_bs
    lines.append(
        f"{f'bm25s robertson ({backend})':<30}{t_bs_index:>9.1f}{mem_bs:>10.0f}{qps_bs:>11.1f}"
        f"{len(queries) / w_bs:>10.1f}{1000 / qps_bs:>10.2f}"
    )
    print(lines[-1], flush=True)
    top10 = np.mean([len(set(a[:10].tolist()) & set(doc_ids[b[:10]].tolist())) / 10 for a, b in zip(ours_ids, bs_docs)])
    lines.append(
        f"lexgraph / bm25s-{backend}: index {t_bs_index / t_ours_index:.2f}x faster, "
        f"queries {qps_ours / qps_bs:.2f}x (CPU), {w_bs / w_ours:.2f}x (wall); top-10 set overlap {top10:.3f} "
        "(ties ordered differently)"
    )
    print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=at_least(K), default=1_000_000, help="articles in the synthetic corpus")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--repeat", type=positive_int, default=2)
    parser.add_argument("--target", type=fraction, default=0.99, help="recall@100 the ANN knobs are raised to")
    parser.add_argument("--threads", type=non_negative_int, default=0, help="FAISS threads (0: all cores)")
    parser.add_argument("--nlist", type=non_negative_int, default=0, help="IVF lists (0: 4 * sqrt(n))")
    parser.add_argument("--hnsw-m", type=at_least(2), default=32)
    parser.add_argument("--ef-construction", type=positive_int, default=80)
    parser.add_argument("--skip-dense", action="store_true")
    parser.add_argument("--skip-hnsw", action="store_true", help="no HNSW (its build is the slowest part at 1M)")
    parser.add_argument("--skip-bm25", action="store_true")
    args = parser.parse_args()
    print(f"scale benchmark: n = {args.n}, {os.cpu_count()} CPUs, top-{K}", flush=True)
    report = []
    if not args.skip_dense:
        report += ["", "dense (cosine, DSR embeddings of the sample, mixed + noise)"] + run_dense(args)
    if not args.skip_bm25:
        report += ["", f"BM25 (k1 {K1}, b {B}, single thread)"] + run_bm25(args)
    print("\n".join(report))


if __name__ == "__main__":
    from lexgraph.core.errors import LexgraphError

    try:
        main()
    except LexgraphError as exc:  # a missing or damaged artefact (the sample's embeddings): one line
        raise SystemExit(f"scale.py: error: {exc}") from None
