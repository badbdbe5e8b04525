"""BM25's scoring kernels: the idf (Robertson's or Lucene's, with its floor), the per-posting
BM25 weights, and the exact top-k of a score matrix, dense or sparse (with the numba kernel of
:mod:`lexgraph.search.bm25_numba` when it imports); :class:`lexgraph.search.bm25.BM25`
builds on them.

The idf of a term in ``df`` of ``N`` documents (:func:`idf_values`):

* ``robertson``: ``ln((N - df + 0.5) / (df + 0.5))``, negative when ``df > N/2``, 0 at ``df = N/2``;
* ``lucene``: ``ln(1 + (N - df + 0.5) / (df + 0.5))`` (Lucene's ``BM25Similarity``), always > 0,
  decreasing in ``df`` down to ``eps(N) = ln(1 + 0.5 / (N + 0.5))`` at ``df = N``.

The floor (``idf_floor``) then applies to either:

* ``"lucene-min"`` (:data:`DEFAULT_IDF_FLOOR`): ``idf = max(idf, eps(N))``, with ``eps(N)`` the
  smallest idf Lucene's formula ever gives. Parameter-free, never negative, never 0, monotone in
  ``df``; equal to the formula's value wherever that is ``>= eps(N)`` (Robertson's, for integer
  ``df``: every ``df < N/2``, since its positive values are all ``>= ln(1 + 2/N) > eps(N)``;
  Lucene's: always). A term in every document still ranks the documents that hold it.
* a number ``x``: every negative idf replaced by ``x`` (idfs ``>= 0`` kept): ``0.0`` is bm25s's
  ``method="robertson"`` and lexgraph's default before issue 41 (a term in half of the documents
  or more adds nothing, so a question of only such terms matches no article); rank_bm25's
  ``BM25Okapi`` is ``x = 0.25 * mean(idf)``.
* ``None``: the idf as the formula gives it (negative ones push documents down).
"""

from __future__ import annotations

import logging
import math
import numbers

import numpy as np

log = logging.getLogger(__name__)

WEIGHT_SLICE = 1 << 16  # postings weighted at a time by bm25_weights (bounds its float64 temporaries)


ROBERTSON, LUCENE = "robertson", "lucene"
#: the idf formulas (``BM25(idf=...)``); see the module docstring
IDF_VARIANTS = (ROBERTSON, LUCENE)
LUCENE_MIN = "lucene-min"
#: the idf variant and floor of a new index (saved in its ``bm25.json``; an index saved before
#: issue 41 keeps its own: Robertson's with the number it holds)
DEFAULT_IDF = ROBERTSON
DEFAULT_IDF_FLOOR = LUCENE_MIN


def lucene_min(n_docs: int) -> float:
    """``eps(N) = ln(1 + 0.5 / (N + 0.5))``: Lucene's idf ``ln(1 + (N - df + 0.5) / (df + 0.5))`` of a
    term in all ``N`` documents, the smallest it ever gives (the ``"lucene-min"`` floor)."""
    return float(np.log1p(0.5 / (n_docs + 0.5)))


def idf_problem(idf, idf_floor) -> str | None:
    """What is wrong with an ``idf`` / ``idf_floor`` pair, in one phrase naming the key; None when fine."""
    if not (isinstance(idf, str) and idf in IDF_VARIANTS):
        return f"idf = {idf!r}, expected one of {', '.join(map(repr, IDF_VARIANTS))}"
    if idf_floor is None or (isinstance(idf_floor, str) and idf_floor == LUCENE_MIN):
        return None
    if isinstance(idf_floor, numbers.Real) and not isinstance(idf_floor, (bool, np.bool_)) and math.isfinite(idf_floor):
        return None
    return f"idf_floor = {idf_floor!r}, expected {LUCENE_MIN!r}, a finite number or null (None)"


def idf_values(
    df: np.ndarray, n_docs: int, idf: str = DEFAULT_IDF, idf_floor: float | str | None = DEFAULT_IDF_FLOOR
) -> np.ndarray:
    """The float64 idf of every term (document frequencies ``df`` among ``n_docs``): Robertson's
    ``ln((N - df + 0.5) / (df + 0.5))`` or Lucene's ``ln(1 + (N - df + 0.5) / (df + 0.5))`` (``idf``),
    then ``idf_floor``: ``"lucene-min"`` ``max(idf, ln(1 + 0.5 / (N + 0.5)))``, a number ``x`` every
    negative idf replaced by ``x``, ``None`` none (the module docstring)."""
    df = np.asarray(df, dtype=np.float64)
    ratio = (n_docs - df + 0.5) / (df + 0.5)
    values = np.log(ratio) if idf == ROBERTSON else np.log1p(ratio)
    if idf_floor == LUCENE_MIN:
        return np.maximum(values, lucene_min(n_docs))
    if idf_floor is not None:
        return np.where(values < 0.0, float(idf_floor), values)
    return values


def robertson_idf(df: np.ndarray, n_docs: int, idf_floor: float | str | None = DEFAULT_IDF_FLOOR) -> np.ndarray:
    """Robertson's ``ln((N - df + 0.5) / (df + 0.5))`` per term, floored by ``idf_floor`` (:func:`idf_values`)."""
    return idf_values(df, n_docs, ROBERTSON, idf_floor)


