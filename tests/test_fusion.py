"""The fusions of the hybrid system (lexgraph.search.fusion): hand computations, an
independent reference, ranx.fuse itself, and the single-system choices."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from lexgraph.core.errors import LexgraphError
from lexgraph.search import fusion as hybrid_module
from lexgraph.search.fusion import Fusion, fuse
from lexgraph.search.fusion import Prepared as _Prepared


def arrays(rows, width):
    """``[[(id, score), ...], ...]`` -> ``(ids int64 (n, width), scores float32 (n, width))``, -1 padded."""
    ids = np.full((len(rows), width), -1, dtype=np.int64)
    scores = np.zeros((len(rows), width), dtype=np.float32)
    for i, row in enumerate(rows):
        for j, (doc, score) in enumerate(row):
            ids[i, j], scores[i, j] = doc, score
    return ids, scores


# Three questions. q0: BM25 ties articles 1 and 3 (in that order) and pads its top with
# article 5 at score 0 (no term matched); q1: BM25 matched nothing (a row of -1);
# q2: neither system returned anything.
SPARSE = arrays([[(1, 2.0), (3, 2.0), (2, 0.5), (5, 0.0)], [], []], 4)
DENSE = arrays([[(2, 0.9), (4, 0.8), (1, 0.1)], [(4, 0.5), (2, 0.2)], []], 4)


def test_rrf_equals_the_hand_computation():
    """Cormack et al. (2009): sum over systems of 1 / (k + rank), 1-based ranks, the
    systems' own order (tied BM25 scores keep the order given), zero-score BM25 padding
    left out; fused ties go to the lower article id."""
    ids, scores = fuse(SPARSE, DENSE, Fusion("rrf", k=60))
    assert ids.dtype == np.int64 and scores.dtype == np.float32 and ids.shape == scores.shape == (3, 6)
    # q0: 1 -> ranks 1 (bm25), 3 (dense); 3 -> 2 (bm25); 2 -> 3 (bm25), 1 (dense); 4 -> 2 (dense)
    want = {1: 1 / 61 + 1 / 63, 3: 1 / 62, 2: 1 / 63 + 1 / 61, 4: 1 / 62}
    assert ids[0].tolist() == [1, 2, 3, 4, -1, -1]  # 1 and 2 tie, 3 and 4 tie: lower id first
    np.testing.assert_allclose(scores[0, :4], [want[d] for d in (1, 2, 3, 4)], rtol=1e-6)
    assert ids[1].tolist() == [4, 2, -1, -1, -1, -1]
    np.testing.assert_allclose(scores[1, :2], [1 / 61, 1 / 62], rtol=1e-6)
    assert ids[2].tolist() == [-1] * 6 and not scores[2].any()
    np.testing.assert_allclose(fuse(SPARSE, DENSE, Fusion("rrf", k=0))[1][0, :2], [1 + 1 / 3, 1 + 1 / 3], rtol=1e-6)


def test_wsum_min_max_equals_the_hand_computation():
    """w * minmax(bm25) + (1 - w) * minmax(dense); an article absent from a list gets 0 from it."""
    ids, scores = fuse(SPARSE, DENSE, Fusion("wsum", norm="min-max", weight=0.3))
    bm25 = {1: (2.0 - 0.5) / 1.5, 3: (2.0 - 0.5) / 1.5, 2: 0.0}
    dense = {2: (0.9 - 0.1) / 0.8, 4: (0.8 - 0.1) / 0.8, 1: 0.0}
    want = {d: 0.3 * bm25.get(d, 0.0) + 0.7 * dense.get(d, 0.0) for d in (1, 2, 3, 4)}  # 2: .7, 4: .6125, 1, 3: .3
    assert ids[0, :4].tolist() == [2, 4, 1, 3]
    np.testing.assert_allclose(scores[0, :4], [want[d] for d in (2, 4, 1, 3)], rtol=1e-6)
    assert ids[1, :2].tolist() == [4, 2]
    np.testing.assert_allclose(scores[1, :2], [0.7, 0.0], atol=1e-7)


def test_wsum_zmuv_equals_the_hand_computation():
    """z-scores with the population standard deviation, per question and system."""
    ids, scores = fuse(SPARSE, DENSE, Fusion("wsum", norm="zmuv", weight=0.6))
    b = np.array([2.0, 2.0, 0.5])
    d = np.array([0.9, 0.8, 0.1])
    bz = dict(zip((1, 3, 2), (b - b.mean()) / b.std()))
    dz = dict(zip((2, 4, 1), (d - d.mean()) / d.std()))
    want = {doc: 0.6 * bz.get(doc, 0.0) + 0.4 * dz.get(doc, 0.0) for doc in (1, 2, 3, 4)}
    order = sorted(want, key=lambda doc: (-want[doc], doc))
    assert ids[0, :4].tolist() == order
    np.testing.assert_allclose(scores[0, :4], [want[doc] for doc in order], rtol=1e-6)
    np.testing.assert_allclose(scores[1, :2], [0.4, -0.4], rtol=1e-6)  # dense alone: z = +1, -1


def reference_fuse(sparse, dense, fusion: Fusion, k: int):
    """An independent pure-Python fusion (the formulas of the module docstring)."""

    def lists(ids, scores, drop_zero):
        out = []
        for row_ids, row_scores in zip(ids.tolist(), scores.astype(np.float64).tolist()):
            out.append([(i, s) for i, s in zip(row_ids, row_scores) if i >= 0 and not (drop_zero and s == 0.0)])
        return out

    def norm(row):
        if not row:
            return {}
        s = np.array([x for _, x in row])
        if fusion.norm == "min-max":
            z = (s - s.min()) / max(s.max() - s.min(), 1e-9)
        else:
            z = (s - s.mean()) / max(s.std(), 1e-9)
        return dict(zip([i for i, _ in row], z.tolist()))

    out_ids = np.full((len(sparse[0]), k), -1, dtype=np.int64)
    out_scores = np.zeros((len(sparse[0]), k), dtype=np.float64)
    for q, (a, b) in enumerate(zip(lists(*sparse, True), lists(*dense, False))):
        if fusion.method == "rrf":
            parts = [{i: 1.0 / (fusion.k + r) for r, (i, _) in enumerate(row, start=1)} for row in (a, b)]
            weights = (1.0, 1.0)
        else:
            parts = [norm(a), norm(b)]
            weights = (fusion.weight, 1.0 - fusion.weight)
        docs = set(parts[0]) | set(parts[1])
        fused = {d: weights[0] * parts[0].get(d, 0.0) + weights[1] * parts[1].get(d, 0.0) for d in docs}
        ranked = sorted(fused, key=lambda d: (-fused[d], d))[:k]
        out_ids[q, : len(ranked)] = ranked
        out_scores[q, : len(ranked)] = [fused[d] for d in ranked]
    return out_ids, out_scores


def random_rankings(rng, n_questions=12, depth=30, corpus=80, zero_tail=False, short=True):
    ids = np.full((n_questions, depth), -1, dtype=np.int64)
    scores = np.zeros((n_questions, depth), dtype=np.float32)
    for q in range(n_questions):
        m = int(rng.integers(0, depth + 1)) if short and q % 4 == 3 else depth  # some short (or empty) rows
        ids[q, :m] = rng.choice(corpus, size=m, replace=False) + 100
        scores[q, :m] = np.sort(rng.random(m).astype(np.float32) * 10)[::-1]
        if zero_tail and m > 5:
            scores[q, m - 5 : m] = 0.0  # BM25: the matched articles ran out
    return ids, scores


@pytest.mark.parametrize(
    "fusion",
    [
        Fusion("rrf", k=0),
        Fusion("rrf", k=60),
        Fusion("wsum", norm="min-max", weight=0.25),
        Fusion("wsum", norm="zmuv", weight=0.7),
        Fusion("wsum", norm="min-max", weight=1.0),
    ],
    ids=lambda f: f.label,
)
def test_fusion_equals_an_independent_reference_on_random_rankings(fusion):
    rng = np.random.default_rng(7)
    sparse, dense = random_rankings(rng, zero_tail=True), random_rankings(rng)
    got_ids, got_scores = fuse(sparse, dense, fusion, 45)
    want_ids, want_scores = reference_fuse(sparse, dense, fusion, 45)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_allclose(got_scores, want_scores, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # ranx compiles its numba kernels on first use (about 40 s with the test below): CI's slow step
def test_fused_scores_agree_with_ranx_fuse_called_directly():
    """On tie-free scores, feeding ranx the systems' own scores gives the same fused
    scores as the hybrid's own path (ranks in place of scores for RRF)."""
    from ranx import Run
    from ranx import fuse as ranx_fuse

    rng = np.random.default_rng(3)
    sparse, dense = random_rankings(rng, 8, 20, 50, short=False), random_rankings(rng, 8, 20, 50, short=False)

    def run(ids, scores):
        return Run.from_dict(
            {
                str(q): {str(i): float(s) for i, s in zip(r_ids, r_s) if i >= 0}
                for q, (r_ids, r_s) in enumerate(zip(ids.tolist(), scores.tolist()))
            }
        )

    for fusion in (
        Fusion("rrf", k=60),
        Fusion("wsum", norm="min-max", weight=0.4),
        Fusion("wsum", norm="zmuv", weight=0.4),
    ):
        args = fusion.ranx_args()
        theirs = ranx_fuse(
            [run(*sparse), run(*dense)], norm=args["norm"], method=args["method"], params=args["params"]
        ).to_dict()
        ids, scores = fuse(sparse, dense, fusion, 40)
        for q in range(8):
            want = theirs[str(q)]
            got = {str(i): float(s) for i, s in zip(ids[q].tolist(), scores[q].tolist()) if i >= 0}
            assert set(got) == set(want)
            np.testing.assert_allclose([got[d] for d in want], list(want.values()), rtol=1e-6, atol=1e-7)


