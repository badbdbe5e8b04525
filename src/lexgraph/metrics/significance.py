"""Paired significance tests between retrieval systems, on lexgraph's own metrics.

Every comparison is paired by query: both systems are scored on the same questions with
the per-query metric definitions of :mod:`lexgraph.metrics.ir` (the very numbers that
:func:`lexgraph.metrics.ir.evaluate_run` averages into the reported results), and the tests
look at the per-query differences ``d_q = system(q) - baseline(q)``.

* **p-value** -- two-sided paired Fisher randomisation test (sign-flip permutation test)
  on the mean difference, the test recommended for IR evaluation by Smucker, Allan &
  Carterette, "A comparison of statistical significance tests for information retrieval
  evaluation", CIKM 2007. Under the null hypothesis the two systems are exchangeable on
  every query, so each ``d_q`` keeps or flips its sign with probability 1/2, and
  ``p = (1 + #{resamples b : |sum_q s_bq * d_q| >= |sum_q d_q|}) / (1 + B)`` over ``B``
  random sign vectors ``s_b``: the Monte-Carlo p-value with the +1 correction (Phipson &
  Smyth, "Permutation p-values should never be zero", Stat. Appl. Genet. Mol. Biol. 2010:
  the observed sign vector is one of the resamples, so ``p >= 1 / (B + 1)``, never 0). This
  is the test of ``ranx.compare(..., stat_test="fisher")`` (Bassani, "ranx: A Blazing-Fast
  Python Library for Ranking Evaluation and Comparison", ECIR 2022), which swaps the two
  systems' scores per query with probability 1/2 and counts ``p`` the same way but without
  the +1; on tie-free scores the two agree within Monte-Carlo error (checked by the tests).
* **multiplicity** -- Holm's step-down adjustment (Holm, "A simple sequentially rejective
  multiple test procedure", Scand. J. Statist. 1979) over one family of tests: every
  distinct test of one :func:`compare_systems` call, i.e. every test whose marker can appear
  in one results table (A vs B and B vs A are one test: same p-value). The markers use the
  adjusted p-values; the raw ones are kept beside them.
* **confidence interval** -- percentile bootstrap of the mean paired difference.

Why not ranx's ``fisher_randomization_test`` itself (ranx 0.3.21), despite the project's
preference for ranx:

1. it is not reproducible: it seeds ``np.random`` in the calling thread while the
   permutations are drawn in numba ``prange`` worker threads with their own, unseeded
   random states, so one ``random_seed`` gives different p-values from call to call
   (ranx issue #70, open);
2. it compares floating-point means with ``>=`` and no tolerance, so a permutation whose mean
   difference ties the observed one is counted or not depending on rounding. Per-query
   IR scores are discrete (recall@k is a multiple of 1/R), ties are frequent, and the
   p-values come out too small: 0.19 where the ties-included value is 0.22 on a 50-query
   example, 0.937 instead of 62/64 on a 6-query one (checked by exact enumeration).

The resampling here uses a seeded numpy ``Generator`` and counts a tie when the two
absolute sums differ by less than ``1e-9 * sum_q |d_q|``, far above rounding error and
far below any genuine difference between sums of metric values.

ranx's metrics ``recall@k``, ``map`` (no cut-off: average precision over the whole list,
as trec_eval's), ``map@100`` (the top 100 only, divided by all relevant articles, as
trec_eval's ``map_cut_100``), ``r-precision``, ``mrr@10``, ``mrr@100`` and ``ndcg@10`` agree with
:mod:`lexgraph.metrics.ir` to 1e-15 on random depth-500 runs; the tests here take their
per-query scores from lexgraph all the same, so significance and reported means share
one definition by construction.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence

import numpy as np

from lexgraph.metrics.ir import METRICS, per_query, rounded

log = logging.getLogger(__name__)

__all__ = [
    "per_query_scores",
    "paired_randomization_test",
    "bootstrap_ci",
    "holm_adjust",
    "compare_systems",
    "baseline_letters",
    "significance_markers",
    "marker_legend",
]

Run = Mapping[Hashable, Sequence[int]]
Qrels = Mapping[Hashable, Collection[int]]

#: Superscript form of each lowercase letter usable as a baseline marker. There is no
#: superscript ``q`` in common fonts, so ``q`` is never used.
_SUPERSCRIPT = dict(zip("abcdefghijklmnoprstuvwxyz", "ᵃᵇᶜᵈᵉᶠᵍʰⁱʲᵏˡᵐⁿᵒᵖʳˢᵗᵘᵛʷˣʸᶻ"))

_CHUNK = 1000  # resamples drawn per block, to bound memory on large query sets
_TIE_RTOL = 1e-9  # sums closer than this times sum(|d|) are ties


# ---------------------------------------------------------------------------
# Per-query scores
# ---------------------------------------------------------------------------


def _check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    return metric


def per_query_scores(run: Run, qrels: Qrels, metric: str) -> dict[Hashable, float]:
    """Score of ``metric`` for every query of ``qrels``: ``{qid: value}``, in qrels order.

    Uses :func:`lexgraph.metrics.ir.per_query`, so the values are exactly those averaged by
    :func:`lexgraph.metrics.ir.evaluate_run`; a query absent from ``run`` scores 0.
    """
    _check_metric(metric)
    if not qrels:
        raise ValueError("qrels are empty: there is no query to score")
    return {qid: scores[metric] for qid, scores in per_query(run, qrels).items()}


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


def _paired_arrays(a, b) -> tuple[np.ndarray, np.ndarray]:
    a = np.ascontiguousarray(a, dtype=np.float64)
    b = np.ascontiguousarray(b, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"paired scores must be two 1-D arrays of equal length, got shapes {a.shape} and {b.shape}")
    if a.size == 0:
        raise ValueError("paired scores are empty: there is no query to compare")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("paired scores must be finite")
    return a, b


def _check_resampling(n_resamples: int, seed: int) -> tuple[int, int]:
    if int(n_resamples) != n_resamples or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    if int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(n_resamples), int(seed)


def paired_randomization_test(a, b, n_resamples: int = 10000, seed: int = 0) -> float:
    """Two-sided p-value of the paired Fisher randomisation test on ``mean(a - b)``.

    ``a`` and ``b`` hold the per-query scores of two systems on the same queries (same
    order). Each of ``n_resamples`` resamples flips the sign of every difference
    ``a_q - b_q`` independently with probability 1/2 (swaps the two systems on that
    query); the p-value is the fraction of resamples whose absolute mean difference is at
    least the observed one, ties included, with the +1 correction of Phipson & Smyth (2010):
    ``(hits + 1) / (n_resamples + 1)``, so never 0 (at least ``1 / (n_resamples + 1)``).
    Identical systems give exactly 1. Deterministic for a given ``seed``, and symmetric:
    swapping ``a`` and ``b`` gives the same p-value.
    """
    a, b = _paired_arrays(a, b)
    n_resamples, seed = _check_resampling(n_resamples, seed)
    diff = a - b  # (n_queries,)
    threshold = abs(diff.sum()) - _TIE_RTOL * np.abs(diff).sum()
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, n_resamples, _CHUNK):
        size = min(_CHUNK, n_resamples - start)
        signs = 1.0 - 2.0 * rng.integers(0, 2, size=(size, diff.size))  # (chunk, n_queries) of +-1
        hits += int(np.count_nonzero(np.abs(signs @ diff) >= threshold))
    return (hits + 1) / (n_resamples + 1)


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values of one family, in the order given.

    With the ``m`` p-values sorted ascending, ``p_(1) <= ... <= p_(m)``, the adjusted value
    of ``p_(i)`` is ``min(1, max_{j <= i} (m - j + 1) * p_(j))`` (Holm 1979; the
    "adjusted p-value" form of Wright, "Adjusted P-values for simultaneous inference",
    Biometrics 1992): rejecting where it is below ``alpha`` is Holm's procedure at family-wise
    level ``alpha``. Equal p-values keep their given order (a stable sort).
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"p-values must be a 1-D sequence of numbers in [0, 1], got {p_values!r}")
    order = np.argsort(p, kind="stable")
    m = p.size
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])  # (m,) in ascending order of p
    adjusted = np.empty(m, dtype=np.float64)
    adjusted[order] = np.minimum(stepped, 1.0)
    return adjusted.tolist()


def bootstrap_ci(diff, n_resamples: int = 10000, confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of ``mean(diff)``.

    Draws ``n_resamples`` resamples of the queries with replacement (numpy ``Generator``
    seeded with ``seed``, so the interval is deterministic) and returns the
    ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of their means. A
    constant difference ``c`` gives ``(c, c)``.
    """
    diff = np.ascontiguousarray(diff, dtype=np.float64)
    if diff.ndim != 1 or diff.size == 0:
        raise ValueError(f"diff must be a non-empty 1-D array, got shape {diff.shape}")
    if not np.all(np.isfinite(diff)):
        raise ValueError("diff must be finite")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")
    n_resamples, seed = _check_resampling(n_resamples, seed)
    rng = np.random.default_rng(seed)
    n = diff.size
    means = np.empty(n_resamples, dtype=np.float64)
    for start in range(0, n_resamples, _CHUNK):
        stop = min(start + _CHUNK, n_resamples)
        idx = rng.integers(0, n, size=(stop - start, n))  # (chunk, n_queries)
        means[start:stop] = diff[idx].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


