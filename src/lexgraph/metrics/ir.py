"""Retrieval metrics for ranked lists of article ids, with trec_eval semantics.

Conventions shared by every function:

* ``ranked`` is a sequence of article ids, best first. An id repeated in ``ranked``
  counts only at its first occurrence (later copies are dropped before ranks are
  assigned, so they do not push other articles down).
* ``relevant`` is a collection of gold article ids; duplicates count once.
  ``R = |relevant|`` must be at least 1.
* Ranks are 1-based; ``rel(i)`` is 1 when the article at rank ``i`` is relevant.

The per-query functions are plain, readable reference implementations.
:func:`evaluate_run` and :func:`per_query` compute the same numbers for a whole run
at once on a padded hit matrix (queries x ranks) with numpy.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

#: Metric names returned by :func:`evaluate_run`, in reporting order.
METRICS: tuple[str, ...] = (
    "recall@10",
    "recall@100",
    "recall@200",
    "recall@500",
    "map",
    "map@100",
    "r_precision",
    "mrr@10",
    "mrr@100",
    "ndcg@10",
)

_RECALL_CUTS = (10, 100, 200, 500)
_MAP_CUTS = (100,)  # map@100 and mrr@100: as reported by G-DSR and QABISAR on BSARD
_MRR_CUTS = (10, 100)
_NDCG_CUT = 10


# ---------------------------------------------------------------------------
# Per-query reference implementations
# ---------------------------------------------------------------------------


def _dedup(ranked: Sequence[int]) -> list[int]:
    """Return ``ranked`` with every id after its first occurrence removed."""
    seen: set[int] = set()
    out: list[int] = []
    for doc in ranked:
        doc = int(doc)
        if doc not in seen:
            seen.add(doc)
            out.append(doc)
    return out


def _gold(relevant: Collection[int]) -> set[int]:
    gold = {int(doc) for doc in relevant}
    if not gold:
        raise ValueError("the set of relevant articles is empty; metrics are undefined")
    return gold


def _check_k(k: int) -> int:
    if int(k) != k or k < 1:
        raise ValueError(f"cut-off k must be a positive integer, got {k!r}")
    return int(k)


def recall_at_k(ranked: Sequence[int], relevant: Collection[int], k: int) -> float:
    """Recall at cut-off k.

    ``recall@k = |relevant ∩ top-k(ranked)| / R``
    """
    gold, k = _gold(relevant), _check_k(k)
    return sum(doc in gold for doc in _dedup(ranked)[:k]) / len(gold)


def average_precision(ranked: Sequence[int], relevant: Collection[int], k: int | None = None) -> float:
    """Average precision over the whole ranked list (trec_eval ``map``), or over its top k.

    ``AP = (1/R) * sum_{i : rel(i)=1} P@i``, with ``P@i = (1/i) * sum_{j<=i} rel(j)``;
    relevant articles that are never retrieved contribute 0.

    With a cut-off ``k`` only ranks ``i <= k`` enter the sum, still divided by R (not by
    ``min(R, k)``): ``AP@k = (1/R) * sum_{i<=k : rel(i)=1} P@i``, trec_eval ``map_cut_k``.
    """
    gold = _gold(relevant)
    ranked = _dedup(ranked) if k is None else _dedup(ranked)[: _check_k(k)]
    hits, total = 0, 0.0
    for i, doc in enumerate(ranked, start=1):
        if doc in gold:
            hits += 1
            total += hits / i
    return total / len(gold)


def r_precision(ranked: Sequence[int], relevant: Collection[int]) -> float:
    """Precision at rank R, the number of relevant articles (trec_eval ``Rprec``).

    ``RP = |relevant ∩ top-R(ranked)| / R``; a list shorter than R still divides by R.
    """
    gold = _gold(relevant)
    return sum(doc in gold for doc in _dedup(ranked)[: len(gold)]) / len(gold)


def mrr_at_k(ranked: Sequence[int], relevant: Collection[int], k: int) -> float:
    """Reciprocal rank of the first relevant article within the top k.

    ``RR@k = 1 / min{i <= k : rel(i) = 1}``, or 0 when no relevant article is in the top k.
    """
    gold, k = _gold(relevant), _check_k(k)
    for i, doc in enumerate(_dedup(ranked)[:k], start=1):
        if doc in gold:
            return 1.0 / i
    return 0.0


def ndcg_at_k(ranked: Sequence[int], relevant: Collection[int], k: int) -> float:
    """Normalised discounted cumulative gain at k with binary gains (trec_eval ``ndcg_cut``).

    ``DCG@k = sum_{i<=k} rel(i) / log2(i + 1)``,
    ``IDCG@k = sum_{i<=min(R, k)} 1 / log2(i + 1)``, ``nDCG@k = DCG@k / IDCG@k``.
    """
    gold, k = _gold(relevant), _check_k(k)
    dcg = sum(1.0 / math.log2(i + 1) for i, doc in enumerate(_dedup(ranked)[:k], start=1) if doc in gold)
    idcg = sum(1.0 / math.log2(i + 1) for i in range(1, min(len(gold), k) + 1))
    return dcg / idcg


# ---------------------------------------------------------------------------
# Whole runs (vectorised)
# ---------------------------------------------------------------------------


def _dedup_array(ranked: Sequence[int]) -> np.ndarray:
    """``ranked`` as an int64 array, keeping only the first occurrence of each id."""
    arr = np.asarray(ranked, dtype=np.int64).reshape(-1)
    if arr.size > 1:
        _, first = np.unique(arr, return_index=True)
        if first.size < arr.size:
            arr = arr[np.sort(first)]
    return arr


def _metric_arrays(
    run: Mapping[Hashable, Sequence[int]], qrels: Mapping[Hashable, Collection[int]]
) -> tuple[list[Hashable], dict[str, np.ndarray]]:
    """Score every query of ``qrels``; return the qids and one (n_queries,) array per metric."""
    qids = list(qrels)
    n = len(qids)
    hit_rows: list[np.ndarray] = []
    n_rel = np.empty(n, dtype=np.int64)
    for row, qid in enumerate(qids):
        gold = np.unique(np.asarray(list(qrels[qid]), dtype=np.int64))
        if gold.size == 0:
            raise ValueError(f"query {qid!r} has no relevant articles in the qrels; metrics are undefined")
        n_rel[row] = gold.size
        ranked = run.get(qid)
        if ranked is None:
            hit_rows.append(np.zeros(0, dtype=bool))
        else:
            hit_rows.append(np.isin(_dedup_array(ranked), gold, assume_unique=True))
    missing = sum(qid not in run for qid in qids)
    if missing:
        log.info("%d of %d queries have no ranked list in the run; they score 0", missing, n)
    extra = sum(qid not in qrels for qid in run)
    if extra:
        log.debug("ignoring %d run queries that have no qrels", extra)

    depth = max([*_MAP_CUTS, *_MRR_CUTS, _NDCG_CUT, *_RECALL_CUTS, *(h.size for h in hit_rows)])
    hits = np.zeros((n, depth), dtype=bool)  # (n_queries, depth)
    for row, h in enumerate(hit_rows):
        hits[row, : h.size] = h
    ranks = np.arange(1, depth + 1, dtype=np.float64)  # (depth,)
    cum = np.cumsum(hits, axis=1, dtype=np.float64)  # (n_queries, depth): relevant in top-i
    r = n_rel.astype(np.float64)  # (n_queries,)

    out: dict[str, np.ndarray] = {}
    for k in _RECALL_CUTS:
        out[f"recall@{k}"] = cum[:, k - 1] / r
    precision_at_hits = np.where(hits, cum / ranks, 0.0)  # (n_queries, depth): P@i where rel(i) = 1
    out["map"] = precision_at_hits.sum(axis=1) / r
    for k in _MAP_CUTS:  # top k only, still divided by R (trec_eval map_cut_k)
        out[f"map@{k}"] = precision_at_hits[:, :k].sum(axis=1) / r
    # relevant within the top R (R may exceed the depth: then everything retrieved counts)
    out["r_precision"] = cum[np.arange(n), np.minimum(n_rel, depth) - 1] / r
    for k in _MRR_CUTS:
        top = hits[:, :k]  # (n_queries, k)
        first = np.argmax(top, axis=1)  # index of the first hit (0 when there is none)
        out[f"mrr@{k}"] = np.where(top.any(axis=1), 1.0 / (first + 1), 0.0)
    discount = 1.0 / np.log2(ranks[:_NDCG_CUT] + 1.0)  # (k,)
    dcg = hits[:, :_NDCG_CUT] @ discount  # (n_queries,)
    ideal = np.concatenate([[0.0], np.cumsum(discount)])  # ideal[m] = IDCG with m relevant
    out[f"ndcg@{_NDCG_CUT}"] = dcg / ideal[np.minimum(n_rel, _NDCG_CUT)]
    return qids, {name: out[name] for name in METRICS}


def per_query(
    run: Mapping[Hashable, Sequence[int]], qrels: Mapping[Hashable, Collection[int]]
) -> dict[Hashable, dict[str, float]]:
    """Metrics of :data:`METRICS` for every query of ``qrels``: ``{qid: {metric: value}}``.

    A query absent from ``run`` scores 0 everywhere; run queries absent from ``qrels``
    are ignored. Raises ``ValueError`` naming the first query with no relevant article.
    """
    qids, arrays = _metric_arrays(run, qrels)
    return {qid: {name: float(arrays[name][i]) for name in METRICS} for i, qid in enumerate(qids)}


def evaluate_run(run: Mapping[Hashable, Sequence[int]], qrels: Mapping[Hashable, Collection[int]]) -> dict[str, float]:
    """Macro-average of :data:`METRICS` over all queries of ``qrels``.

    ``metric(run) = (1/|Q|) * sum_{q in Q} metric(run[q], qrels[q])`` with ``Q`` the
    queries of ``qrels``; a query absent from ``run`` scores 0. Raises ``ValueError``
    when ``qrels`` is empty or a query has no relevant article.
    """
    if not qrels:
        raise ValueError("qrels are empty: there is no query to evaluate")
    _, arrays = _metric_arrays(run, qrels)
    return {name: float(arrays[name].mean()) for name in METRICS}


#: The deepest cut-off any metric reads (recall@500): runs are ranked and scored this deep.
DEEPEST = max(int(name.split("@")[1]) for name in METRICS if "@" in name)


# ---------------------------------------------------------------------------
# Dense runs: exact top-k and the dev evaluation of a dense model
# ---------------------------------------------------------------------------


def exact_top_k(
    queries: torch.Tensor,
    articles: torch.Tensor,
    article_ids: np.ndarray,
    k: int,
    block_size: int = 256,
    normalize: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine (``normalize=False``: dot-product) top-k of each query over all articles.

    Args:
        queries: ``(nq, dim)`` query embeddings (any scale; normalised here).
        articles: ``(na, dim)`` article embeddings.
        article_ids: int64 ``(na,)`` id of each article row; must be sorted ascending
            for the tie-breaking guarantee (``DenseRetriever`` sorts them).
        k: cut-off; clipped to ``na``.
    Returns:
        ``ids`` int64 ``(nq, k')`` and ``scores`` float32 ``(nq, k')``, ``k' = min(k, na)``,
        best first, equal scores ordered by lower article id.
    """
    import torch.nn.functional as F

    k = min(int(k), articles.size(0))
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    a = F.normalize(articles.float(), dim=-1) if normalize else articles.float()  # (na, dim)
    q = queries.float().to(a.device)  # (nq, dim)
    q = F.normalize(q, dim=-1) if normalize else q
    ids_out = np.empty((q.size(0), k), dtype=np.int64)
    scores_out = np.empty((q.size(0), k), dtype=np.float32)
    for start in range(0, q.size(0), block_size):
        scores = (q[start : start + block_size] @ a.T).cpu().numpy()  # (block, na)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # (block, k)
        ids_out[start : start + block_size] = article_ids[order]
        scores_out[start : start + block_size] = np.take_along_axis(scores, order, axis=1)
    return ids_out, scores_out


