"""Optional numba kernel for :meth:`lexgraph.retrieval.bm25.BM25.search_tokens`.

Same result, bit for bit, as the scipy path (``q @ weights`` then
:func:`lexgraph.retrieval.bm25.sparse_topk`) when every weight is ``>= 0`` (the default
``idf_floor=0.0``): each query's scores are accumulated in one float32 array, term by
term in the query matrix's column order and posting by posting, which is the order and
the precision of scipy's ``csr_matmat``; then the ``k`` best positive scores are chosen
by (-score, id) with a size-``k`` heap over the documents the query touched, and a query
with fewer than ``k`` positive scores is filled with the lowest-id documents scoring 0
(what densifying and :func:`exact_topk` give). Every weight is > 0 once zero-idf terms are
left out, so a document is new to a query exactly when its score is still 0 (a branch-free
test); only touched documents are reset. A query whose postings exceed 1/64 of the
corpus skips that bookkeeping and scans the accumulator in id order instead (sequential
memory beats visiting a large random subset). A query costs its postings plus one pass over the
documents it touched, with no Python per query.

Used only when ``numba`` imports; ``search_batch`` is ``None`` otherwise (numba is not a
dependency of lexgraph).
"""

from __future__ import annotations

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover - numba is optional
    numba = None


#: a query scans the whole accumulator when its postings exceed n_docs / DENSE_SCAN (the
#: kernel's ``dense_scan`` argument: 0 never scans, a huge value always does)
DENSE_SCAN = 64


def _worse(s1, d1, s2, d2):
    """(score s1, id d1) ranks below (s2, d2): lower score, or equal score and higher id."""
    return s1 < s2 or (s1 == s2 and d1 > d2)


def _sift_down(hs, hd, size, i):
    """Restore the heap below ``i``: the worst (lowest-ranked) entry at the root."""
    while True:
        left = 2 * i + 1
        if left >= size:
            return
        child = left
        right = left + 1
        if right < size and _worse(hs[right], hd[right], hs[left], hd[left]):
            child = right
        if _worse(hs[child], hd[child], hs[i], hd[i]):
            hs[i], hs[child] = hs[child], hs[i]
            hd[i], hd[child] = hd[child], hd[i]
            i = child
        else:
            return


def _push(s, d, size, hs, hd, k):
    """Offer (score s, id d) to the size-``k`` heap ``(hs, hd)`` holding ``size``; returns the new size."""
    if size < k:  # fill, then heapify once full
        hs[size] = s
        hd[size] = d
        size += 1
        if size == k:
            for r in range(k // 2 - 1, -1, -1):
                _sift_down(hs, hd, k, r)
    elif _worse(hs[0], hd[0], s, d):
        hs[0] = s
        hd[0] = d
        _sift_down(hs, hd, k, 0)
    return size


def _select_scan(acc, hs, hd, k):
    """The positive scores of ``acc`` in id order into the heap; returns its size. In id order
    a score equal to the heap's worst never beats it (its id is higher): only ``>`` enters."""
    size = 0
    floor = np.float32(0.0)  # 0 while filling, then the heap's worst score
    for d in range(acc.size):
        s = acc[d]
        if s > floor:
            size = _push(s, d, size, hs, hd, k)
            if size == k:
                floor = hs[0]
    return size


def _select_touched(acc, touched, n, hs, hd, k):
    """The positive scores of documents ``touched[:n]`` (any order) into the heap; returns its size."""
    size = 0
    floor = np.float32(0.0)
    for i in range(n):
        d = touched[i]
        s = acc[d]
        if s > floor or (s == floor and s > 0.0):  # a tie with the worst may beat it by a lower id
            size = _push(s, d, size, hs, hd, k)
            if size == k:
                floor = hs[0]
    return size


def _search_batch(q_indptr, q_indices, q_data, w_indptr, w_indices, w_data, n_docs, k, out_cols, out_vals,
                  dense_scan):
    nq = q_indptr.shape[0] - 1
    acc = np.zeros(n_docs, dtype=np.float32)  # (n_docs,) scores of the current query
    touched = np.empty(n_docs + 1, dtype=np.int32)  # documents with a posting, each once
    hs = np.empty(k, dtype=np.float32)  # heap of the k best (score, id) so far, worst at the root
    hd = np.empty(k, dtype=np.int64)
    for row in range(nq):
        # a query whose postings cover a good part of the corpus scans the accumulator in
        # order (sequential memory); a selective one visits only the documents it touched
        n_post = 0
        for p in range(q_indptr[row], q_indptr[row + 1]):
            n_post += w_indptr[q_indices[p] + 1] - w_indptr[q_indices[p]]
        scan = n_post * dense_scan > n_docs
        n_touched = 0
        for p in range(q_indptr[row], q_indptr[row + 1]):
            t = q_indices[p]
            v = q_data[p]
            if scan:
                for j in range(w_indptr[t], w_indptr[t + 1]):
                    acc[w_indices[j]] += v * w_data[j]
            else:
                for j in range(w_indptr[t], w_indptr[t + 1]):
                    d = w_indices[j]
                    touched[n_touched] = d  # kept (counted) only on the document's first posting
                    n_touched += acc[d] == 0.0
                    acc[d] += v * w_data[j]
        if scan:
            size = _select_scan(acc, hs, hd, k)
        else:
            size = _select_touched(acc, touched, n_touched, hs, hd, k)
        # best first: ascending id, then a stable sort by descending score
        by_id = np.argsort(hd[:size])
        cand = hd[:size][by_id]
        neg = -hs[:size][by_id]
        order = np.argsort(neg, kind="mergesort")
        for i in range(size):
            out_cols[row, i] = cand[order[i]]
            out_vals[row, i] = -neg[order[i]]
        if size < k:  # fewer positive scores than k: the lowest-id documents scoring 0
            d = 0
            i = size
            while i < k:
                if not acc[d] > 0.0:
                    out_cols[row, i] = d
                    out_vals[row, i] = 0.0
                    i += 1
                d += 1
        if scan:
            acc[:] = 0.0
        else:
            for i in range(n_touched):
                acc[touched[i]] = 0.0


if numba is not None:
    _worse = numba.njit(inline="always")(_worse)
    _sift_down = numba.njit(_sift_down)
    _push = numba.njit(inline="always")(_push)
    _select_scan = numba.njit(_select_scan)
    _select_touched = numba.njit(_select_touched)
    search_batch = numba.njit(cache=True, nogil=True)(_search_batch)
else:  # pragma: no cover
    search_batch = None
