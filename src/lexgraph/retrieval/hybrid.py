"""The ``hybrid`` system: BM25 fused with a dense system, the fusion chosen on dev.

For every question, BM25 and the dense system each retrieve their top-``depth``
articles (``hybrid.depth``, e.g. 1000); the two lists are fused with
:func:`ranx.fuse` (Bassani, ECIR 2022) by one of two families of methods:

* **RRF**, reciprocal rank fusion (Cormack, Clarke & Büttcher, "Reciprocal rank fusion
  outperforms Condorcet and individual rank learning methods", SIGIR 2009)::

      rrf(d) = sum_{s in {bm25, dense}, d in top(s)} 1 / (k + rank_s(d))

  with 1-based ranks; scores are ignored. The paper uses ``k = 60``; ``hybrid.rrf_k``
  is the grid of ``k`` tried on dev. ranx reads the ranks from the order of each
  run, which it re-sorts by score with an unstable sort; the runs handed to it for RRF
  therefore carry ``depth + 1 - rank`` instead of the systems' scores, so the ranks
  ranx uses are exactly the systems' own (ties broken by the lower article id, as every
  lexgraph system does).
* **Weighted score sum** (ranx ``wsum``, CombSUM with weights; Fox & Shaw, TREC 1993)
  after per-question normalisation of each list (``hybrid.norms``)::

      wsum(d) = w * norm(bm25)(d) + (1 - w) * norm(dense)(d)

  ``min-max``: ``(s - min) / (max - min)`` over the list's scores (``max - min``
  floored at 1e-9); ``zmuv``: ``(s - mean) / std`` (population std, floored at
  1e-9). ``w`` (BM25's weight) runs over ``hybrid.weights``. An article absent from one
  list gets 0 from it (ranx's convention): for min-max that is the list's own minimum,
  for z-scores its mean, so an article only the other system found counts as an
  average one of this list.

Padding is never fused: BM25 rows of ``-1`` (no question term in the corpus) and,
within a row, BM25 entries scoring exactly 0 (articles that match no question term and
fill the top-``depth`` in article-id order) are left out, as are ``-1`` entries of the
dense list (blank questions). The fused list (at most ``2 * depth`` articles) is
sorted by fused score, ties by the lower article id, and cut or padded (``-1``) to the
``k`` asked for, so a question's top ranks do not depend on ``k``.

:func:`ranx.fuse` defines the fused scores; :func:`fuse` computes them with numpy, with
ranx's floating-point operations in ranx's order (the sum over the two systems starts
at 0 and an article absent from a list adds ``w * 0``; the z-score mean and variance
add a list's scores left to right, largest first, as numba's ``np.mean``/``np.var`` do
on a sorted ranx run), so the articles and their float64 scores are ranx's to the last
bit: :func:`fuse_ranx` calls ranx itself and the tests check that both agree exactly.
The numpy path spares each run ranx's numba typed dictionaries (compiled at first use
in every process, then read key by key), seconds of the ``hybrid`` and ``evaluate``
stages.

Choosing the fusion (:func:`tune`, the ``hybrid`` stage): every candidate of the grid
(RRF for each ``k``; ``wsum`` for each normalisation and weight) fuses the same
top-``depth`` lists of the questions of ``hybrid.split`` (never ``test``), the fused
list is scored with :func:`lexgraph.metrics.evaluate_run` at depth
:data:`DEEPEST` (500, what ``evaluate.k`` reads), and the best
``hybrid.metric`` wins; ties go to the first candidate in grid order (RRF by
increasing ``k``, then min-max, then z-scores, by increasing ``w``). The dense system
is ``hybrid.dense``, or with ``best`` the dense system with the best ``hybrid.metric``
on that split (ties: the order of :data:`DENSE_SYSTEMS`). The grid is searched here,
not with ``ranx.optimize_fusion``: that one takes ``k`` and weights only as
``range``-like steps, keeps the *last* of tied candidates, scores with ranx's own
metrics on ranx's tie order, and drops weight pairs whose float sum is not exactly 1.

The stage writes ``models/hybrid/hybrid.json`` (the choice and the whole grid with its
dev scores; no timestamps, sorted keys); :func:`load_hybrid` reads it back and builds
:class:`HybridRetriever` from the workspace's ``bm25`` and dense systems.
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from lexgraph import layout
from lexgraph.config import bad_value, expectation, params_error, refuse_held_out, section_config
from lexgraph.data.schema import SPLITS, split_questions
from lexgraph.display import ranked_entries
from lexgraph.errors import DataError, LexgraphError
from lexgraph.metrics import DEEPEST, METRICS, evaluate_run

log = logging.getLogger(__name__)

SECTION = "hybrid"
SPARSE = "bm25"
#: The dense systems ``hybrid.dense`` may name (``best``: the best of them on dev).
DENSE_SYSTEMS: tuple[str, ...] = ("zeroshot", "dsr", "hprior", "gdsr", "qabisar", "hgraph", "hgraph_qa")
NORMS: tuple[str, ...] = ("min-max", "zmuv")
#: Depth at which a fused dev run is scored: the deepest rank a metric reads (recall@500).

SETTINGS = "hybrid.json"
FORMAT = "lexgraph-hybrid"
FORMAT_VERSION = 1
_PLACEHOLDER = "-1"  # stands in for an empty list: ranx needs every query in every run


# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HybridConfig:
    """The ``hybrid`` section of params.yaml."""

    split: str = field(default="dev", metadata={"expected": "dev (or train)"})
    metric: str = field(default="recall@100", metadata={"expected": f"one of {', '.join(METRICS)}"})
    dense: str = field(default="best", metadata={"expected": f"one of {', '.join(DENSE_SYSTEMS)} or best"})
    depth: int = field(default=1000, metadata={"expected": f"an integer >= {DEEPEST} (articles fused per system)"})
    rrf_k: list[int] = field(default_factory=lambda: [10, 20, 30, 60, 100],
                             metadata={"expected": "a list of distinct integers >= 0"})
    norms: list[str] = field(default_factory=lambda: list(NORMS),
                             metadata={"expected": f"a list of distinct normalisations among {', '.join(NORMS)}"})
    weights: list[float] = field(default_factory=lambda: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
                                 metadata={"expected": "a list of distinct numbers in [0, 1] (BM25's weight)"})

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> "HybridConfig":
        return section_config(cls, params, SECTION)

    def validate(self) -> None:
        def bad(key: str) -> Exception:
            return bad_value(SECTION, key, getattr(self, key), expectation(HybridConfig, key))

        refuse_held_out(SECTION, "split", self.split, expectation(HybridConfig, "split"))
        if self.split not in SPLITS:
            raise bad("split")
        if self.metric not in METRICS:
            raise bad("metric")
        if self.dense not in (*DENSE_SYSTEMS, "best"):
            raise bad("dense")
        if self.depth < DEEPEST:
            raise bad("depth")
        if any(k < 0 for k in self.rrf_k) or len(set(self.rrf_k)) < len(self.rrf_k):
            raise bad("rrf_k")
        if any(n not in NORMS for n in self.norms) or len(set(self.norms)) < len(self.norms):
            raise bad("norms")
        if any(not 0.0 <= w <= 1.0 for w in self.weights) or len(set(self.weights)) < len(self.weights):
            raise bad("weights")
        if not self.rrf_k and not (self.norms and self.weights):
            raise params_error(f"'{SECTION}.rrf_k' = {self.rrf_k!r} and '{SECTION}.norms' = {self.norms!r}, "
                f"'{SECTION}.weights' = {self.weights!r} leave no fusion to try; expected a non-empty "
                f"'{SECTION}.rrf_k', or non-empty '{SECTION}.norms' and '{SECTION}.weights'"
            )


# ---------------------------------------------------------------------------
# One fusion
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Fusion:
    """One fusion method: ``rrf`` with ``k``, or ``wsum`` with ``norm`` and BM25's ``weight``."""

    method: str  # rrf | wsum
    k: int | None = None  # rrf
    norm: str | None = None  # wsum: min-max | zmuv
    weight: float | None = None  # wsum: BM25's weight w; the dense system gets 1 - w

    def __post_init__(self) -> None:
        if self.method == "rrf":
            ok = isinstance(self.k, int) and not isinstance(self.k, bool) and self.k >= 0 and self.norm is None \
                and self.weight is None
        elif self.method == "wsum":
            ok = self.k is None and self.norm in NORMS and isinstance(self.weight, (int, float)) \
                and not isinstance(self.weight, bool) and 0.0 <= self.weight <= 1.0
        else:
            ok = False
        if not ok:
            raise LexgraphError(
                f"fusion {self.as_dict()} is not valid; expected rrf with an integer k >= 0, or wsum with a norm "
                f"among {', '.join(NORMS)} and a weight in [0, 1]"
            )

    @property
    def label(self) -> str:
        return f"rrf k={self.k}" if self.method == "rrf" else f"wsum {self.norm} w={self.weight:g}"

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "k": self.k, "norm": self.norm, "weight": self.weight}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Fusion":
        weight = d.get("weight")
        return cls(method=d.get("method"), k=d.get("k"), norm=d.get("norm"),
                   weight=float(weight) if isinstance(weight, (int, float)) and not isinstance(weight, bool) else weight)

    def ranx_args(self) -> dict[str, Any]:
        """Keyword arguments of :func:`ranx.fuse` for this fusion (runs in the order bm25, dense)."""
        if self.method == "rrf":
            return {"norm": None, "method": "rrf", "params": {"k": self.k}}
        w = float(self.weight)
        return {"norm": self.norm, "method": "wsum", "params": {"weights": [w, round(1.0 - w, 12)]}}