def bm25_weights(tf, doc_len: np.ndarray, idf: np.ndarray, k1: float, b: float) -> tuple[np.ndarray, bool]:
    """The float32 BM25 weight of every posting of the CSR count matrix ``tf`` (terms x
    documents), ``idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))`` computed in
    float64 then rounded, and whether every weight of a term whose idf is not 0 is > 0 (the
    numba kernel's precondition). Done by slices of whole terms of about
    :data:`WEIGHT_SLICE` postings, so the float64 temporaries stay small whatever the corpus."""
    avgdl = float(doc_len.mean()) if doc_len.size else 0.0
    avgdl = avgdl or 1.0
    indptr = tf.indptr
    w32 = np.empty(tf.nnz, dtype=np.float32)
    positive = True
    starts = np.searchsorted(indptr, np.arange(0, tf.nnz, WEIGHT_SLICE), side="right") - 1
    for t0, t1 in zip(starts, [*starts[1:], tf.shape[0]]):
        lo, hi = int(indptr[t0]), int(indptr[t1])
        if lo == hi:
            continue
        # in place, the very operations (order and rounding) of
        # idf * tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * dl / avgdl)): four float64 arrays alive
        counts = tf.data[lo:hi].astype(np.float64)
        norm = np.multiply(doc_len[tf.indices[lo:hi]], b, dtype=np.float64)
        norm /= avgdl
        norm += 1.0 - b
        norm *= k1
        idf_p = np.repeat(idf[t0:t1], np.diff(indptr[t0 : t1 + 1]))
        w = idf_p * counts
        w *= k1 + 1.0
        norm += counts
        with np.errstate(invalid="ignore", divide="ignore"):
            w /= norm
        w32[lo:hi] = w
        positive = positive and bool(np.all(w32[lo:hi][idf_p != 0.0] > 0))
    return w32, positive


def exact_topk(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` of every row of a dense ``(n, m)`` score matrix.

    Returns ``(cols, values)``, both ``(n, k)``, best first; equal scores are ordered
    by increasing column, and the set is exact at the cut-off too (of several columns
    tied at the k-th score, the lowest ones are kept). ``k`` must be ``<= m``.
    """
    n, m = scores.shape
    if not 0 < k <= m:
        raise ValueError(f"k={k} must be in 1..{m}")
    if n == 0:
        return np.empty((0, k), dtype=np.int64), np.empty((0, k), dtype=scores.dtype)
    if k == m:
        cols = np.argsort(-scores, axis=1, kind="stable")
        return cols.astype(np.int64, copy=False), np.take_along_axis(scores, cols, axis=1)
    cols = np.argpartition(scores, m - k, axis=1)[:, m - k :]  # (n, k) the k largest, any order
    thr = np.take_along_axis(scores, cols, axis=1).min(axis=1)  # (n,) k-th largest score
    n_ge = np.count_nonzero(scores >= thr[:, None], axis=1)  # (n,)
    cols.sort(axis=1)  # ascending column: a stable sort below then breaks ties by column
    for row in np.flatnonzero(n_ge > k):
        # more columns tie at the threshold than fit: keep all above it, then the lowest tied ones
        s, t = scores[row], thr[row]
        above = np.flatnonzero(s > t)
        tied = np.flatnonzero(s == t)[: k - above.size]
        cols[row] = np.sort(np.concatenate([above, tied]))
    vals = np.take_along_axis(scores, cols, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    cols = np.take_along_axis(cols, order, axis=1).astype(np.int64, copy=False)
    return cols, np.take_along_axis(vals, order, axis=1)


def sparse_topk(
    indptr: np.ndarray, cols: np.ndarray, vals: np.ndarray, n_cols: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`exact_topk` of a CSR score matrix whose missing entries score 0.

    Same result as densifying and calling :func:`exact_topk`; a row whose k-th best
    explicit score is positive is solved from its explicit entries alone (no missing
    entry can reach it), any other row is densified.
    """
    n = len(indptr) - 1
    out_cols = np.empty((n, k), dtype=np.int64)
    out_vals = np.empty((n, k), dtype=np.float32)
    for row in range(n):
        a, b = int(indptr[row]), int(indptr[row + 1])
        size = b - a
        v = vals[a:b]
        if size >= k:
            thr = np.partition(v, size - k)[size - k]  # k-th largest explicit score
            if thr > 0:
                keep = np.flatnonzero(v >= thr)
                c, s = cols[a:b][keep], v[keep]
                order = np.lexsort((c, -s))[:k]  # score descending, then column ascending
                out_cols[row], out_vals[row] = c[order], s[order]
                continue
        dense = np.zeros((1, n_cols), dtype=np.float32)
        dense[0, cols[a:b]] = v
        c, s = exact_topk(dense, k)
        out_cols[row], out_vals[row] = c[0], s[0]
    return out_cols, out_vals


def kernel_scan() -> int:
    """The numba kernel's ``dense_scan`` ratio (read per call, so tests can force either mode)."""
    from lexgraph.search.bm25_numba import DENSE_SCAN

    return int(DENSE_SCAN)
