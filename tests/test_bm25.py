"""BM25: scores against the formula by hand, exact top-k, ties, persistence, reweighting."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, load_benchmark
from lexgraph.core.errors import LexgraphError
from lexgraph.methods.bm25.system import tune
from lexgraph.search import bm25 as bm25_module
from lexgraph.search.bm25 import BM25, load_system
from lexgraph.search.bm25_kernels import exact_topk, sparse_topk

# three documents, ids deliberately not in order
DOCS = [["c", "c", "d", "e"], ["a", "b", "a"], ["b", "c"]]
IDS = [30, 10, 20]


def hand_score(query, doc, corpus, k1, b, floor="none"):
    """BM25 written out independently: sum over query tokens, Robertson idf; ``floor`` a number
    (negative idfs replaced by it), "none", or "lucene-min" (at least ln(1 + 0.5 / (N + 0.5)))."""
    n = len(corpus)
    avgdl = sum(len(d) for d in corpus) / n
    total = 0.0
    for term in query:
        df = sum(1 for d in corpus if term in d)
        if df == 0:
            continue
        idf = math.log((n - df + 0.5) / (df + 0.5))
        if floor == "lucene-min":
            idf = max(idf, math.log(1 + 0.5 / (n + 0.5)))
        elif floor != "none" and idf < 0:
            idf = floor
        tf = doc.count(term)
        total += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(doc) / avgdl))
    return total


def hand_scores(query, docs, corpus, k1, b, floor="none"):
    """:func:`hand_score` of ``query`` for each of ``docs``, the corpus' length and each term's df
    counted once for the whole row (the same formula, term by term)."""
    n = len(corpus)
    avgdl = sum(len(d) for d in corpus) / n
    df = {term: sum(1 for d in corpus if term in d) for term in set(query)}
    row = []
    for doc in docs:
        total = 0.0
        for term in query:
            if df[term] == 0:
                continue
            idf = math.log((n - df[term] + 0.5) / (df[term] + 0.5))
            if floor == "lucene-min":
                idf = max(idf, math.log(1 + 0.5 / (n + 0.5)))
            elif floor != "none" and idf < 0:
                idf = floor
            tf = doc.count(term)
            total += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(doc) / avgdl))
        row.append(total)
    return row


def test_hand_scores_is_hand_score_of_each_document():
    docs, _, queries = random_corpus(3, n_docs=40, vocab=12)
    for floor in ("none", "lucene-min", 0.0, 0.3):
        for q in queries[:8]:
            assert hand_scores(q, docs, docs, 1.5, 0.6, floor) == [
                hand_score(q, d, docs, 1.5, 0.6, floor) for d in docs
            ]


def test_scores_match_the_formula_by_hand():
    bm = BM25(k1=1.2, b=0.75, idf_floor=None).fit(DOCS, IDS)
    # columns follow increasing article id: 10, 20, 30
    assert bm.doc_ids.tolist() == [10, 20, 30]
    by_id = dict(zip(IDS, DOCS))
    # by hand for "a" in doc 10: df=1, N=3 -> idf = ln(2.5/1.5); tf=2, dl=3, avgdl=3
    expected_a = math.log(2.5 / 1.5) * 2 * 2.2 / (2 + 1.2 * (0.25 + 0.75 * 3 / 3))
    assert bm.score_tokens([["a"]])[0, 0] == pytest.approx(expected_a, rel=1e-6)
    for query in (["a", "c"], ["c", "e", "zzz"], ["a", "a"], ["b"], []):
        scores = bm.score_tokens([query])[0]
        expected = [hand_score(query, by_id[i], DOCS, 1.2, 0.75) for i in (10, 20, 30)]
        np.testing.assert_allclose(scores, expected, rtol=1e-6, atol=1e-7)
    # a repeated query term counts once per occurrence
    np.testing.assert_allclose(bm.score_tokens([["a", "a"]])[0], 2 * bm.score_tokens([["a"]])[0], rtol=1e-6)


def test_negative_idf_policy():
    # "b" and "c" occur in 2 of 3 documents: idf = ln(1.5 / 2.5) < 0
    raw = math.log(1.5 / 2.5)
    assert raw < 0
    keep = BM25(k1=1.2, b=0.75, idf_floor=None).fit(DOCS, IDS)
    zero = BM25(k1=1.2, b=0.75, idf_floor=0.0).fit(DOCS, IDS)  # the default before issue 41
    floored = BM25(k1=1.2, b=0.75, idf_floor=0.1).fit(DOCS, IDS)
    by_id = dict(zip(IDS, DOCS))
    b_term = keep.vocab["b"]
    assert keep.idf[b_term] == pytest.approx(raw)
    assert zero.idf_floor == 0.0 and zero.idf[b_term] == 0.0
    assert floored.idf[b_term] == pytest.approx(0.1)
    # terms with non-negative idf are untouched by the floor
    assert floored.idf[floored.vocab["a"]] == pytest.approx(math.log(2.5 / 1.5))

    np.testing.assert_allclose(
        keep.score_tokens([["b"]])[0], [hand_score(["b"], by_id[i], DOCS, 1.2, 0.75) for i in (10, 20, 30)], rtol=1e-6
    )
    np.testing.assert_allclose(
        floored.score_tokens([["b"]])[0],
        [hand_score(["b"], by_id[i], DOCS, 1.2, 0.75, floor=0.1) for i in (10, 20, 30)],
        rtol=1e-6,
    )
    assert np.all(zero.score_tokens([["b"]]) == 0)
    # negative scores rank below documents without the term
    ids, scores = keep.search_tokens([["b"]], 3)
    assert ids[0, 0] == 30 and scores[0, 0] == 0 and np.all(scores[0, 1:] < 0)
    # all-zero scores: ordered by article id
    ids, _ = zero.search_tokens([["b"]], 3)
    assert ids.tolist() == [[10, 20, 30]]
    zero.set_idf_floor(0.1)
    np.testing.assert_array_equal(zero.score_tokens([["b", "a"]]), floored.score_tokens([["b", "a"]]))
    # the default floor: "b" keeps ln(1 + 0.5 / 3.5) = ln(8/7) and ranks the two documents that hold it
    default = BM25(k1=1.2, b=0.75).fit(DOCS, IDS)
    assert default.idf_floor == "lucene-min" and default.idf[b_term] == pytest.approx(math.log(8 / 7))
    np.testing.assert_allclose(
        default.score_tokens([["b"]])[0],
        [hand_score(["b"], by_id[i], DOCS, 1.2, 0.75, floor="lucene-min") for i in (10, 20, 30)],
        rtol=1e-6,
    )
    ids, scores = default.search_tokens([["b"]], 3)
    assert ids[0, :2].tolist() == [20, 10] and np.all(scores[0, :2] > 0) and scores[0, 2] == 0


# N = 4: "s" in every document, "p" in exactly half (Robertson's idf 0), "q" in one
SMALL = [["s", "p"], ["s", "q"], ["s", "p"], ["s"]]


@pytest.mark.parametrize(
    "idf, floor, expected",
    [
        # Robertson ln((N - df + 0.5) / (df + 0.5)): s ln(0.5/4.5), p ln(2.5/2.5), q ln(3.5/1.5)
        ("robertson", None, {"s": math.log(1 / 9), "p": 0.0, "q": math.log(7 / 3)}),
        ("robertson", 0.0, {"s": 0.0, "p": 0.0, "q": math.log(7 / 3)}),
        ("robertson", 0.25, {"s": 0.25, "p": 0.0, "q": math.log(7 / 3)}),  # only negative idfs are replaced
        # eps(4) = ln(1 + 0.5 / 4.5) = ln(10/9): raises s (negative) and p (zero), keeps q
        ("robertson", "lucene-min", {"s": math.log(10 / 9), "p": math.log(10 / 9), "q": math.log(7 / 3)}),
        # Lucene ln(1 + (N - df + 0.5) / (df + 0.5)): s ln(1 + 1/9), p ln(2), q ln(1 + 7/3); never below eps(N)
        ("lucene", "lucene-min", {"s": math.log(10 / 9), "p": math.log(2), "q": math.log(10 / 3)}),
        ("lucene", None, {"s": math.log(10 / 9), "p": math.log(2), "q": math.log(10 / 3)}),
    ],
)
def test_idf_by_hand(idf, floor, expected):
    bm = BM25(idf=idf, idf_floor=floor).fit(SMALL, [1, 2, 3, 4])
    assert (bm.idf_variant, bm.idf_floor) == (idf, floor)
    assert {t: bm.idf[bm.vocab[t]] for t in expected} == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_default_idf_is_robertson_floored_at_lucenes_smallest():
    """For every N up to 300 and every df in 1..N: the default idf is > 0, never increases with df,
    equals Robertson's wherever that is >= eps(N) = ln(1 + 0.5 / (N + 0.5)), and is eps(N) elsewhere."""
    from lexgraph.search.bm25_kernels import idf_values

    for n in range(1, 301):
        df = np.arange(1, n + 1)
        got = idf_values(df, n)
        eps = math.log(1 + 0.5 / (n + 0.5))
        robertson = [math.log((n - d + 0.5) / (d + 0.5)) for d in range(1, n + 1)]
        assert np.all(got > 0) and np.all(np.diff(got) <= 0)
        r = np.array(robertson)
        want = np.where(r >= eps, r, eps)
        close = np.abs(got - want) <= np.maximum(1e-12 * np.abs(want), 1e-12)  # pytest.approx(want, rel=1e-12)
        assert close.all(), (n, df[~close].tolist())
        # Robertson's positive values are all >= eps: the floor changes none of them
        assert not np.any((0 < r) & (r < eps)), (n, df[(0 < r) & (r < eps)].tolist())