def exact_cases():
    """Rankings on which the numpy fusion must give ranx's numbers to the last bit: the hand
    example (ties, zero-score BM25 padding, empty rows), random rankings with short and
    empty rows, the same with many tied scores, and long (depth 1000) float32 lists,
    where a pairwise sum (numpy's) and a left-to-right one (ranx's numba) differ."""
    rng = np.random.default_rng(11)
    cases = [(SPARSE, DENSE)]
    for _ in range(3):
        cases.append((random_rankings(rng, zero_tail=True), random_rankings(rng)))
    sparse, dense = random_rankings(rng, zero_tail=True), random_rankings(rng)
    cases.append(
        (
            (sparse[0], np.round(sparse[1]).astype(np.float32)),
            (dense[0], (np.round(dense[1] * 2) / 2).astype(np.float32)),
        )
    )
    long = []
    for scale, offset in ((3.0, 10.0), (0.1, 0.5)):
        ids = np.stack([rng.choice(3000, size=1000, replace=False) for _ in range(4)]).astype(np.int64)
        scores = np.sort((rng.standard_normal((4, 1000)) * scale + offset).astype(np.float32), axis=1)[:, ::-1]
        long.append((ids, np.ascontiguousarray(scores)))
    cases.append(tuple(long))
    return cases