# ---------------------------------------------------------------------------
# Comparing systems
# ---------------------------------------------------------------------------


def compare_systems(
    runs: Mapping[str, Run],
    qrels: Qrels,
    baselines: Sequence[str],
    metrics: Sequence[str] = ("recall@100", "map"),
    n_resamples: int = 10000,
    seed: int = 0,
    alpha: float = 0.05,
) -> dict[str, dict[str, dict[str, dict]]]:
    """Compare every system of ``runs`` with every baseline of ``baselines`` it holds.

    Returns ``{system: {"vs_<baseline>": {metric: entry}}}`` for every system of ``runs``
    (in that order) and every baseline present in ``runs`` other than the system itself;
    baselines absent from ``runs`` are skipped with a warning. Each entry holds
    ``system`` and ``baseline`` (mean scores), ``diff`` (mean paired difference,
    system minus baseline), ``p_value`` (raw, :func:`paired_randomization_test`),
    ``p_holm`` (:func:`holm_adjust` over this call's family: every distinct test, the pair
    A/B counted once whichever is the system), ``ci95`` (``[low, high]``,
    :func:`bootstrap_ci` of the difference), ``significant`` (``p_holm < alpha``,
    two-sided) and ``n_queries``. One call is one family: call it once per results table.
    Floats are rounded to 4 decimals (``significant`` is decided before rounding). All
    queries of ``qrels`` count; a query missing from a run scores 0. Every test uses the
    same ``seed``, so a raw p-value does not depend on which other systems are compared.
    """
    if not qrels:
        raise ValueError("qrels are empty: there is no query to compare on")
    metrics = [_check_metric(m) for m in metrics]
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha!r}")
    present = [b for b in dict.fromkeys(baselines) if b in runs]
    missing = [b for b in dict.fromkeys(baselines) if b not in runs]
    if missing:
        log.warning("baselines without a run are skipped: %s", ", ".join(map(str, missing)))

    qids = list(qrels)
    scores: dict[str, dict[str, np.ndarray]] = {}
    for name, run in runs.items():
        table = per_query(run, qrels)
        scores[name] = {m: np.array([table[q][m] for q in qids], dtype=np.float64) for m in metrics}

    raw: dict[tuple[frozenset, str], float] = {}  # one p-value per distinct test of the family
    out: dict[str, dict[str, dict[str, dict]]] = {}
    for system in runs:
        out[system] = {}
        for baseline in present:
            if baseline == system:
                continue
            entries = {}
            for m in metrics:
                a, b = scores[system][m], scores[baseline][m]
                diff = a - b
                key = (frozenset((system, baseline)), m)
                if key not in raw:  # symmetric: B vs A has A vs B's p-value
                    raw[key] = paired_randomization_test(a, b, n_resamples=n_resamples, seed=seed)
                low, high = bootstrap_ci(diff, n_resamples=n_resamples, confidence=0.95, seed=seed)
                entries[m] = {
                    "system": rounded(a.mean()),
                    "baseline": rounded(b.mean()),
                    "diff": rounded(diff.mean()),
                    "p_value": rounded(raw[key]),
                    "ci95": [rounded(low), rounded(high)],
                    "n_queries": len(qids),
                }
                log.debug("%s vs %s, %s: diff %.4f, p %.4f", system, baseline, m, diff.mean(), raw[key])
            out[system][f"vs_{baseline}"] = entries
    adjusted = dict(zip(raw, holm_adjust(list(raw.values()))))
    for system, versus in out.items():
        for key, entries in versus.items():
            for m, entry in entries.items():
                p_holm = adjusted[(frozenset((system, key.removeprefix("vs_"))), m)]
                entry.update(p_holm=rounded(p_holm), significant=bool(p_holm < alpha))
    log.info("%d distinct paired tests, Holm-adjusted as one family", len(raw))
    return out