def test_bad_idf_settings_are_one_line():
    with pytest.raises(LexgraphError, match=r"^BM25 idf = 'okapi', expected one of 'robertson', 'lucene'$"):
        BM25(idf="okapi")
    for floor in ("lucene", float("nan"), True):
        with pytest.raises(
            LexgraphError, match=r"^BM25 idf_floor = .*, expected 'lucene-min', a finite number or null"
        ):
            BM25(idf_floor=floor)


def random_corpus(seed, n_docs=300, vocab=40):
    rng = random.Random(seed)
    terms = [f"t{i}" for i in range(vocab)]
    weights = [1 / (i + 1) for i in range(vocab)]  # Zipf-like: some terms in most documents
    docs = [rng.choices(terms, weights, k=rng.randint(0, 25)) for _ in range(n_docs)]
    docs[5] = list(docs[7])  # exact duplicates create ties
    docs[11] = list(docs[7])
    ids = rng.sample(range(10_000), n_docs)
    queries = [rng.choices(terms + ["oov"], k=rng.randint(0, 6)) for _ in range(60)]
    queries.append(list(docs[7]))
    return docs, ids, queries


def brute_force(bm, queries, k):
    dense = bm.score_tokens(queries)  # (n_queries, n_docs)
    ids = np.empty((len(queries), k), dtype=np.int64)
    scores = np.empty((len(queries), k), dtype=np.float32)
    for i, row in enumerate(dense):
        order = np.lexsort((bm.doc_ids, -row))[:k]  # score descending, then lower id
        ids[i], scores[i] = bm.doc_ids[order], row[order]
    return ids, scores


