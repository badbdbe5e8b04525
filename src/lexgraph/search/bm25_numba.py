"""Optional numba kernel for :meth:`lexgraph.search.bm25.BM25.search_tokens`.

Same result, bit for bit, as the scipy path (``q @ weights`` then
:func:`lexgraph.search.bm25_kernels.sparse_topk`) when every weight is ``>= 0`` (any
``idf_floor >= 0``: the default ``"lucene-min"``, or ``0.0``). All the queries of a batch go
through one call, one after the other on one thread, with buffers allocated once per call.

Scoring. Each query's scores are accumulated in one float32 array, term by term in the
query matrix's column order and posting by posting, each posting adding ``count * weight``:
the order and the precision of scipy's ``csr_matmat``. The weights are the BM25 "impacts",
``idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))``, precomputed per posting when
the index is built (:func:`lexgraph.search.bm25_kernels.bm25_weights`).

Selection. Every weight is > 0 once zero-idf terms are left out, so every score is >= 0
and a positive float32 orders like its bit pattern read as an integer. A candidate is one
uint64 key, ``score bits << 32 | (2**32 - 1 - doc)`` (``doc`` the column, in increasing
article-id order, < 2**32): a larger key is a better document (higher score, then lower id),
so the top-k is the k largest keys and keys never tie.
Candidates above a floor are appended to a buffer of ``k + max(k, 64)`` keys; when it is
full, an in-place quickselect keeps its ``k`` largest and the floor rises to the smallest
of them. At the end the buffer's ``k`` largest are sorted. A query with fewer than ``k``
positive scores is filled with the lowest-id documents scoring 0 (what densifying and
:func:`exact_topk` give).

Two ways to find the candidates, chosen per query by its number of postings:

* **scan** (postings > n_docs / :data:`DENSE_SCAN`, nearly every query of a real corpus):
  the accumulator is read in id order, 64 documents at a time; a branch-free (vectorised)
  test skips a block with no score above the floor, and in the other blocks a bit mask
  visits only the documents above it. In id order a later document never wins a tie, so the
  floor compares scores alone. The accumulator is then zeroed in one pass.
* **touched** (selective queries): a document is new to a query exactly when its score is
  still 0 (a branch-free test), so the documents with a posting are listed once while
  accumulating; only they are visited (full keys against the floor) and reset.

Used only when ``numba`` imports; ``search_batch`` is ``None`` otherwise (numba is not a
dependency of lexgraph).
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)

try:
    import numba
except ImportError:  # pragma: no cover - numba is optional
    numba = None


#: a query scans the whole accumulator when its postings exceed n_docs / DENSE_SCAN (the
#: kernel's ``dense_scan`` argument: 0 never scans, a huge value always does)
DENSE_SCAN = 64

_BLOCK = 64  # documents per block of the scan (one uint64 bit mask)
_LOW = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)
# count of trailing zero bits by a De Bruijn sequence: ((x & -x) * _DEBRUIJN) >> 58 indexes _CTZ
_DEBRUIJN = np.uint64(0x03F79D71B4CB0A89)
_CTZ = np.array(
    [
        0,
        1,
        48,
        2,
        57,
        49,
        28,
        3,
        61,
        58,
        50,
        42,
        38,
        29,
        17,
        4,
        62,
        55,
        59,
        36,
        53,
        51,
        43,
        22,
        45,
        39,
        33,
        30,
        24,
        18,
        12,
        5,
        63,
        47,
        56,
        27,
        60,
        41,
        37,
        16,
        54,
        35,
        52,
        21,
        44,
        32,
        23,
        11,
        46,
        26,
        40,
        15,
        34,
        20,
        31,
        10,
        25,
        14,
        19,
        9,
        13,
        8,
        7,
        6,
    ],
    dtype=np.int64,
)


def _key(score_bits, doc):
    """A candidate's uint64 key: higher score first, then lower id; distinct for distinct ``doc``."""
    return (np.uint64(score_bits) << _SHIFT) | (_LOW - np.uint64(doc))


def _lowest_bit(mask):
    """Index of the lowest set bit of a non-zero uint64."""
    return _CTZ[((mask & (~mask + np.uint64(1))) * _DEBRUIJN) >> np.uint64(58)]


def _keep_largest(buf, n, k):
    """Reorder ``buf[:n]`` (distinct keys, ``n > k``) so that ``buf[:k]`` are its ``k`` largest,
    in no order (quickselect, median-of-three pivot); returns the smallest of them."""
    lo = 0
    hi = n - 1
    while hi > lo:
        mid = (lo + hi) >> 1
        a, b, c = buf[lo], buf[mid], buf[hi]
        if (a > b) == (b > c):
            p = mid
        elif (b > a) == (a > c):
            p = lo
        else:
            p = hi
        pivot = buf[p]
        buf[p] = buf[hi]
        buf[hi] = pivot
        store = lo
        for i in range(lo, hi):  # branch-free Lomuto partition: the larger keys first
            x = buf[i]
            buf[i] = buf[store]
            buf[store] = x
            store += x > pivot
        buf[hi] = buf[store]
        buf[store] = pivot  # buf[lo:store] > pivot > buf[store + 1 : hi + 1]
        if store == k - 1 or store == k:
            break
        if store > k:
            hi = store - 1
        else:
            lo = store + 1
    smallest = buf[0]
    for i in range(1, k):
        smallest = min(smallest, buf[i])
    return smallest