def baseline_letters(baselines: Iterable[str]) -> dict[str, str]:
    """Marker letter of each baseline: ``{baseline: letter}``, in the order given.

    A baseline gets the first letter of its name; when that letter is taken (or the name
    has none), the next unused letter of its name, else the first unused letter of the
    alphabet. ``q`` is never used (it has no superscript form).
    """
    letters: dict[str, str] = {}
    used: set[str] = set()
    for name in dict.fromkeys(baselines):
        candidates = [ch for ch in str(name).lower() if ch in _SUPERSCRIPT]
        letter = next((ch for ch in candidates if ch not in used), None)
        if letter is None:
            letter = next((ch for ch in _SUPERSCRIPT if ch not in used), None)
        if letter is None:
            raise ValueError(f"too many baselines for one marker letter each: {len(letters) + 1}")
        letters[name] = letter
        used.add(letter)
    return letters


def significance_markers(
    comparisons: Mapping[str, Mapping[str, Mapping[str, Mapping]]],
    system: str,
    metric: str,
    baselines: Sequence[str],
) -> str:
    """Superscript letters of the baselines ``system`` significantly improves on, for ``metric``.

    ``comparisons`` is the output of :func:`compare_systems`. A baseline is marked when
    its entry is significant (Holm-adjusted p below alpha) and ``diff > 0`` (significantly worse results are not
    marked); the letters follow :func:`baseline_letters` and the order of ``baselines``,
    like the superscripts of a ranx report. Missing comparisons give no marker.
    """
    letters = baseline_letters(baselines)
    marks = []
    for baseline, letter in letters.items():
        entry = comparisons.get(system, {}).get(f"vs_{baseline}", {}).get(metric)
        if entry and entry["significant"] and entry["diff"] > 0:
            marks.append(_SUPERSCRIPT[letter])
    return "".join(marks)


def marker_legend(baselines: Sequence[str], alpha: float = 0.05) -> str:
    """One sentence explaining the markers of :func:`significance_markers`."""
    letters = baseline_letters(baselines)
    if not letters:
        return ""
    pairs = ", ".join(f"{_SUPERSCRIPT[letter]} {name}" for name, letter in letters.items())
    return (
        f"Superscripts mark a significant improvement over: {pairs} (two-sided paired Fisher "
        f"randomisation test, p < {alpha:g} after Holm's adjustment over all the tests of this "
        f"table; raw and adjusted p-values in metrics/significance.json)."
    )