try:
    import numba  # noqa: F401

    SEARCH_PATHS = [False, True]
except ImportError:  # pragma: no cover
    SEARCH_PATHS = [False]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("idf_floor", ["lucene-min", 0.0, None, 0.3])
@pytest.mark.parametrize("use_numba", SEARCH_PATHS + ["numba-touched", "numba-scan"][: 2 * (len(SEARCH_PATHS) > 1)])
def test_exact_topk_equals_brute_force(seed, idf_floor, use_numba, monkeypatch):
    if isinstance(use_numba, str):  # force the kernel's per-query mode: only touched documents, or a full scan
        from lexgraph.search import bm25_numba

        monkeypatch.setattr(bm25_numba, "DENSE_SCAN", 0 if use_numba == "numba-touched" else 10**9)
        use_numba = True
    docs, ids, queries = random_corpus(seed)
    bm = BM25(k1=1.5, b=0.6, idf_floor=idf_floor).fit(docs, ids)
    bm.use_numba = use_numba
    # the numba kernel runs whenever no weight is negative (not with idf_floor=None here: some idf < 0)
    assert (bm._kernel() is not None) == (use_numba and idf_floor is not None)
    by_id = dict(zip(ids, docs))
    # the dense scores themselves follow the formula
    dense = bm.score_tokens(queries[:10])
    for q, row in zip(queries[:10], dense):
        in_order = [by_id[i] for i in bm.doc_ids]
        expected = hand_scores(q, in_order, docs, 1.5, 0.6, floor="none" if idf_floor is None else idf_floor)
        np.testing.assert_allclose(row, expected, rtol=1e-5, atol=1e-5)
    for k in (1, 5, 50, 299, 300, 1000):
        got_ids, got_scores = bm.search_tokens(queries, k, batch_size=7)
        want_ids, want_scores = brute_force(bm, queries, min(k, 300))
        np.testing.assert_array_equal(got_ids, want_ids)
        np.testing.assert_array_equal(got_scores, want_scores)
        assert got_ids.dtype == np.int64 and got_scores.dtype == np.float32