def _accumulate(row, q_indptr, q_indices, q_data, w_indptr, w_indices, w_data, acc, touched, n_docs, dense_scan):
    """Add query ``row``'s scores into ``acc``; returns ``(scan, n_touched)``: whether the
    query scans the whole accumulator (its postings exceed ``n_docs / dense_scan``) and, when
    it does not, how many documents it touched (listed once each in ``touched``)."""
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
    return scan, n_touched


def _scan_candidates(bits, blocks, n_blocks, n_docs, buf, cap, k):
    """The scan: every document above the floor, in id order, 64 at a time, into ``buf``
    (its ``k`` largest kept whenever it fills); returns the number of keys in ``buf``."""
    n = 0  # keys in buf
    floor = np.int32(0)  # scores (as bits) <= floor cannot enter
    for blk in range(n_blocks + 1):
        base = blk * _BLOCK
        mask = np.uint64(0)
        if blk < n_blocks:
            hit = 0
            for i in range(_BLOCK):  # vectorised: most blocks stop here
                hit |= blocks[blk, i] > floor
            if hit == 0:
                continue
            for i in range(_BLOCK):
                mask |= np.uint64(blocks[blk, i] > floor) << np.uint64(i)
        else:
            for i in range(n_docs - base):
                mask |= np.uint64(bits[base + i] > floor) << np.uint64(i)
        while mask:
            d = base + _lowest_bit(mask)
            mask &= mask - np.uint64(1)
            if bits[d] > floor:  # the floor may have risen within the block
                buf[n] = _key(bits[d], d)
                n += 1
                if n == cap:
                    floor = np.int32(_keep_largest(buf, n, k) >> _SHIFT)
                    n = k
    return n


def _touched_candidates(bits, touched, n_touched, buf, cap, k):
    """Only the touched documents, their full keys against the floor, into ``buf``; returns
    the number of keys in ``buf``."""
    n = 0  # keys in buf
    floor_key = np.uint64(0)  # keys <= floor_key cannot enter
    for i in range(n_touched):
        d = touched[i]
        key = _key(bits[d], d)
        if key > floor_key:
            buf[n] = key
            n += 1
            if n == cap:
                floor_key = _keep_largest(buf, n, k)
                n = k
    return n


def _write_row(row, buf, n, k, acc, out_cols, out_vals):
    """Row ``row`` of the output: the ``k`` largest of ``buf[:n]`` best first, then, when
    fewer than ``k`` documents score above 0, the lowest-id documents scoring 0."""
    if n > k:
        _keep_largest(buf, n, k)
        n = k
    best = buf[:n]
    best.sort()  # ascending: read backwards for best first
    for i in range(n):
        d = np.int64(_LOW - (best[n - 1 - i] & _LOW))
        out_cols[row, i] = d
        out_vals[row, i] = acc[d]
    if n < k:  # fewer positive scores than k: the lowest-id documents scoring 0
        d = 0
        i = n
        while i < k:
            if not acc[d] > 0.0:
                out_cols[row, i] = d
                out_vals[row, i] = 0.0
                i += 1
            d += 1


def _search_batch(q_indptr, q_indices, q_data, w_indptr, w_indices, w_data, n_docs, k, out_cols, out_vals, dense_scan):
    nq = q_indptr.shape[0] - 1
    acc = np.zeros(n_docs, dtype=np.float32)  # (n_docs,) scores of the current query
    bits = acc.view(np.int32)  # the same scores as integers: same order, since they are >= 0
    n_blocks = n_docs // _BLOCK
    blocks = bits[: n_blocks * _BLOCK].reshape(n_blocks, _BLOCK)
    touched = np.empty(n_docs + 1, dtype=np.int32)  # documents with a posting, each once
    cap = k + max(k, _BLOCK)
    buf = np.empty(cap, dtype=np.uint64)  # candidate keys
    for row in range(nq):
        scan, n_touched = _accumulate(
            row, q_indptr, q_indices, q_data, w_indptr, w_indices, w_data, acc, touched, n_docs, dense_scan
        )
        if scan:
            n = _scan_candidates(bits, blocks, n_blocks, n_docs, buf, cap, k)
        else:
            n = _touched_candidates(bits, touched, n_touched, buf, cap, k)
        _write_row(row, buf, n, k, acc, out_cols, out_vals)
        if scan:
            acc[:] = 0.0
        else:
            for i in range(n_touched):
                acc[touched[i]] = 0.0


def _compiled_with_cache(function, **options):
    """``numba.njit(cache=True)`` where numba can keep its cache (a writable ``__pycache__``
    beside this file, ``NUMBA_CACHE_DIR`` or a user-wide folder); on a read-only install with
    no writable HOME numba finds none ("no locator available") and the kernel is compiled
    afresh in each process instead (about a second), rather than failing."""
    try:
        return numba.njit(cache=True, **options)(function)
    except RuntimeError as exc:  # numba: "cannot cache function ...: no locator available for file ..."
        log.info(
            "BM25 kernel: %s; compiling it in this process (set NUMBA_CACHE_DIR to a writable folder "
            "to keep the compiled kernel)",
            exc,
        )
        return numba.njit(**options)(function)


if numba is not None:
    _key = numba.njit(inline="always")(_key)
    _lowest_bit = numba.njit(inline="always")(_lowest_bit)
    _keep_largest = numba.njit(_keep_largest)
    # the pieces of one query's search, inlined into the kernel (compiled as one function)
    _accumulate = numba.njit(inline="always")(_accumulate)
    _scan_candidates = numba.njit(inline="always")(_scan_candidates)
    _touched_candidates = numba.njit(inline="always")(_touched_candidates)
    _write_row = numba.njit(inline="always")(_write_row)
    search_batch = _compiled_with_cache(_search_batch, nogil=True)
else:  # pragma: no cover
    search_batch = None
