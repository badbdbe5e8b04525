"""Exact Okapi BM25 (Robertson) over a sparse term-document matrix.

Scoring, for a query ``q`` (a list of terms) and a document ``d``::

    score(q, d) = sum_{t in q} idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * (1 - b + b * dl(d) / avgdl))
    idf(t)      = max(ln((N - df(t) + 0.5) / (df(t) + 0.5)), eps(N)),   eps(N) = ln(1 + 0.5 / (N + 0.5))

with ``N`` the number of documents, ``df(t)`` the number of documents containing
``t``, ``dl(d)`` the number of terms of ``d`` and ``avgdl`` their mean.

Policies:

* **Repeated query terms** count once per occurrence: the sum runs over the query's
  tokens, so a term written twice in the query contributes twice (as in
  ``rank_bm25.BM25Okapi`` and ``bm25s``).
* **The idf** (:mod:`lexgraph.search.bm25_kernels`, which has the rules in full). ``idf="robertson"``
  (default) is Robertson's ``ln((N - df + 0.5) / (df + 0.5))``, negative for a term in more than
  half of the documents (``df > N/2``); ``idf="lucene"`` is Lucene's
  ``ln(1 + (N - df + 0.5) / (df + 0.5))``, always > 0. ``idf_floor="lucene-min"`` (default)
  raises every idf to at least ``eps(N)``, Lucene's idf of a term in every document: a very
  common term never lowers a score and still ranks the articles that hold it (on a 3-article
  corpus where every article says "salarié", a question "salarié" finds all three), and wherever
  Robertson's idf is ``>= eps(N)`` (every term in fewer than half of the documents) it is
  unchanged. ``idf_floor=x`` replaces every negative idf by ``x``: ``0.0``, the default before
  issue 41 and bm25s's ``method="robertson"``, gives a term in half of the documents or more
  idf 0 (it adds nothing); ``rank_bm25`` uses ``x = 0.25 * mean(idf)``. ``idf_floor=None`` keeps
  negative idfs (documents containing very common query terms are pushed down). Both are saved
  with the index (``bm25.json``), and an index keeps its own when it is loaded.
* Query terms absent from the index contribute nothing.

Implementation: the raw counts ``tf`` are kept as a CSR matrix ``(n_terms, n_docs)``
(int32) together with the document lengths; the per-(term, document) BM25 weights are
precomputed from them (float32, same sparsity), so :meth:`BM25.reweight` changes
``k1``/``b`` in one vectorised pass without re-tokenising. A batch of queries is a
sparse ``(n_queries, n_terms)`` count matrix; one sparse matmul gives the scores of
all matched documents (every other document scores 0), and an exact top-k selects the
best (:func:`sparse_topk`: a partition finds each query's k-th best score, then the
documents at or above it are sorted). When ``numba`` is installed and no weight is
negative, a compiled kernel (:mod:`lexgraph.search.bm25_numba`) does the same per
query with one float32 accumulator, in the same order and precision: identical results,
no Python per query (a whole batch in one call; the top-k kept in a buffer of candidate
keys with a rising floor, see that module). Query terms whose idf is 0 (floored) are left
out of the product: they add 0 to every score (only with a floor of 0 or none). Documents are stored in increasing
article-id order and ties, at the cut-off too, are broken by the lower article id, so
results are deterministic. With the kernel, a top-100 query takes ~0.02 ms on one CPU core
on a 22k-article French corpus and ~0.05 ms on the 90k articles of every French code
(``benchmarks/bm25.py``; README, "BM25 at BSARD's size and on every French code").

Scores are float32 (weights are computed in float64, then rounded); the float32
sums can differ from a float64 reference in the last bits, so two documents whose
exact scores differ by less than that may be ordered as a tie.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from lexgraph.core import layout
from lexgraph.core.errors import LexgraphError
from lexgraph.core.progress import progress_bar

try:  # scipy's compiled CSR x CSR kernel (what ``a @ b`` calls), used to skip its counting pass
    from scipy.sparse._sparsetools import csr_matmat as _csr_matmat
except ImportError:  # pragma: no cover - other scipy layouts: fall back to the public operator
    _csr_matmat = None

from lexgraph.search.bm25_files import ARRAYS, FORMAT, FORMAT_VERSION, META, RESTORE, VOCAB, read_index
from lexgraph.search.bm25_files import write_npz as _write_npz
from lexgraph.search.bm25_kernels import (
    DEFAULT_IDF,
    DEFAULT_IDF_FLOOR,
    bm25_weights,
    idf_problem,
    idf_values,
    kernel_scan,
    sparse_topk,
)

log = logging.getLogger(__name__)

#: the constructor's settings, saved under these keys in ``bm25.json`` and read back by :meth:`BM25.load`
SETTINGS = ("k1", "b", "idf", "idf_floor", "analyzer")


class BM25:
    """Okapi BM25 retriever; see the module docstring for the exact formula and policies.

    ``analyzer`` holds the :class:`lexgraph.text.analyzer.FrenchAnalyzer` options used by
    :meth:`search` and :meth:`fit_texts` (and saved with the index); ``idf`` is the idf formula
    (one of :data:`~lexgraph.search.bm25_kernels.IDF_VARIANTS`) and ``idf_floor`` its floor
    (``"lucene-min"``, a number or ``None``), kept as :attr:`idf_variant` and :attr:`idf_floor`.
    """

    name = "bm25"

    def __init__(
        self,
        k1: float = 1.2,
        b: float = 0.75,
        idf_floor: float | str | None = DEFAULT_IDF_FLOOR,
        analyzer: Mapping[str, bool] | None = None,
        idf: str = DEFAULT_IDF,
    ) -> None:
        self._check_params(k1, b)
        self.k1, self.b = float(k1), float(b)
        self.idf_variant, self.idf_floor = _idf_settings(idf, idf_floor)
        self.analyzer_config = dict(analyzer or {"stem": True, "stopwords": True})
        self._analyzer = None
        self.doc_ids = np.empty(0, dtype=np.int64)
        self.vocab: dict[str, int] = {}
        self.terms: list[str] = []
        self._tf: sp.csr_matrix | None = None  # (n_terms, n_docs) int32 raw counts
        self._weights: sp.csr_matrix | None = None  # (n_terms, n_docs) float32 BM25 weights
        self._zero_idf = np.empty(0, dtype=bool)  # (n_terms,) terms that contribute nothing
        self._positive = True  # every weight of a term with idf != 0 is > 0: the numba kernel's precondition
        self.use_numba = True  # the numba kernel (lexgraph.search.bm25_numba) when numba imports
        self.doc_len = np.empty(0, dtype=np.int64)
        self.doc_freq = np.empty(0, dtype=np.int64)
        self.idf = np.empty(0, dtype=np.float64)
        self.source = ""  # where the index was loaded from (set by :meth:`load`)

    # ------------------------------------------------------------------ building

    @staticmethod
    def _check_params(k1, b) -> None:
        def real(x) -> bool:
            return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_)) and math.isfinite(x)

        ok_k1 = real(k1) and k1 >= 0
        ok_b = real(b) and 0 <= b <= 1
        if not ok_k1:
            raise LexgraphError(f"BM25 k1 = {k1!r}, expected a finite number >= 0")
        if not ok_b:
            raise LexgraphError(f"BM25 b = {b!r}, expected a number in [0, 1]")

    def settings(self) -> dict:
        """The constructor's arguments (:data:`SETTINGS`) that give this index's scoring: what
        :meth:`save` writes to ``bm25.json``, and ``BM25(**index.settings())`` an index of another
        corpus scored the same way."""
        return {
            "k1": self.k1,
            "b": self.b,
            "idf": self.idf_variant,
            "idf_floor": self.idf_floor,
            "analyzer": dict(self.analyzer_config),
        }

    @property
    def article_ids(self) -> np.ndarray:
        """The indexed article ids, ascending (the ids :meth:`search` ranks)."""
        return self.doc_ids

    @property
    def n_docs(self) -> int:
        return int(self.doc_ids.size)

    @property
    def n_terms(self) -> int:
        return len(self.terms)

    @property
    def avgdl(self) -> float:
        return float(self.doc_len.mean()) if self.doc_len.size else 0.0

    @property
    def analyzer(self):
        if self._analyzer is None:
            from lexgraph.text.analyzer import FrenchAnalyzer

            self._analyzer = FrenchAnalyzer(**self.analyzer_config)
        return self._analyzer

    def fit(self, tokenised_docs: Sequence[Sequence[str]], doc_ids: Iterable[int]) -> BM25:
        """Index ``tokenised_docs`` (lists of terms) under the article ids ``doc_ids``."""
        doc_ids = np.asarray(list(doc_ids) if not isinstance(doc_ids, np.ndarray) else doc_ids, dtype=np.int64)
        if doc_ids.ndim != 1 or doc_ids.size != len(tokenised_docs):
            raise LexgraphError(f"BM25.fit: {len(tokenised_docs)} documents but {doc_ids.size} ids")
        if doc_ids.size == 0:
            raise LexgraphError("BM25.fit: the corpus is empty")
        order = np.argsort(doc_ids, kind="stable")
        sorted_ids = doc_ids[order]
        dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
        if dup.size:
            raise LexgraphError(f"BM25.fit: article id {int(sorted_ids[dup[0]])} occurs more than once")
        docs = [tokenised_docs[i] for i in order]

        terms = sorted(set(chain.from_iterable(docs)))
        vocab = {t: i for i, t in enumerate(terms)}
        lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
        n_tokens = int(lengths.sum())
        idx = np.int32 if max(len(terms), n_tokens) < np.iinfo(np.int32).max else np.int64  # 4 bytes a token
        term_idx = np.fromiter((vocab[t] for t in chain.from_iterable(docs)), dtype=idx, count=n_tokens)
        indptr = np.zeros(len(docs) + 1, dtype=idx)
        np.cumsum(lengths, out=indptr[1:])
        # the tokens as a (documents x terms) matrix with repeats; its transpose, converted, lists
        # each term's documents in increasing order, a repeated (term, document) pair adjacent
        by_doc = sp.csr_matrix((np.ones(n_tokens, dtype=np.int32), term_idx, indptr), shape=(len(docs), len(terms)))
        del term_idx, indptr
        tf = by_doc.T.tocsr()
        del by_doc
        tf.sum_duplicates()
        tf.sort_indices()
        # compact copies: tocsr's arrays are sized by the tokens, the postings are fewer
        tf = sp.csr_matrix((tf.data.copy(), tf.indices.copy(), tf.indptr), shape=tf.shape)

        self.doc_ids, self.terms, self.vocab = sorted_ids, terms, vocab
        self._set_tf(tf, lengths)
        log.info(
            "BM25 index: %d documents, %d terms, %d postings, avgdl %.1f", self.n_docs, self.n_terms, tf.nnz, self.avgdl
        )
        return self

    def fit_texts(self, texts: Sequence[str], doc_ids: Iterable[int]) -> BM25:
        """Analyse ``texts`` with this index's analyzer, then :meth:`fit`."""
        return self.fit(self.analyzer.analyze_many(texts, desc="analyze articles"), doc_ids)

    def _set_tf(self, tf: sp.csr_matrix, lengths: np.ndarray) -> None:
        idx_dtype = np.int32 if tf.nnz < np.iinfo(np.int32).max else np.int64
        tf = sp.csr_matrix(
            (
                tf.data.astype(np.int32, copy=False),
                tf.indices.astype(idx_dtype, copy=False),
                tf.indptr.astype(idx_dtype, copy=False),
            ),
            shape=tf.shape,
        )
        self._tf = tf
        self.doc_len = lengths.astype(np.int64, copy=False)
        self.doc_freq = np.diff(tf.indptr).astype(np.int64)
        self.idf = idf_values(self.doc_freq, self.n_docs, self.idf_variant, self.idf_floor)
        self._compute_weights()

    def _compute_weights(self) -> None:
        w32, self._positive = bm25_weights(self._tf, self.doc_len, self.idf, self.k1, self.b)
        self._weights = sp.csr_matrix((w32, self._tf.indices, self._tf.indptr), shape=self._tf.shape)
        self._zero_idf = self.idf == 0.0  # (n_terms,) every weight of such a term is 0

    def reweight(self, k1: float, b: float) -> BM25:
        """Switch to new ``k1``/``b`` from the stored counts (no re-tokenising, no refit)."""
        self._require_fitted()
        self._check_params(k1, b)
        self.k1, self.b = float(k1), float(b)
        self._compute_weights()
        return self

    def set_idf_floor(self, idf_floor: float | str | None) -> BM25:
        """Change the idf floor (see the module docstring) and recompute weights."""
        self._require_fitted()
        self.idf_variant, self.idf_floor = _idf_settings(self.idf_variant, idf_floor)
        self.idf = idf_values(self.doc_freq, self.n_docs, self.idf_variant, self.idf_floor)
        self._compute_weights()
        return self

    def _require_fitted(self) -> None:
        if self._tf is None:
            raise LexgraphError("BM25: the index is empty; call fit() or BM25.load() first")

    # ------------------------------------------------------------------ searching

    def _query_matrix(self, tokenised_queries: Sequence[Sequence[str]]) -> sp.csr_matrix:
        """``(n_queries, n_terms)`` float32 counts of the in-vocabulary query tokens, in
        canonical CSR form (each row's terms ascending, repeated terms summed)."""
        n = len(tokenised_queries)
        get = self.vocab.get
        lengths = np.fromiter((len(toks) for toks in tokenised_queries), dtype=np.int64, count=n)
        terms = np.fromiter(
            (get(t, -1) for toks in tokenised_queries for t in toks), dtype=np.int64, count=int(lengths.sum())
        )
        rows = np.repeat(np.arange(n, dtype=np.int64), lengths)
        keep = terms >= 0
        keep[keep] = ~self._zero_idf[terms[keep]]  # terms whose weights are all 0 add nothing: left out
        width = max(self.n_terms, 1)
        keys, counts = np.unique(rows[keep] * width + terms[keep], return_counts=True)  # sorted (row, term)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(keys // width, minlength=n), out=indptr[1:])
        return sp.csr_matrix((counts.astype(np.float32), keys % width, indptr), shape=(n, self.n_terms))

    def _score_sparse(self, q: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Scores of the matched documents of each query, as CSR arrays ``(indptr, cols, scores)``.

        Row ``i`` lists, in no particular order, the documents sharing at least one term
        with query ``i``; every other document scores 0. This is ``q @ weights``; with
        scipy's compiled kernel at hand the output is sized by an upper bound on its
        number of entries (the summed posting lengths) instead of a counting pass.
        """
        w = self._weights
        n = q.shape[0]
        if _csr_matmat is not None:
            bound = int(self.doc_freq[q.indices].sum())
            idx_dtype = np.int32 if max(bound, w.indptr[-1]) < np.iinfo(np.int32).max else np.int64
            args = [np.asarray(a, dtype=idx_dtype) for a in (q.indptr, q.indices, w.indptr, w.indices)]
            indptr = np.empty(n + 1, dtype=idx_dtype)
            cols = np.empty(bound, dtype=idx_dtype)
            vals = np.empty(bound, dtype=np.float32)
            _csr_matmat(
                n,
                self.n_docs,
                args[0],
                args[1],
                q.data.astype(np.float32, copy=False),
                args[2],
                args[3],
                w.data,
                indptr,
                cols,
                vals,
            )
            nnz = int(indptr[-1])
            return indptr, cols[:nnz], vals[:nnz]
        s = (q @ w).tocsr()
        return s.indptr, s.indices, np.asarray(s.data, dtype=np.float32)

    def score_tokens(self, tokenised_queries: Sequence[Sequence[str]]) -> np.ndarray:
        """Dense float32 scores ``(n_queries, n_docs)``; column ``j`` is article ``doc_ids[j]``."""
        self._require_fitted()
        indptr, cols, vals = self._score_sparse(self._query_matrix(tokenised_queries))
        out = np.zeros((len(tokenised_queries), self.n_docs), dtype=np.float32)
        rows = np.repeat(np.arange(len(tokenised_queries)), np.diff(indptr))
        out[rows, cols] = vals
        return out

    def search_tokens(
        self,
        tokenised_queries: Sequence[Sequence[str]],
        k: int,
        *,
        batch_size: int | None = None,
        progress: bool | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` articles for each tokenised query: ``(ids int64 (n, k), scores float32 (n, k))``.

        Best first; ties broken by the lower article id (documents matching no query
        term score 0 and are ranked by id too). ``k`` larger than the corpus is reduced
        to the corpus size. Queries go ``batch_size`` at a time (default 4,096 with the
        numba kernel, which needs no per-batch product, 256 on the scipy path, whose product
        grows with the batch). ``progress=None`` shows a bar for more than 2,000 queries.
        """
        self._require_fitted()
        if int(k) != k or k < 1:
            raise LexgraphError(f"BM25.search: k = {k!r}, expected a positive integer")
        k = min(int(k), self.n_docs)
        n = len(tokenised_queries)
        cols = np.empty((n, k), dtype=np.int64)
        scores = np.empty((n, k), dtype=np.float32)
        if progress is None:
            progress = n > 2000
        kernel = self._kernel()
        if batch_size is None:
            batch_size = 256 if kernel is None else 4096
        w = self._weights
        with progress_bar(n, "bm25 search", unit="q", disable=not progress) as bar:
            for start in range(0, n, batch_size):
                stop = min(n, start + batch_size)
                q = self._query_matrix(tokenised_queries[start:stop])
                if kernel is not None:
                    kernel(
                        q.indptr.astype(np.int64),
                        q.indices.astype(np.int64),
                        q.data,
                        w.indptr,
                        w.indices,
                        w.data,
                        self.n_docs,
                        k,
                        cols[start:stop],
                        scores[start:stop],
                        kernel_scan(),
                    )
                else:
                    indptr, top, vals = self._score_sparse(q)
                    cols[start:stop], scores[start:stop] = sparse_topk(indptr, top, vals, self.n_docs, k)
                bar.update(stop - start)
        return self.doc_ids[cols], scores

    def _kernel(self):
        """The numba search kernel when numba imports, :attr:`use_numba` is set and every
        weight left in the product is > 0 (its precondition; not so with a negative
        ``idf_floor`` or ``None``); ``None``: the scipy path."""
        if not (self.use_numba and self._positive):
            return None
        from lexgraph.search.bm25_numba import search_batch

        return search_batch

    def search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Analyse ``questions`` with the index's analyzer and return the top-``k`` (see :meth:`search_tokens`).

        A question that no article matches (none of its terms is in the index or, with a floor
        of 0, only terms whose idf is 0, so every article scores 0) gets no results: its row is
        padding, ids ``-1`` and scores 0, rather than the first articles by id
        (:meth:`no_match_reason` says which).
        """
        ids, scores = self.search_tokens(self.analyzer.analyze_many(list(questions), desc="analyze questions"), k)
        unmatched = ~np.any(scores != 0, axis=1)  # (n,) every score 0: nothing matched
        ids[unmatched] = -1
        return ids, scores

    def no_match_reason(self, question: str) -> str | None:
        """Why ``question`` gets no results from :meth:`search` when its terms are in the index (None
        when none is: :data:`lexgraph.text.display.NO_MATCH` says so): every one has idf 0, being in
        at least half of the articles (``df >= N/2``, where Robertson's
        ``ln((N - df + 0.5) / (df + 0.5)) <= 0``) under an ``idf_floor`` of 0 (or ``None`` at exactly
        half). The default ``"lucene-min"`` never gives 0. The phrase names no term of the question."""
        known = [t for t in dict.fromkeys(self.analyzer(question)) if t in self.vocab]
        if not known or not all(self._zero_idf[self.vocab[t]] for t in known):
            return None
        return (
            f"the question's terms that the articles hold are each in at least half of the {self.n_docs} "
            f"articles, so their idf is 0 under this index's idf_floor {self.idf_floor!r} (the default "
            f"{DEFAULT_IDF_FLOOR!r} keeps every idf positive)"
        )

    # ------------------------------------------------------------------ persistence

    def save(self, directory: str | Path) -> None:
        """Write the index to ``directory`` (replaced atomically): ``index.npz``, ``bm25.json``, ``vocab.json``.

        No pickle; equal indexes give byte-identical files.
        """
        from lexgraph.core.io import atomic_path, write_json

        self._require_fitted()
        arrays = {
            "doc_ids": self.doc_ids.astype(np.int64),
            "doc_len": self.doc_len.astype(np.int64),
            "tf_indptr": self._tf.indptr.astype(np.int64),
            "tf_indices": self._tf.indices.astype(np.int32),
            "tf_data": self._tf.data.astype(np.int32),
        }
        meta = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            **self.settings(),
            "n_docs": self.n_docs,
            "n_terms": self.n_terms,
        }
        with atomic_path(directory, directory=True) as tmp:
            _write_npz(tmp / ARRAYS, arrays)
            write_json(meta, tmp / META, sort_keys=True, ensure_ascii=True)
            write_json(self.terms, tmp / VOCAB, indent=None)  # one line, characters as they are
        log.info("saved BM25 index (%d documents, %d terms) to %s", self.n_docs, self.n_terms, directory)

    @classmethod
    def load(cls, directory: str | Path) -> BM25:
        """Load an index written by :meth:`save`; a missing, truncated or inconsistent file
        raises a :class:`LexgraphError` naming it."""
        directory = Path(directory)
        settings, terms, arrays = read_index(directory, SETTINGS)
        try:  # k1 and b in the domain bm25.k1 / bm25.b have in params.yaml; idf and its floor as the constructor's
            self = cls(**settings)
        except LexgraphError as exc:
            raise LexgraphError(f"{directory / META}: {str(exc).removeprefix('BM25 ')}; {RESTORE}") from None
        except (TypeError, ValueError) as exc:
            raise LexgraphError(f"{directory}: inconsistent BM25 index ({exc}); {RESTORE}") from None
        self.doc_ids, self.terms = arrays["doc_ids"], terms
        self.vocab = {t: i for i, t in enumerate(terms)}
        self._set_tf(arrays["tf"], arrays["doc_len"])
        self.source = str(directory)
        return self


def _idf_settings(idf, idf_floor) -> tuple[str, float | str | None]:
    """``(idf, idf_floor)`` checked (:func:`lexgraph.search.bm25_kernels.idf_problem`), a numeric
    floor as a float; a bad one is one line naming the key."""
    problem = idf_problem(idf, idf_floor)
    if problem:
        raise LexgraphError(f"BM25 {problem}")
    return idf, idf_floor if idf_floor is None or isinstance(idf_floor, str) else float(idf_floor)


def load_system(workspace: Path, device: str = "cpu", *, corpus: Path | None = None) -> BM25:
    """The ``bm25`` system's loader (its declaration: :mod:`lexgraph.methods.bm25.system`; ``device`` is unused);
    ``corpus``: an index of another corpus (``lexgraph index``) whose ``models/bm25`` is searched."""
    directory = layout.BM25.under(corpus or workspace)
    if not directory.is_dir():
        fix = "run `lexgraph index` again" if corpus else "run `dvc repro bm25` first"
        raise LexgraphError(f"{directory}: no BM25 index; {fix}")
    bm25 = BM25.load(directory)
    bm25.name = "bm25"
    return bm25
