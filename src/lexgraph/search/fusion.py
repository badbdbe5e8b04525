"""Fusing two rankings of the same questions (BM25's and a dense system's), as
:func:`ranx.fuse` does, and the single-system choices of the ``hybrid`` system.

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
bit: the tests (``tests/test_fusion.py``) call ranx itself and check that both agree exactly.
The numpy path spares each run ranx's numba typed dictionaries (compiled at first use
in every process, then read key by key), seconds of the ``hybrid`` and ``evaluate``
stages.

Besides the fusions, a :class:`Fusion` may be one system alone (``method`` ``bm25`` or
``dense``): its own ranking, unchanged (:func:`fuse` returns that list cut to ``k``, BM25's
zero-score padding included, exactly as the system ranks on its own), so that the
``hybrid`` stage can choose a single system when dev says fusion loses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lexgraph.core.errors import LexgraphError
from lexgraph.text.display import ranked_entries

NORMS: tuple[str, ...] = ("min-max", "zmuv")
#: The single-system candidates: BM25's ranking alone, the dense system's alone.
ALONE: tuple[str, ...] = ("bm25", "dense")


@dataclass(frozen=True)
class Fusion:
    """One fusion method: ``rrf`` with ``k``, or ``wsum`` with ``norm`` and BM25's ``weight``;
    or one system alone, ``bm25`` or ``dense`` (no parameter)."""

    method: str  # rrf | wsum | bm25 | dense
    k: int | None = None  # rrf
    norm: str | None = None  # wsum: min-max | zmuv
    weight: float | None = None  # wsum: BM25's weight w; the dense system gets 1 - w

    def __post_init__(self) -> None:
        if self.method == "rrf":
            ok = (
                isinstance(self.k, int)
                and not isinstance(self.k, bool)
                and self.k >= 0
                and self.norm is None
                and self.weight is None
            )
        elif self.method == "wsum":
            ok = (
                self.k is None
                and self.norm in NORMS
                and isinstance(self.weight, (int, float))
                and not isinstance(self.weight, bool)
                and 0.0 <= self.weight <= 1.0
            )
        else:
            ok = self.method in ALONE and self.k is None and self.norm is None and self.weight is None
        if not ok:
            raise LexgraphError(
                f"fusion {self.as_dict()} is not valid; expected rrf with an integer k >= 0, wsum with a norm "
                f"among {', '.join(NORMS)} and a weight in [0, 1], or one of {', '.join(ALONE)} alone"
            )

    @property
    def alone(self) -> bool:
        """One system's own ranking, not a fusion."""
        return self.method in ALONE

    @property
    def label(self) -> str:
        if self.alone:
            return f"{self.method} alone"
        return f"rrf k={self.k}" if self.method == "rrf" else f"wsum {self.norm} w={self.weight:g}"

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "k": self.k, "norm": self.norm, "weight": self.weight}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Fusion:
        weight = d.get("weight")
        return cls(
            method=d.get("method"),
            k=d.get("k"),
            norm=d.get("norm"),
            weight=float(weight) if isinstance(weight, (int, float)) and not isinstance(weight, bool) else weight,
        )

    def ranx_args(self) -> dict[str, Any]:
        """Keyword arguments of :func:`ranx.fuse` for this fusion (runs in the order bm25, dense)."""
        if self.alone:
            raise LexgraphError(f"{self.label} is no fusion: ranx.fuse has no arguments for it")
        if self.method == "rrf":
            return {"norm": None, "method": "rrf", "params": {"k": self.k}}
        w = float(self.weight)
        return {"norm": self.norm, "method": "wsum", "params": {"weights": [w, round(1.0 - w, 12)]}}


def _rows(ids: np.ndarray, scores: np.ndarray, drop_zero: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each row's real entries ``(ids, scores)``, in rank order: padding (``-1``) removed,
    and with ``drop_zero`` the entries scoring exactly 0 (BM25: no question term matched)."""
    ids = np.asarray(ids, dtype=np.int64)  # (n, depth)
    scores = np.asarray(scores, dtype=np.float64)  # (n, depth)
    if ids.ndim != 2 or ids.shape != scores.shape:
        raise ValueError(f"ids and scores must both be (n, depth) arrays, got {ids.shape} and {scores.shape}")
    keep = ranked_entries(ids, scores, drop_zero)  # (n, depth)
    return [(ids[i][keep[i]], scores[i][keep[i]]) for i in range(ids.shape[0])]


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


class Prepared:
    """Two lists of rankings, prepared once and fused with many methods."""

    def __init__(self, sparse: tuple[np.ndarray, np.ndarray], dense: tuple[np.ndarray, np.ndarray]) -> None:
        s_rows = _rows(*sparse, drop_zero=True)
        d_rows = _rows(*dense, drop_zero=False)
        if len(s_rows) != len(d_rows):
            raise ValueError(f"the two systems ranked {len(s_rows)} and {len(d_rows)} questions")
        self.n = len(s_rows)
        self._inputs = {"bm25": sparse, "dense": dense}  # the rankings as given: the ``alone`` choices
        self.width = max([s[0].size + d[0].size for s, d in zip(s_rows, d_rows)], default=0)
        pairs = list(zip(s_rows, d_rows))
        self._blocks = [_Block(pairs[start : start + _BLOCK]) for start in range(0, self.n, _BLOCK)]

    def fuse(self, fusion: Fusion, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:func:`fuse` of the prepared lists."""
        if fusion.alone:
            return self.alone(fusion.method, k)
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

    def alone(self, system: str, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One system's ranking as given (``bm25`` or ``dense``), cut or ``-1`` / 0 padded to ``k``
        (default: its width)."""
        given_ids, given_scores = (np.asarray(a) for a in self._inputs[system])  # (n, depth) each
        k = given_ids.shape[1] if k is None else int(k)
        ids = np.full((self.n, k), -1, dtype=np.int64)  # (n, k)
        scores = np.zeros((self.n, k), dtype=np.float32)  # (n, k)
        width = min(k, given_ids.shape[1])
        ids[:, :width] = given_ids[:, :width]
        scores[:, :width] = given_scores[:, :width]
        return ids, scores

    def fused_rows(self, fusion: Fusion) -> list[dict[int, float]]:
        """Each question's whole fused list as ``{article id: float64 score}``."""
        out = []
        for block in self._blocks:
            ids, scores = block.fused(fusion)
            out += [dict(zip(r_ids[r_ids >= 0].tolist(), r_s[r_ids >= 0].tolist())) for r_ids, r_s in zip(ids, scores)]
        return out


def fuse(
    sparse: tuple[np.ndarray, np.ndarray],
    dense: tuple[np.ndarray, np.ndarray],
    fusion: Fusion,
    k: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Fuse two systems' rankings of the same questions with ``fusion`` (see the module docstring).

    The scores are :func:`ranx.fuse`'s to the last bit, computed with numpy
    (the tests call ranx itself and check that both agree exactly).

    Args:
        sparse: BM25's ``(ids int64 (n, depth), scores (n, depth))``, best first, ``-1`` padding.
        dense: the dense system's ``(ids (n, depth'), scores (n, depth'))``.
        fusion: the method and its parameter (``bm25`` / ``dense`` alone: that ranking as given).
        k: fused articles kept per question (default: the longest fused list).
    Returns:
        ``ids`` int64 ``(n, k)`` and ``scores`` float32 ``(n, k)``, best first, ties by the
        lower article id, ``-1`` / 0 padding past a question's fused list.
    """
    return Prepared(sparse, dense).fuse(fusion, k)