@pytest.mark.skipif(len(SEARCH_PATHS) == 1, reason="numba is not installed")
@pytest.mark.parametrize("scan", [0, 64, 10**9])  # touched documents only, per query by postings, always scan
def test_numba_kernel_equals_scipy_path_on_a_larger_corpus(scan, monkeypatch):
    """Thousands of candidates per query: the kernel's buffer is compacted many times, and the
    scan visits full 64-document blocks and a partial last one (3,001 documents)."""
    from lexgraph.search import bm25_numba

    monkeypatch.setattr(bm25_numba, "DENSE_SCAN", scan)
    docs, ids, queries = random_corpus(11, n_docs=3001, vocab=400)
    bm = BM25(k1=1.2, b=0.75).fit(docs, ids)
    for k in (1, 7, 64, 100, 1000, 3001):
        bm.use_numba = True
        fast = bm.search_tokens(queries, k, batch_size=16)
        bm.use_numba = False
        slow = bm.search_tokens(queries, k)
        np.testing.assert_array_equal(fast[0], slow[0])
        np.testing.assert_array_equal(fast[1], slow[1])


def test_numba_without_a_writable_cache_falls_back_to_compiling(tmp_path):
    """A read-only install with no writable HOME: numba finds no cache locator and
    ``cache=True`` raises "no locator available" at import. The kernel then compiles per
    process and BM25 still searches (here every locator is taken away, in a child process,
    before the kernel module is imported)."""
    pytest.importorskip("numba")
    script = (
        "import numba.core.caching as caching\n"
        "caching.CacheImpl._locator_classes = []\n"
        "import numpy as np\n"
        "from lexgraph.search import bm25_numba\n"
        "from lexgraph.search.bm25 import BM25\n"
        "assert bm25_numba.search_batch is not None\n"
        "bm = BM25().fit([['a', 'b'], ['b', 'c'], ['c', 'e'], ['d'], ['e']], [1, 2, 3, 4, 5])\n"
        "bm.use_numba = True\n"
        "ids, scores = bm.search_tokens([['a', 'c'], ['d', 'e']], 3)\n"
        "bm.use_numba = False\n"
        "ref_ids, ref_scores = bm.search_tokens([['a', 'c'], ['d', 'e']], 3)\n"
        "assert ids.tolist() == ref_ids.tolist() and np.array_equal(scores, ref_scores)\n"
        "print(ids[:, 0].tolist())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "NUMBA_CACHE_DIR": ""},
        timeout=300,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.strip() == "[1, 4]"  # a, then d: the rarest term of each question


def test_ties_break_by_lower_article_id():
    docs = [["x", "y"], ["x", "y"], ["x", "y"], ["z"], ["x", "y"]] + [["w"]] * 6  # x: df=4 of 11, idf > 0
    bm = BM25().fit(docs, [50, 7, 30, 1, 12, 60, 61, 62, 63, 64, 65])
    ids, scores = bm.search_tokens([["x"], ["q"]], 3)
    assert ids[0].tolist() == [7, 12, 30]
    assert scores[0, 0] == scores[0, 1] == scores[0, 2] > 0
    assert ids[1].tolist() == [1, 7, 12]  # nothing matches: all 0, lowest ids


def test_topk_helpers_agree_on_random_matrices():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n, m = 8, 60
        dense = rng.integers(-3, 6, size=(n, m)).astype(np.float32)  # many ties, zeros, negatives
        dense[rng.random((n, m)) < 0.5] = 0
        for k in (1, 10, 59, 60):
            want = np.stack([np.lexsort((np.arange(m), -row))[:k] for row in dense])
            cols, vals = exact_topk(dense, k)
            np.testing.assert_array_equal(cols, want)
            np.testing.assert_array_equal(vals, np.take_along_axis(dense, want, 1))
            # the same matrix in CSR form, explicit entries shuffled within rows
            indptr, col_list, val_list = [0], [], []
            for row in dense:
                nz = rng.permutation(np.flatnonzero(row))
                col_list.extend(nz.tolist())
                val_list.extend(row[nz].tolist())
                indptr.append(len(col_list))
            cols2, vals2 = sparse_topk(
                np.array(indptr), np.array(col_list, dtype=np.int32), np.array(val_list, dtype=np.float32), m, k
            )
            np.testing.assert_array_equal(cols2, want)
            np.testing.assert_array_equal(vals2, np.take_along_axis(dense, want, 1))


def test_public_scipy_fallback_gives_same_results(monkeypatch):
    docs, ids, queries = random_corpus(3)
    bm = BM25().fit(docs, ids)
    fast = bm.search_tokens(queries, 20)
    monkeypatch.setattr(bm25_module, "_csr_matmat", None)
    slow = bm.search_tokens(queries, 20)
    np.testing.assert_array_equal(fast[0], slow[0])
    np.testing.assert_allclose(fast[1], slow[1], rtol=1e-6)


def test_reweight_equals_fresh_fit():
    docs, ids, queries = random_corpus(4)
    bm = BM25(k1=1.2, b=0.75).fit(docs, ids)
    bm.reweight(0.5, 0.3)
    fresh = BM25(k1=0.5, b=0.3).fit(docs, ids)
    np.testing.assert_array_equal(bm.score_tokens(queries), fresh.score_tokens(queries))
    with pytest.raises(LexgraphError):
        bm.reweight(1.0, 1.5)
    with pytest.raises(LexgraphError, match="k1"):
        BM25(k1="tuned")


def test_save_load_round_trip_is_identical_and_deterministic(tmp_path):
    docs, ids, queries = random_corpus(5)
    docs[0] = ["élève", "œuvre", "ça"]  # non-ASCII vocabulary
    bm = BM25(k1=0.9, b=0.4, idf_floor=None, analyzer={"stem": False, "stopwords": True}).fit(docs, ids)
    bm.save(tmp_path / "a")
    bm.save(tmp_path / "b")
    for name in ("index.npz", "bm25.json", "vocab.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    loaded = BM25.load(tmp_path / "a")
    assert (loaded.k1, loaded.b, loaded.idf_floor) == (0.9, 0.4, None)
    assert loaded.analyzer_config == {"stem": False, "stopwords": True}
    queries.append(["élève"])
    for got, want in zip(loaded.search_tokens(queries, 25), bm.search_tokens(queries, 25)):
        np.testing.assert_array_equal(got, want)
    # saving again over an existing directory replaces it
    loaded.reweight(2.0, 0.9)
    loaded.save(tmp_path / "a")
    assert BM25.load(tmp_path / "a").k1 == 2.0


def test_load_errors(tmp_path):
    with pytest.raises(LexgraphError, match="dvc repro bm25"):
        load_system(tmp_path, "cpu")
    (tmp_path / "models" / "bm25").mkdir(parents=True)
    with pytest.raises(LexgraphError, match="missing"):
        load_system(tmp_path, "cpu")


SALARIE = [  # "salarié" in every article: Robertson's idf ln(0.5 / 3.5) < 0
    "Le salarié a droit à un congé payé.",
    "Le contrat de travail du salarié est exécuté de bonne foi.",
    "L'employeur verse au salarié une indemnité de licenciement.",
]
#: bm25.json as lexgraph wrote it before issue 41 (format version 1: no "idf", the floor 0.0 of then)
V1_META = """{
  "analyzer": {
    "stem": true,
    "stopwords": true
  },
  "b": 0.75,
  "format": "lexgraph-bm25",
  "idf_floor": 0.0,
  "k1": 1.2,
  "n_docs": 3,
  "n_terms": %d,
  "version": 1
}
"""


def test_an_index_saved_before_issue_41_loads_and_scores_as_saved(tmp_path):
    fresh = BM25(k1=1.2, b=0.75).fit_texts(SALARIE, [1, 2, 3])
    fresh.save(tmp_path / "old")
    (tmp_path / "old" / "bm25.json").write_text(V1_META % fresh.n_terms, encoding="utf-8")
    old = BM25.load(tmp_path / "old")
    assert (old.idf_variant, old.idf_floor, old.k1, old.b) == ("robertson", 0.0, 1.2, 0.75)
    term = old.vocab["salari"]
    assert old.idf[term] == 0.0 and math.log(0.5 / 3.5) < 0  # floored to 0, as when it was saved
    # a rarer term scores as the formula with the floor 0 says; the common one matches nothing, and says why
    tokens = [old.analyzer(text) for text in SALARIE]
    want = [hand_score(["contrat", "salari"], doc, tokens, 1.2, 0.75, floor=0.0) for doc in tokens]
    np.testing.assert_allclose(old.score_tokens([["contrat", "salari"]])[0], want, rtol=1e-6)
    ids, scores = old.search(["salarié"], 3)
    assert ids.tolist() == [[-1, -1, -1]] and not scores.any()
    why = old.no_match_reason("salarié")
    assert "in at least half of the 3 articles" in why and "idf_floor 0.0" in why
    assert old.no_match_reason("xyzzy") is None  # no term in the index: the display's "no article matches"
    # saved again, it keeps its floor (format 2 names its idf)
    old.save(tmp_path / "again")
    again = BM25.load(tmp_path / "again")
    assert (again.idf_variant, again.idf_floor) == ("robertson", 0.0) and again.idf[term] == 0.0
    # the default of a new index: every article holds "salarié", all three are found
    ids, scores = fresh.search(["salarié"], 3)
    assert sorted(ids[0].tolist()) == [1, 2, 3] and np.all(scores > 0)


def test_bm25_json_with_bad_idf_settings_is_one_line(tmp_path):
    import json

    BM25().fit([["a"], ["b"]], [1, 2]).save(tmp_path / "i")
    meta_path = tmp_path / "i" / "bm25.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    assert (meta["version"], meta["idf"], meta["idf_floor"]) == (2, "robertson", "lucene-min")
    for key, value, expected in (
        ("idf", "okapi", "idf = 'okapi', expected one of 'robertson', 'lucene'"),
        ("idf_floor", "lucene", "idf_floor = 'lucene', expected 'lucene-min', a finite number or null"),
        ("version", 3, "unsupported index format 'lexgraph-bm25' v3, expected 'lexgraph-bm25' v1 or v2"),
    ):
        meta_path.write_text(json.dumps({**meta, key: value}), encoding="utf-8")
        with pytest.raises(LexgraphError) as info:
            BM25.load(tmp_path / "i")
        assert str(info.value).startswith(f"{meta_path}: {expected}") and "\n" not in str(info.value)


def test_load_system_and_text_search(tmp_path):
    texts = [
        "Le propriétaire d'un fonds peut le clore.",
        "Les servitudes sont établies pour l'usage des héritages voisins.",
        "L'usufruitier jouit des fruits de la chose.",
    ]
    bm = BM25().fit_texts(texts, [3, 1, 2])
    bm.save(tmp_path / "models" / "bm25")
    system = load_system(tmp_path, "cpu")
    assert system.name == "bm25"
    ids, scores = system.search(["Quelles servitudes entre voisins ?", "fruits de l’usufruit"], 2)
    assert ids[:, 0].tolist() == [1, 2]
    assert ids.shape == scores.shape == (2, 2)
    from lexgraph.systems.registry import load_retriever

    assert load_retriever("bm25", tmp_path).search(["servitude"], 1)[0].tolist() == [[1]]


def test_fit_rejects_bad_input():
    with pytest.raises(LexgraphError, match="more than once"):
        BM25().fit([["a"], ["b"]], [1, 1])
    with pytest.raises(LexgraphError):
        BM25().fit([["a"]], [1, 2])
    with pytest.raises(LexgraphError):
        BM25().search_tokens([["a"]], 3)  # not fitted
    with pytest.raises(LexgraphError):
        BM25().fit([["a"]], [1]).search_tokens([["a"]], 0)


def test_tune_grid_and_restores_parameters():
    docs, ids, queries = random_corpus(6)
    bm = BM25(k1=1.2, b=0.75).fit(docs, ids)
    before = bm.score_tokens(queries)
    question_tokens = {f"q{i}": q for i, q in enumerate(queries[:20])}
    qrels = {f"q{i}": {ids[i]} for i in range(20)}

    def recall(run, qrels):
        return sum(len(set(run[q]) & qrels[q]) / len(qrels[q]) for q in qrels) / len(qrels)

    results = tune(bm, question_tokens, qrels, [0.5, 1.5], [0.2, 0.8], recall, k=50)
    assert [(r["k1"], r["b"]) for r in results] == [(0.5, 0.2), (0.5, 0.8), (1.5, 0.2), (1.5, 0.8)]
    for r in results:
        fresh = BM25(k1=r["k1"], b=r["b"]).fit(docs, ids)
        got, _ = fresh.search_tokens(list(question_tokens.values()), 50)
        run = {q: row.tolist() for q, row in zip(question_tokens, got)}
        assert r["score"] == pytest.approx(recall(run, qrels))
    assert (bm.k1, bm.b) == (1.2, 0.75)
    np.testing.assert_array_equal(bm.score_tokens(queries), before)


# ---------------------------------------------------------------------- against bm25s

SAMPLE = ROOT / "data" / "sample"


def fr_codes_dir() -> Path | None:
    """Every French code in force (fr-codes-2020: ``articles.jsonl.gz``, 90,078 articles):
    the folder ``$LEXGRAPH_FR_CODES`` names (the project reads no data outside the repository
    unless told to: ``LEXGRAPH_FR_CODES=../shared/data/fr-codes-2020 pytest -m slow``)."""
    folder = os.environ.get("LEXGRAPH_FR_CODES")
    return Path(folder) if folder else None


def sample_questions() -> list[str]:
    bench = load_benchmark("bm25")
    return [r["question"] for r in bench.read_questions(SAMPLE)]


def assert_topk_as_bm25s(docs, ids, queries, k=100, k1=1.5, b=0.75) -> int:
    """lexgraph's top-k equals bm25s's (method robertson: negative idf clamped to 0, scores
    without the (k1 + 1) factor) ranked by lexgraph's tie rule (-score, then lower id), and
    bm25s's own top-k scores are ours (its order among equal scores is its own).

    The two sum float32 weights rounded differently, so two documents whose exact scores
    differ by less than float32's resolution can come out tied in one and one ulp apart in the
    other (see the bm25 module docstring): a list may differ only where the two documents
    swapped have the same bm25s score to 1e-6. Returns the number of queries with such a swap.
    """
    bm25s = pytest.importorskip("bm25s")
    ours = BM25(k1=k1, b=b, idf_floor=0.0).fit(docs, ids)  # bm25s robertson's floor
    assert (ours._kernel() is not None) == (len(SEARCH_PATHS) > 1)  # lexgraph's numba kernel when numba imports
    got_ids, got_scores = ours.search_tokens(queries, k)
    order = np.argsort(ids, kind="stable")  # bm25s numbers documents in the order given
    by_index = np.asarray(ids, dtype=np.int64)[order]
    # bm25s's numpy backend: the same index and scores as its numba one, without a numba compile per test run
    ref = bm25s.BM25(method="robertson", k1=k1, b=b, backend="numpy")
    ref.index([docs[i] for i in order], show_progress=False)
    swapped = 0
    for i, q in enumerate(queries):
        full = ref.get_scores(q).astype(np.float64) * (k1 + 1)
        top = np.lexsort((by_index, -full))[:k]
        ours_ref = full[np.searchsorted(by_index, got_ids[i])]  # bm25s's scores of our documents
        np.testing.assert_allclose(got_scores[i], ours_ref, rtol=1e-6, atol=1e-7, err_msg=f"query {i}: {q}")
        same = got_ids[i] == by_index[top]
        if not same.all():
            swapped += 1
            np.testing.assert_allclose(ours_ref[~same], full[top][~same], rtol=1e-6, err_msg=f"query {i}: {q}")
    _, bs_scores = ref.retrieve(queries, k=k, show_progress=False, n_threads=1)
    np.testing.assert_allclose(bs_scores * (k1 + 1), got_scores, rtol=1e-6, atol=1e-7)
    return swapped


def test_topk_identical_to_bm25s_on_the_sample_and_a_synthetic_corpus():
    from lexgraph.text.analyzer import FrenchAnalyzer

    bench = load_benchmark("bm25")
    articles = bench.read_articles(SAMPLE)
    analyzer = FrenchAnalyzer()
    docs = analyzer.analyze_many([text for _, text in articles])
    queries = analyzer.analyze_many(sample_questions())
    assert len(docs) == 2760 and len(queries) == 330
    # one question (106) has a near tie: articles 588 and 509 score 6.44397992 and 6.44397980 by the
    # formula in float64; bm25s's float32 rounding ties them (509 first by id), lexgraph's does not
    assert assert_topk_as_bm25s(docs, [i for i, _ in articles], queries) <= 1
    # Zipf-like terms (some in more than half of the documents: idf clamped to 0) and exact duplicates (ties)
    docs, ids, queries = random_corpus(7, n_docs=2000, vocab=300)
    assert assert_topk_as_bm25s(docs, ids, [q for q in queries if q], k=50) == 0


@pytest.mark.slow
def test_topk_identical_to_bm25s_on_every_french_code():
    """The 90k articles of every French code in force, searched with the sample's questions."""
    from lexgraph.text.analyzer import FrenchAnalyzer

    corpus = fr_codes_dir()
    if corpus is None or not (corpus / "articles.jsonl.gz").is_file():
        pytest.skip(
            f"no fr-codes-2020 corpus at {corpus} (set LEXGRAPH_FR_CODES to the folder holding articles.jsonl.gz)"
        )
    articles = load_benchmark("bm25").read_articles(corpus)
    analyzer = FrenchAnalyzer()
    docs = analyzer.analyze_many([text for _, text in articles])
    assert len(docs) == 90_078
    assert assert_topk_as_bm25s(docs, [i for i, _ in articles], analyzer.analyze_many(sample_questions())) == 0


def test_benchmark_reads_json_lines_corpora(tmp_path):
    """benchmarks/bm25.py --corpus: a .jsonl[.gz] file or a folder holding articles.jsonl[.gz]
    (fr-codes-2020's layout), searched with the sample's questions since it has none."""
    import gzip
    import json

    bench = load_benchmark("bm25")
    rows = [
        {"id": 2, "code": "Code civil", "number": "1", "path": [], "text": "Le bail.\n\nLe loyer."},
        {"id": 1, "code": "Code rural", "number": "L1", "path": ["Livre Ier : X"], "text": "La vente."},
    ]
    with gzip.open(tmp_path / "articles.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    want = [(2, "Le bail.\n\nLe loyer."), (1, "La vente.")]
    assert bench.read_articles(tmp_path) == want
    assert bench.read_articles(tmp_path / "articles.jsonl.gz") == want
    assert bench.read_questions(tmp_path) == []  # main() then takes the sample's questions
    texts, ids = bench.build_corpus(want, 2, seed=0)
    assert ids == [2, 1, 12, 11] and texts[:2] == ["Le bail. Le loyer.", "La vente."]
    assert len(bench.read_questions(SAMPLE)) == 330