def grid(config: HybridConfig) -> list[Fusion]:
    """The candidates of ``config``, in grid (and tie-breaking) order: RRF by ``k``, then
    ``wsum`` per normalisation (config order) by weight."""
    rrf = [Fusion("rrf", k=int(k)) for k in sorted(config.rrf_k)]
    wsum = [Fusion("wsum", norm=n, weight=float(w)) for n in config.norms for w in sorted(config.weights)]
    return rrf + wsum


def _rows(ids: np.ndarray, scores: np.ndarray, drop_zero: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each row's real entries ``(ids, scores)``, in rank order: padding (``-1``) removed,
    and with ``drop_zero`` the entries scoring exactly 0 (BM25: no question term matched)."""
    ids = np.asarray(ids, dtype=np.int64)  # (n, depth)
    scores = np.asarray(scores, dtype=np.float64)  # (n, depth)
    if ids.ndim != 2 or ids.shape != scores.shape:
        raise ValueError(f"ids and scores must both be (n, depth) arrays, got {ids.shape} and {scores.shape}")
    keep = ranked_entries(ids, scores, drop_zero)  # (n, depth)
    return [(ids[i][keep[i]], scores[i][keep[i]]) for i in range(ids.shape[0])]


def _ranx_run(rows: list[tuple[np.ndarray, np.ndarray]], by_rank: bool):
    """A :class:`ranx.Run` with query ``str(i)`` for row ``i``; ``by_rank`` replaces the
    scores by ``len + 1 - rank`` (strictly decreasing: ranx's sort keeps the row's order)."""
    from ranx import Run

    d: dict[str, dict[str, float]] = {}
    for i, (row_ids, row_scores) in enumerate(rows):
        if row_ids.size == 0:
            d[str(i)] = {_PLACEHOLDER: 0.0}
            continue
        values = np.arange(row_ids.size, 0, -1, dtype=np.float64) if by_rank else row_scores  # (m,)
        d[str(i)] = dict(zip(map(str, row_ids.tolist()), values.tolist()))
    return Run.from_dict(d)


def _sequential_sum(x: np.ndarray) -> np.ndarray:
    """Row sums of ``x`` ``(n, m)`` added left to right (``np.sum`` adds pairwise, numba's
    ``np.mean``/``np.var`` in ranx left to right): ``(n,)``."""
    return np.cumsum(x, axis=1)[:, -1] if x.shape[1] else np.zeros(x.shape[0])


class _Block:
    """Up to :data:`_BLOCK` questions' two lists laid out on the union of their articles:
    ``ids (n, u)`` (each row's union, ascending, ``-1`` padding), and per list ``j`` (0:
    BM25, 1: dense) ``member[j]``, ``rank[j]`` (1-based) and ``score[j]``, all ``(n, u)``."""

    def __init__(self, rows: list[tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]]) -> None:
        unions = [np.union1d(s[0], d[0]) for s, d in rows]  # each (u_i,), ascending
        n, u = len(rows), max([x.size for x in unions], default=0)
        self.ids = np.full((n, u), -1, dtype=np.int64)  # (n, u)
        self.valid = np.zeros((n, u), dtype=bool)  # (n, u)
        self.member = np.zeros((2, n, u), dtype=bool)  # (2, n, u)
        self.rank = np.zeros((2, n, u), dtype=np.float64)  # (2, n, u)
        self.score = np.zeros((2, n, u), dtype=np.float64)  # (2, n, u)
        self.length = np.zeros((2, n), dtype=np.int64)  # (2, n): entries of each list
        for i, (union, lists) in enumerate(zip(unions, rows)):
            self.ids[i, : union.size] = union
            self.valid[i, : union.size] = True
            for j, (row_ids, row_scores) in enumerate(lists):
                if np.unique(row_ids).size != row_ids.size:
                    raise ValueError(f"row {i} of the {('sparse', 'dense')[j]} ranking holds an article twice")
                pos = np.searchsorted(union, row_ids)  # (m,)
                self.member[j, i, pos] = True
                self.rank[j, i, pos] = np.arange(1, row_ids.size + 1)
                self.score[j, i, pos] = row_scores
                self.length[j, i] = row_ids.size
        self._norms: dict[str, np.ndarray] = {}

    def normalised(self, norm: str) -> np.ndarray:
        """``(2, n, u)``: each list's scores normalised per question as ranx does it (0 where
        absent): min-max ``(s - min) / max(max - min, 1e-9)``; zmuv ``(s - mean) / max(std, 1e-9)``
        with the mean and the population variance summed left to right over the list's
        scores in descending order (the order of a sorted ranx run)."""
        if norm in self._norms:
            return self._norms[norm]
        out = np.zeros_like(self.score)  # (2, n, u)
        n, u = self.ids.shape
        for j in range(2):
            member, score, m = self.member[j], self.score[j], self.length[j]  # (n, u), (n, u), (n,)
            has = m > 0  # (n,)
            if norm == "min-max":
                low = np.where(has, np.where(member, score, np.inf).min(axis=1, initial=np.inf), 0.0)  # (n,)
                high = np.where(has, np.where(member, score, -np.inf).max(axis=1, initial=-np.inf), 0.0)  # (n,)
                centre, scale = low, np.maximum(high - low, 1e-9)
            elif norm == "zmuv":
                head = np.arange(u) < m[:, None]  # (n, u): the first m_i slots of row i
                desc = np.where(head, np.sort(np.where(member, score, -np.inf), axis=1)[:, ::-1], 0.0)  # (n, u)
                count = np.maximum(m, 1).astype(np.float64)  # (n,)
                centre = _sequential_sum(desc) / count  # (n,)
                dev = np.where(head, desc - centre[:, None], 0.0)  # (n, u)
                # numba's np.std is var ** 0.5, which LLVM lowers to sqrt (correctly rounded)
                scale = np.maximum(np.sqrt(_sequential_sum(dev * dev) / count), 1e-9)  # (n,)
            else:  # pragma: no cover - Fusion validates the norm
                raise ValueError(f"unknown normalisation {norm!r}")
            out[j] = np.where(member, (score - centre[:, None]) / scale[:, None], 0.0)
        self._norms[norm] = out
        return out

    def fused(self, fusion: Fusion) -> tuple[np.ndarray, np.ndarray]:
        """The fused lists ``(ids int64 (n, u), scores float64 (n, u))``, best first, ties by
        the lower id, ``-1`` / 0 padding; every score computed with ranx's operations in
        ranx's order: ``(0 + w_bm25 * x_bm25) + w_dense * x_dense``."""
        if fusion.method == "rrf":
            parts = np.where(self.member, 1.0 / (fusion.k + np.where(self.member, self.rank, 1.0)), 0.0)  # (2, n, u)
            weighted = (parts[0], parts[1])
        else:
            w = fusion.ranx_args()["params"]["weights"]
            parts = self.normalised(fusion.norm)  # (2, n, u)
            weighted = (w[0] * parts[0], w[1] * parts[1])
        scores = (0.0 + weighted[0]) + weighted[1]  # (n, u)
        order = np.lexsort((self.ids, -scores, ~self.valid), axis=-1)  # (n, u): valid first, score desc, id asc
        valid = np.take_along_axis(self.valid, order, axis=1)
        ids = np.where(valid, np.take_along_axis(self.ids, order, axis=1), -1)
        return ids, np.where(valid, np.take_along_axis(scores, order, axis=1), 0.0)