def dense_run_metrics(
    queries: torch.Tensor,
    articles: torch.Tensor,
    article_ids: np.ndarray,
    qids: Sequence[Hashable],
    qrels: Mapping[Hashable, Collection[int]],
    normalize: bool = True,
) -> dict[str, float]:
    """Every metric of the exact top-:data:`DEEPEST` run of ``queries`` ``(nq, dim)`` (row ``i``
    is question ``qids[i]``) over ``articles`` ``(na, dim)``: the dev evaluation of the
    training loops and of the tuning stages."""
    ids, _ = exact_top_k(queries, articles, article_ids, DEEPEST, normalize=normalize)
    return evaluate_run({q: ids[i].tolist() for i, q in enumerate(qids)}, qrels)


# ---------------------------------------------------------------------------
# Reported values
# ---------------------------------------------------------------------------

#: decimals of the metrics the stages report (``metrics/*.json`` and the settings they save)
REPORT_DIGITS = 4


def rounded(value: float, ndigits: int = REPORT_DIGITS) -> float:
    """``round(float(value), ndigits)``: a numpy scalar becomes a Python float first, so it
    rounds (correctly, as Python does) and is written to JSON as one."""
    return round(float(value), ndigits)


def rounded_all(values: Mapping[str, float], ndigits: int = REPORT_DIGITS) -> dict[str, float]:
    """:func:`rounded` of every value of ``values`` (same keys, same order)."""
    return {key: rounded(value, ndigits) for key, value in values.items()}