# ---------------------------------------------------------------------------
# The reference: ranx.fuse itself (the library ships the numpy port only)
# ---------------------------------------------------------------------------

_PLACEHOLDER = "-1"  # stands in for an empty list: ranx needs every query in every run


def ranx_run(rows, by_rank: bool):
    """A :class:`ranx.Run` with query ``str(i)`` for row ``i`` of ``rows`` (``(ids, scores)``
    as :func:`fuse` keeps them); ``by_rank`` replaces the scores by ``len + 1 - rank``
    (strictly decreasing: ranx's sort keeps the row's order)."""
    from ranx import Run

    d = {}
    for i, (row_ids, row_scores) in enumerate(rows):
        if row_ids.size == 0:
            d[str(i)] = {_PLACEHOLDER: 0.0}
            continue
        values = np.arange(row_ids.size, 0, -1, dtype=np.float64) if by_rank else row_scores  # (m,)
        d[str(i)] = dict(zip(map(str, row_ids.tolist()), values.tolist()))
    return Run.from_dict(d)


def fused_rows_ranx(sparse, dense, fusion: Fusion) -> list[dict[int, float]]:
    """``Prepared.fused_rows`` computed by :func:`ranx.fuse`: each question's whole fused list
    as ``{article id: float64 score}`` (the same entries fused: padding and BM25's zero scores left out)."""
    import ranx

    rows = hybrid_module._rows(*sparse, drop_zero=True), hybrid_module._rows(*dense, drop_zero=False)
    if not rows[0]:
        return []
    by_rank = fusion.method == "rrf"
    with warnings.catch_warnings():  # numba: "unsafe cast from uint64 to int64" inside ranx's RRF
        warnings.simplefilter("ignore")
        fused = ranx.fuse([ranx_run(r, by_rank) for r in rows], **fusion.ranx_args()).to_dict()
    return [
        {}
        if s[0].size == 0 and d[0].size == 0
        else {int(doc): float(score) for doc, score in fused[str(i)].items() if doc != _PLACEHOLDER}
        for i, (s, d) in enumerate(zip(*rows))
    ]


def fuse_ranx(sparse, dense, fusion: Fusion, k: int | None = None):
    """:func:`fuse` through :func:`ranx.fuse` itself (slower: numba typed dictionaries compiled
    at first use, then read key by key): ``ids`` int64 / ``scores`` float32 ``(n, k)``."""
    prepared = _Prepared(sparse, dense)
    k = prepared.width if k is None else int(k)
    ids = np.full((prepared.n, k), -1, dtype=np.int64)  # (n, k)
    scores = np.zeros((prepared.n, k), dtype=np.float32)  # (n, k)
    if prepared.n == 0 or k == 0:
        return ids, scores
    for i, row in enumerate(fused_rows_ranx(sparse, dense, fusion)):
        doc_ids = np.fromiter(row.keys(), dtype=np.int64, count=len(row))  # (m,)
        doc_scores = np.fromiter(row.values(), dtype=np.float64, count=len(row))  # (m,)
        order = np.lexsort((doc_ids, -doc_scores))[:k]  # fused score descending, then lower id
        ids[i, : order.size] = doc_ids[order]
        scores[i, : order.size] = doc_scores[order]
    return ids, scores