_BLOCK = 512  # questions laid out together (memory: about 100 kB per question at depth 1000)


class _Prepared:
    """Two lists of rankings, prepared once and fused with many methods."""

    def __init__(self, sparse: tuple[np.ndarray, np.ndarray], dense: tuple[np.ndarray, np.ndarray]) -> None:
        s_rows = _rows(*sparse, drop_zero=True)
        d_rows = _rows(*dense, drop_zero=False)
        if len(s_rows) != len(d_rows):
            raise ValueError(f"the two systems ranked {len(s_rows)} and {len(d_rows)} questions")
        self.n = len(s_rows)
        self.empty = [s[0].size == 0 and d[0].size == 0 for s, d in zip(s_rows, d_rows)]  # (n,)
        self.width = max([s[0].size + d[0].size for s, d in zip(s_rows, d_rows)], default=0)
        self._rows = (s_rows, d_rows)
        self._runs: dict[bool, tuple] = {}
        pairs = list(zip(s_rows, d_rows))
        self._blocks = [_Block(pairs[start : start + _BLOCK]) for start in range(0, self.n, _BLOCK)]

    def fuse(self, fusion: Fusion, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:func:`fuse` of the prepared lists."""
        k = self.width if k is None else int(k)
        ids = np.full((self.n, k), -1, dtype=np.int64)  # (n, k)
        scores = np.zeros((self.n, k), dtype=np.float32)  # (n, k)
        if self.n == 0 or k == 0:
            return ids, scores
        start = 0
        for block in self._blocks:
            block_ids, block_scores = block.fused(fusion)  # (b, u) each
            b, width = block_ids.shape[0], min(k, block_ids.shape[1])
            ids[start : start + b, :width] = block_ids[:, :width]
            scores[start : start + b, :width] = block_scores[:, :width]  # float64 -> float32
            start += b
        return ids, scores

    def fused_rows(self, fusion: Fusion) -> list[dict[int, float]]:
        """Each question's whole fused list as ``{article id: float64 score}``."""
        out = []
        for block in self._blocks:
            ids, scores = block.fused(fusion)
            out += [dict(zip(r_ids[r_ids >= 0].tolist(), r_s[r_ids >= 0].tolist())) for r_ids, r_s in zip(ids, scores)]
        return out

    # -- the reference: ranx.fuse itself ------------------------------------
    def runs(self, by_rank: bool):
        if by_rank not in self._runs:
            self._runs[by_rank] = tuple(_ranx_run(rows, by_rank) for rows in self._rows)
        return self._runs[by_rank]

    def fused_rows_ranx(self, fusion: Fusion) -> list[dict[int, float]]:
        """:meth:`fused_rows` computed by :func:`ranx.fuse`."""
        import ranx

        if self.n == 0:
            return []
        with warnings.catch_warnings():  # numba: "unsafe cast from uint64 to int64" inside ranx's RRF
            warnings.simplefilter("ignore")
            fused = ranx.fuse(list(self.runs(by_rank=fusion.method == "rrf")), **fusion.ranx_args()).to_dict()
        return [{} if self.empty[i] else {int(d): float(s) for d, s in fused[str(i)].items() if d != _PLACEHOLDER}
                for i in range(self.n)]

    def fuse_ranx(self, fusion: Fusion, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`fuse` computed by :func:`ranx.fuse`."""
        k = self.width if k is None else int(k)
        ids = np.full((self.n, k), -1, dtype=np.int64)  # (n, k)
        scores = np.zeros((self.n, k), dtype=np.float32)  # (n, k)
        if self.n == 0 or k == 0:
            return ids, scores
        for i, row in enumerate(self.fused_rows_ranx(fusion)):
            doc_ids = np.fromiter(row.keys(), dtype=np.int64, count=len(row))  # (m,)
            doc_scores = np.fromiter(row.values(), dtype=np.float64, count=len(row))  # (m,)
            order = np.lexsort((doc_ids, -doc_scores))[:k]  # fused score descending, then lower id
            ids[i, : order.size] = doc_ids[order]
            scores[i, : order.size] = doc_scores[order]
        return ids, scores


def fuse(
    sparse: tuple[np.ndarray, np.ndarray],
    dense: tuple[np.ndarray, np.ndarray],
    fusion: Fusion,
    k: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Fuse two systems' rankings of the same questions with ``fusion`` (see the module docstring).

    The scores are :func:`ranx.fuse`'s to the last bit, computed with numpy
    (:func:`fuse_ranx` calls ranx itself; the tests check that both agree exactly).

    Args:
        sparse: BM25's ``(ids int64 (n, depth), scores (n, depth))``, best first, ``-1`` padding.
        dense: the dense system's ``(ids (n, depth'), scores (n, depth'))``.
        fusion: the method and its parameter.
        k: fused articles kept per question (default: the longest fused list).
    Returns:
        ``ids`` int64 ``(n, k)`` and ``scores`` float32 ``(n, k)``, best first, ties by the
        lower article id, ``-1`` / 0 padding past a question's fused list.
    """
    return _Prepared(sparse, dense).fuse(fusion, k)


def fuse_ranx(
    sparse: tuple[np.ndarray, np.ndarray],
    dense: tuple[np.ndarray, np.ndarray],
    fusion: Fusion,
    k: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fuse` through :func:`ranx.fuse` itself: the reference :func:`fuse` is tested
    against (slower: numba typed dictionaries compiled at first use, then read key by key)."""
    return _Prepared(sparse, dense).fuse_ranx(fusion, k)


# ---------------------------------------------------------------------------
# The retriever
# ---------------------------------------------------------------------------


class HybridRetriever:
    """BM25 and a dense system, each searched to ``depth``, fused with ``fusion``.

    Args:
        sparse: the BM25 retriever.
        dense: the dense retriever (any :class:`lexgraph.retrieval.Retriever`).
        fusion: the fusion method (chosen on dev by the ``hybrid`` stage).
        depth: articles each system contributes per question.
        name: system name.
        source: where the fusion settings come from (named in errors).
    """

    def __init__(self, sparse, dense, fusion: Fusion, depth: int, name: str = "hybrid", source: str | Path = "") -> None:
        a, b = np.asarray(sparse.article_ids, dtype=np.int64), np.asarray(dense.article_ids, dtype=np.int64)
        if a.shape != b.shape or not np.array_equal(np.sort(a), np.sort(b)):
            raise LexgraphError(
                f"{name}: {sparse.name} ranks {a.size} articles and {dense.name} {b.size} other ones; expected both "
                "built on the same corpus (run `dvc repro`)"
            )
        if isinstance(depth, bool) or int(depth) != depth or depth < 1:
            raise LexgraphError(f"{name}: depth = {depth!r}, expected a positive integer")
        self.sparse, self.dense, self.fusion, self.depth = sparse, dense, fusion, int(depth)
        self.name = name
        self.source = str(source)
        self.article_ids = np.sort(a)  # (na,)

    def search(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` fused articles: ids int64 / scores float32, both ``(n, k)`` (``k`` clipped
        to the corpus size; ``-1`` padding past the fused list of at most ``2 * depth``)."""
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise LexgraphError(f"{self.name}.search: k = {k!r}, expected a positive integer")
        k = min(int(k), self.article_ids.size)
        questions = list(questions)
        sparse = self.sparse.search(questions, self.depth)  # (n, depth) each
        dense = self.dense.search(questions, self.depth)
        return fuse(sparse, dense, self.fusion, k)


def read_settings(path: str | Path) -> dict[str, Any]:
    """The stage's ``hybrid.json``, checked (format, systems, fusion, depth)."""
    path = Path(path)
    restore = "rerun `dvc repro hybrid` (or `dvc checkout`) to restore it"
    if not path.is_file():
        raise LexgraphError(f"{path}: the hybrid fusion settings not found; run `dvc repro hybrid` first")
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(path, f"truncated or corrupt hybrid settings ({exc}); {restore}") from None
    if not isinstance(settings, dict) or settings.get("format") != FORMAT or settings.get("version") != FORMAT_VERSION:
        raise DataError(path, f"not a hybrid settings file (expected format {FORMAT!r} v{FORMAT_VERSION}); {restore}")
    try:
        Fusion.from_dict(settings["fusion"])
        if settings["dense"] not in DENSE_SYSTEMS or settings["sparse"] != SPARSE:
            raise ValueError(f"systems {settings['sparse']!r} + {settings['dense']!r}")
        depth = settings["depth"]
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth {depth!r}")
    except (KeyError, TypeError, ValueError, AttributeError, LexgraphError) as exc:
        raise DataError(path, f"inconsistent hybrid settings ({exc}); {restore}") from None
    return settings


def load_hybrid(workspace: Path, device: str = "auto", index=None, *, load: Callable[..., Any]) -> HybridRetriever:
    """The ``hybrid`` system: BM25 + the dense system of ``models/hybrid/hybrid.json``, fused as chosen there;
    ``load`` loads a component by name (the registry's ``load_retriever``, which passes itself)."""
    workspace = Path(workspace)
    path = layout.HYBRID.under(workspace, SETTINGS)
    settings = read_settings(path)
    sparse = load(settings["sparse"], workspace, device)
    dense = load(settings["dense"], workspace, device, index=index)
    return HybridRetriever(sparse, dense, Fusion.from_dict(settings["fusion"]), settings["depth"], source=path)


# ---------------------------------------------------------------------------
# Choosing the fusion on dev
# ---------------------------------------------------------------------------


def dense_systems_needed(config: HybridConfig) -> tuple[str, ...]:
    """The dense systems the stage must load: ``hybrid.dense``, or all of them for ``best``."""
    return DENSE_SYSTEMS if config.dense == "best" else (config.dense,)


def _round(metrics: Mapping[str, float]) -> dict[str, float]:
    return {m: round(float(v), 4) for m, v in metrics.items()}


def _score(ids: np.ndarray, qids: Sequence[int], qrels: Mapping[int, Sequence[int]]) -> dict[str, float]:
    """All metrics of a run cut at :data:`DEEPEST` (padding dropped)."""
    run = {q: [d for d in row[:DEEPEST].tolist() if d >= 0] for q, row in zip(qids, ids)}
    return evaluate_run(run, qrels)


def tune(questions, sparse, dense: Mapping[str, Any], config: HybridConfig) -> dict[str, Any]:
    """Choose the dense system and the fusion on ``config.split`` (never the test split).

    ``questions`` is the clean questions table; only the rows of ``config.split`` are
    read. ``sparse`` is the BM25 retriever, ``dense`` maps each name of
    :func:`dense_systems_needed` to its retriever. Returns the content of ``hybrid.json``:
    the choice (``dense``, ``fusion``, ``depth``, ``score``, ``dev`` metrics of the chosen
    fusion), the whole ``grid`` (every candidate with its metrics, in grid order) and the
    ``references`` (BM25 and each dense system alone, same split and depth).
    """
    refuse_held_out(SECTION, "split", config.split, expectation(HybridConfig, "split"))
    qids, texts, qrels = split_questions(questions, config.split)
    if not qids:
        raise params_error(f"'{SECTION}.split' = {config.split!r}, but that split has no questions")
    missing = [name for name in dense_systems_needed(config) if name not in dense]
    if missing:
        raise ValueError(f"tune needs the dense systems {', '.join(missing)}")
    log.info("hybrid: %d %s questions, each system searched to depth %d", len(qids), config.split, config.depth)
    sparse_top = sparse.search(texts, config.depth)  # (n, depth) ids and scores
    dense_tops = {name: dense[name].search(texts, config.depth) for name in dense_systems_needed(config)}
    references = {SPARSE: _round(_score(sparse_top[0], qids, qrels))}
    references |= {name: _round(_score(top[0], qids, qrels)) for name, top in dense_tops.items()}
    for name, values in references.items():
        log.info("hybrid: %s alone on %s: %s %.4f", name, config.split, config.metric, values[config.metric])

    if config.dense == "best":
        # ties: the order of DENSE_SYSTEMS (max keeps the first maximum)
        chosen = max(dense_tops, key=lambda name: references[name][config.metric])
        log.info("hybrid: best dense system on %s: %s", config.split, chosen)
    else:
        chosen = config.dense

    prepared = _Prepared(sparse_top, dense_tops[chosen])
    rows: list[dict[str, Any]] = []
    for fusion in grid(config):
        ids, _ = prepared.fuse(fusion, DEEPEST)  # (n, DEEPEST)
        metrics = _score(ids, qids, qrels)
        rows.append({**fusion.as_dict(), "label": fusion.label, "score": round(metrics[config.metric], 4),
                     config.split: _round(metrics), "_exact": metrics[config.metric]})
        log.info("hybrid: %-20s %s %.4f", fusion.label, config.metric, metrics[config.metric])
    best = max(rows, key=lambda row: row["_exact"])  # ties: the first in grid order
    for row in rows:
        del row["_exact"]
    fusion = Fusion.from_dict(best)
    log.info("hybrid: chose %s + %s, %s on %s %.4f (%s alone %.4f, %s alone %.4f)", SPARSE, chosen, fusion.label,
             config.split, best["score"], SPARSE, references[SPARSE][config.metric], chosen,
             references[chosen][config.metric])
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "sparse": SPARSE,
        "dense": chosen,
        "dense_param": config.dense,
        "fusion": fusion.as_dict(),
        "label": fusion.label,
        "depth": config.depth,
        "split": config.split,
        "metric": config.metric,
        "score": best["score"],
        "score_depth": DEEPEST,
        "n_questions": len(qids),
        config.split: best[config.split],
        "grid": rows,
        "references": references,
    }


def tune_metrics(report: Mapping[str, Any]) -> dict[str, Any]:
    """The ``metrics/hybrid_tune.json`` summary of a :func:`tune` report."""
    split, metric, dense = report["split"], report["metric"], report["dense"]
    return {
        "split": split,
        "metric": metric,
        "dense": dense,
        **{key: value for key, value in report["fusion"].items() if value is not None},  # no nulls for DVC
        "score": report["score"],
        split: report[split],
        "alone": {SPARSE: report["references"][SPARSE][metric], dense: report["references"][dense][metric]},
    }


def to_json(obj: Any) -> str:
    """Deterministic JSON text: sorted keys, two-space indent, final newline."""
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