EXACT_FUSIONS = [Fusion("rrf", k=0), Fusion("rrf", k=1), Fusion("rrf", k=60)] + [
    Fusion("wsum", norm=norm, weight=w) for norm in ("min-max", "zmuv") for w in (0.0, 0.1, 0.3, 0.7, 1.0)
]


@pytest.mark.slow  # ranx's numba compilation (see above); the hand computations above stay in the fast suite
@pytest.mark.parametrize("fusion", EXACT_FUSIONS, ids=lambda f: f.label)
def test_fusion_equals_ranx_fuse_to_the_last_bit(fusion):
    """`fuse` computes ranx.fuse's scores with numpy (ranx's runs cost seconds of numba
    compilation and typed-dictionary reads per stage); ranx stays the reference: every
    fused article and its float64 score are ranx's exactly, and so are the cut lists."""
    for sparse, dense in exact_cases():
        prepared = _Prepared(sparse, dense)
        assert prepared.fused_rows(fusion) == fused_rows_ranx(sparse, dense, fusion)
        for k in (None, 45, 0):
            got, want = fuse(sparse, dense, fusion, k), fuse_ranx(sparse, dense, fusion, k)
            np.testing.assert_array_equal(got[0], want[0])
            assert got[1].dtype == want[1].dtype == np.float32 and got[1].tobytes() == want[1].tobytes()


def test_fusion_in_blocks_equals_fusion_in_one_block(monkeypatch):
    """Questions are laid out in blocks (bounded memory); the block size changes nothing."""
    sparse, dense = random_rankings(np.random.default_rng(5), zero_tail=True), random_rankings(np.random.default_rng(6))
    whole = [fuse(sparse, dense, f, 50) for f in EXACT_FUSIONS]
    monkeypatch.setattr(hybrid_module, "_BLOCK", 5)
    assert len(_Prepared(sparse, dense)._blocks) == 3
    for f, (ids, scores) in zip(EXACT_FUSIONS, whole):
        got_ids, got_scores = fuse(sparse, dense, f, 50)
        np.testing.assert_array_equal(got_ids, ids)
        assert got_scores.tobytes() == scores.tobytes()


def test_fusion_refuses_an_article_ranked_twice():
    ids, scores = arrays([[(1, 2.0), (1, 1.0)]], 2)
    with pytest.raises(ValueError, match="row 0 of the sparse ranking holds an article twice"):
        fuse((ids, scores), arrays([[(2, 0.5)]], 2), Fusion("rrf", k=60))


def test_fusion_refuses_bad_parameters():
    for bad in (
        dict(method="rrf", k=-1),
        dict(method="rrf", k=60, norm="zmuv"),
        dict(method="wsum", norm="max", weight=0.5),
        dict(method="wsum", norm="min-max", weight=1.5),
        dict(method="combmnz"),
    ):
        with pytest.raises(LexgraphError, match="is not valid"):
            Fusion(**bad)


def test_one_system_alone_is_its_ranking_as_given():
    """``bm25`` / ``dense`` alone: that list unchanged (BM25's zero-score padding kept, as BM25
    ranks on its own), cut or padded to k; not a fusion, so ranx has no arguments for it."""
    ids, scores = fuse(SPARSE, DENSE, Fusion("bm25"), 3)
    np.testing.assert_array_equal(ids, SPARSE[0][:, :3])
    np.testing.assert_array_equal(scores, SPARSE[1][:, :3])
    ids, scores = fuse(SPARSE, DENSE, Fusion("dense"), 6)
    np.testing.assert_array_equal(ids[:, :4], DENSE[0])
    assert np.all(ids[:, 4:] == -1) and np.all(scores[:, 4:] == 0) and scores.dtype == np.float32
    assert Fusion("bm25").alone and not Fusion("rrf", k=60).alone and Fusion("dense").label == "dense alone"
    assert Fusion.from_dict(Fusion("bm25").as_dict()) == Fusion("bm25")
    with pytest.raises(LexgraphError, match="or one of bm25, dense alone"):
        Fusion("bm25", k=60)
    with pytest.raises(LexgraphError, match="is no fusion"):
        Fusion("dense").ranx_args()
