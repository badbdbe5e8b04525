"""Significance tests: randomisation p-values against exact enumeration, bootstrap CIs,
per-query scores against pytrec_eval, and the comparison table with its markers."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from lexgraph.metrics.ir import evaluate_run
from lexgraph.metrics.significance import (
    baseline_letters,
    bootstrap_ci,
    compare_systems,
    holm_adjust,
    marker_legend,
    paired_randomization_test,
    per_query_scores,
    significance_markers,
)


def exact_randomization_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value over all 2^n sign flips of the paired differences."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    observed = abs(d.mean())
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))  # (2^n, n)
    flipped = np.abs((signs * d).mean(axis=1))
    return float(np.mean(flipped >= observed - 1e-12))


CLEAR = np.array([0.31, 0.22, 0.47, 0.15, 0.38, 0.26])  # all positive: exact p = 2/64
# mean 0.015: large p; several other sign patterns tie the observed |sum| = 0.09
# (0.31 + 0.38 + 0.06 = 0.22 + 0.15 + 0.38), which must count (exact p = 62/64)
NONE = np.array([0.31, -0.22, 0.47, -0.15, -0.38, 0.06])


@pytest.mark.parametrize("diff", [CLEAR, NONE], ids=["clear", "none"])
def test_randomization_p_matches_exact_enumeration(diff):
    rng = np.random.default_rng(7)
    b = rng.uniform(0.0, 0.4, size=diff.size)
    a = b + diff
    exact = exact_randomization_p(a, b)
    p = paired_randomization_test(a, b, n_resamples=20000, seed=3)
    # Monte-Carlo standard error is at most 0.5 / sqrt(20000) ~ 0.0035
    assert p == pytest.approx(exact, abs=0.02)
    if diff is CLEAR:
        assert exact == pytest.approx(2 / 64)
    else:
        assert exact == pytest.approx(62 / 64)


def test_randomization_p_counts_ties_of_discrete_scores():
    """Recall-like scores (multiples of 1/2 and 1/3) make many sign patterns tie."""
    rng = np.random.default_rng(8)
    n = 12
    b = rng.choice([0.0, 1 / 3, 0.5, 2 / 3, 1.0], size=n)
    a = np.clip(b + rng.choice([-0.5, -1 / 3, 0.0, 1 / 3, 0.5, 0.5], size=n), 0.0, 1.0)
    exact = exact_randomization_p(a, b)
    d = a - b
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    strict = float(np.mean(np.abs(signs @ d) > abs(d.sum()) + 1e-9))
    assert exact - strict > 0.05  # the ties matter here
    assert paired_randomization_test(a, b, n_resamples=20000, seed=1) == pytest.approx(exact, abs=0.02)


def test_randomization_p_agrees_with_ranx_on_tie_free_scores():
    """Same test as ranx's Fisher randomisation test where no ties can occur."""
    stats = pytest.importorskip("ranx.statistical_tests")
    rng = np.random.default_rng(12)
    b = rng.uniform(size=60)
    a = b + rng.normal(0.02, 0.1, size=60)
    ours = paired_randomization_test(a, b, n_resamples=20000, seed=0)
    theirs, _ = stats.fisher_randomization_test(b, a, 20000, 0.05, 0)
    assert 0.01 < ours < 0.9
    assert ours == pytest.approx(theirs, abs=0.02)


def test_randomization_p_matches_exact_enumeration_random_cases():
    rng = np.random.default_rng(11)
    for _ in range(4):
        n = 10
        b = rng.uniform(size=n)
        a = b + rng.normal(0.1, 0.2, size=n)
        exact = exact_randomization_p(a, b)
        assert paired_randomization_test(a, b, n_resamples=20000, seed=0) == pytest.approx(exact, abs=0.02)


def test_randomization_test_is_deterministic_and_symmetric():
    rng = np.random.default_rng(5)
    b = rng.uniform(size=50)
    a = b + rng.normal(0.03, 0.1, size=50)
    p0 = paired_randomization_test(a, b, n_resamples=5000, seed=42)
    assert paired_randomization_test(a, b, n_resamples=5000, seed=42) == p0
    assert paired_randomization_test(b, a, n_resamples=5000, seed=42) == p0
    assert 0.0 < p0 < 1.0


def test_identical_systems_have_p_one():
    scores = np.random.default_rng(0).uniform(size=40)
    assert paired_randomization_test(scores, scores.copy(), n_resamples=2000, seed=0) == 1.0


def test_p_value_is_never_zero():
    """No resample reaches the observed difference (20 positive differences: only the
    all-plus and all-minus sign vectors do, chance 2^-19 per resample): the p-value is the
    +1-corrected (0 + 1) / (B + 1) of Phipson & Smyth (2010), not 0."""
    diff = np.linspace(0.1, 0.3, 20)
    b = np.zeros(20)
    for n_resamples in (1, 10, 1000):
        p = paired_randomization_test(b + diff, b, n_resamples=n_resamples, seed=0)
        assert p > 0.0
        assert p == pytest.approx(1 / (n_resamples + 1))


def test_holm_adjust_worked_example():
    # by hand: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04;
    # running maximum 0.02, 0.03, 0.06, 0.06; back in the given order:
    assert holm_adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_adjust([0.5, 0.4]) == pytest.approx([0.8, 0.8])  # 0.4 x 2, then max(0.8, 0.5 x 1)
    assert holm_adjust([0.7, 0.6]) == pytest.approx([1.0, 1.0])  # 0.6 x 2 = 1.2, capped at 1
    assert holm_adjust([0.02]) == [0.02]  # a family of one is not adjusted
    assert holm_adjust([]) == []
    with pytest.raises(ValueError):
        holm_adjust([0.1, 1.2])


def test_holm_adjust_agrees_with_statsmodels():
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    p = np.random.default_rng(3).uniform(0, 0.2, size=25)
    _, expected, _, _ = multitest.multipletests(p, method="holm")
    assert holm_adjust(p.tolist()) == pytest.approx(expected.tolist())


def test_randomization_test_rejects_bad_input():
    with pytest.raises(ValueError):
        paired_randomization_test(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError):
        paired_randomization_test(np.zeros(0), np.zeros(0))
    with pytest.raises(ValueError):
        paired_randomization_test(np.zeros(3), np.zeros(3), seed=-1)
    with pytest.raises(ValueError):
        paired_randomization_test(np.zeros(3), np.zeros(3), n_resamples=0)


def test_bootstrap_ci_contains_true_mean_and_has_normal_width():
    rng = np.random.default_rng(2)
    true_mean, sd, n = 0.1, 0.05, 60
    diff = true_mean + rng.normal(0.0, sd, size=n)
    low, high = bootstrap_ci(diff, n_resamples=10000, confidence=0.95, seed=0)
    assert low < true_mean < high
    assert low < diff.mean() < high
    normal_width = 2 * 1.96 * diff.std(ddof=1) / np.sqrt(n)
    assert high - low == pytest.approx(normal_width, rel=0.15)
    # a wider confidence level gives a wider interval
    low99, high99 = bootstrap_ci(diff, n_resamples=10000, confidence=0.99, seed=0)
    assert low99 < low and high99 > high


def test_bootstrap_ci_is_deterministic_and_shift_equivariant():
    diff = np.random.default_rng(3).normal(0.0, 0.2, size=45)
    ci = bootstrap_ci(diff, n_resamples=3000, seed=9)
    assert bootstrap_ci(diff, n_resamples=3000, seed=9) == ci
    shifted = bootstrap_ci(diff + 0.25, n_resamples=3000, seed=9)
    assert shifted == pytest.approx((ci[0] + 0.25, ci[1] + 0.25), abs=1e-12)


def test_bootstrap_ci_of_constant_difference_is_a_point():
    low, high = bootstrap_ci(np.full(30, 0.125), n_resamples=2000, seed=1)
    assert low == high == pytest.approx(0.125, abs=1e-15)


def _random_run(rng, n_queries=25, n_docs=400, depth=150):
    qrels, run = {}, {}
    for q in range(n_queries):
        gold = rng.choice(n_docs, size=int(rng.integers(1, 8)), replace=False)
        qrels[q] = {int(g) for g in gold}
        ranked = [int(d) for d in rng.permutation(n_docs)[:depth]]
        for g in gold[: len(gold) // 2 + 1]:  # pull some gold articles towards the top
            g = int(g)
            if g in ranked:
                ranked.remove(g)
            ranked.insert(int(rng.integers(0, 60)), g)
        run[q] = ranked[:depth]
    del run[n_queries - 1]  # a query with no ranked list scores 0
    return run, qrels


def test_per_query_scores_agree_with_pytrec_eval():
    pytrec_eval = pytest.importorskip("pytrec_eval")
    run, qrels = _random_run(np.random.default_rng(4))
    trec_qrels = {str(q): {str(d): 1 for d in gold} for q, gold in qrels.items()}
    trec_run = {str(q): {str(d): float(len(r) - i) for i, d in enumerate(r)} for q, r in run.items()}
    evaluator = pytrec_eval.RelevanceEvaluator(trec_qrels, {"recall.100", "map"})
    reference = evaluator.evaluate(trec_run)
    for metric, key in (("recall@100", "recall_100"), ("map", "map")):
        ours = per_query_scores(run, qrels, metric)
        assert list(ours) == list(qrels)
        for q in qrels:
            expected = reference[str(q)][key] if str(q) in reference else 0.0
            assert ours[q] == pytest.approx(expected, abs=1e-9), (metric, q)
        assert np.mean(list(ours.values())) == pytest.approx(evaluate_run(run, qrels)[metric], abs=1e-12)
    with pytest.raises(ValueError):
        per_query_scores(run, qrels, "precision@5")


def _three_systems(n_queries=40, n_docs=1000, depth=500):
    """bm25 < dsr < gdsr: gold articles placed ever closer to the top."""
    rng = np.random.default_rng(0)
    qrels, runs = {}, {"bm25": {}, "dsr": {}, "gdsr": {}}
    spread = {"bm25": 400, "dsr": 150, "gdsr": 4}
    for q in range(n_queries):
        gold = [int(g) for g in rng.choice(n_docs, size=2, replace=False)]
        qrels[q] = set(gold)
        others = [int(d) for d in rng.permutation(n_docs) if int(d) not in qrels[q]]
        for name, width in spread.items():
            ranked = list(others[:depth])
            for g in gold:
                ranked.insert(int(rng.integers(0, width)), g)
            runs[name][q] = ranked[:depth]
    return runs, qrels


def test_compare_systems_structure_and_markers():
    runs, qrels = _three_systems()
    baselines = ["bm25", "dsr", "absent"]
    cmp = compare_systems(runs, qrels, baselines, metrics=("recall@100", "map"), n_resamples=2000, seed=0)
    json.dumps(cmp)  # JSON-friendly
    assert list(cmp) == ["bm25", "dsr", "gdsr"]
    assert list(cmp["gdsr"]) == ["vs_bm25", "vs_dsr"]
    assert list(cmp["bm25"]) == ["vs_dsr"]  # no self-comparison, absent baseline skipped
    assert list(cmp["dsr"]) == ["vs_bm25"]

    means = {name: evaluate_run(run, qrels) for name, run in runs.items()}
    for system, versus in cmp.items():
        for key, by_metric in versus.items():
            baseline = key.removeprefix("vs_")
            assert list(by_metric) == ["recall@100", "map"]
            for metric, entry in by_metric.items():
                assert set(entry) == {
                    "system",
                    "baseline",
                    "diff",
                    "p_value",
                    "p_holm",
                    "ci95",
                    "significant",
                    "n_queries",
                }
                assert entry["n_queries"] == 40
                assert entry["system"] == round(means[system][metric], 4)
                assert entry["baseline"] == round(means[baseline][metric], 4)
                assert entry["diff"] == pytest.approx(entry["system"] - entry["baseline"], abs=2e-4)
                lo, hi = entry["ci95"]
                assert lo <= entry["diff"] <= hi
                for value in (entry["system"], entry["baseline"], entry["diff"], entry["p_value"], lo, hi):
                    assert round(value, 4) == value
                assert entry["p_holm"] >= entry["p_value"] > 0
                assert entry["significant"] == (entry["p_holm"] < 0.05)

    for metric in ("recall@100", "map"):
        for baseline in ("bm25", "dsr"):
            entry = cmp["gdsr"][f"vs_{baseline}"][metric]
            assert entry["diff"] > 0 and entry["significant"] and entry["ci95"][0] > 0
        # gdsr beats both; the worse bm25 gets no marker even where significantly worse
        assert significance_markers(cmp, "gdsr", metric, baselines) == "ᵇᵈ"
        assert cmp["bm25"]["vs_dsr"][metric]["diff"] < 0
        assert significance_markers(cmp, "bm25", metric, baselines) == ""
        dsr_vs_bm25 = cmp["dsr"]["vs_bm25"][metric]
        expected = "ᵇ" if dsr_vs_bm25["significant"] and dsr_vs_bm25["diff"] > 0 else ""
        assert significance_markers(cmp, "dsr", metric, baselines) == expected
    assert significance_markers(cmp, "gdsr", "ndcg@10", baselines) == ""  # metric not compared

    # Holm over the family: 3 pairs x 2 metrics = 6 distinct tests (A vs B is B vs A)
    family = {
        (frozenset((s, k.removeprefix("vs_"))), m): e["p_value"]
        for s, versus in cmp.items()
        for k, by_metric in versus.items()
        for m, e in by_metric.items()
    }
    assert len(family) == 6
    keys = list(family)
    by_hand = holm_adjust([family[k] for k in keys])
    for system, versus in cmp.items():
        for key, by_metric in versus.items():
            for metric, entry in by_metric.items():
                index = keys.index((frozenset((system, key.removeprefix("vs_"))), metric))
                assert entry["p_holm"] == pytest.approx(by_hand[index], abs=1e-4)

    # deterministic for a seed
    again = compare_systems(runs, qrels, baselines, metrics=("recall@100", "map"), n_resamples=2000, seed=0)
    assert again == cmp


def test_identical_systems_are_not_significant():
    runs, qrels = _three_systems(n_queries=20)
    runs = {"bm25": runs["bm25"], "copy": dict(runs["bm25"])}
    cmp = compare_systems(runs, qrels, ["bm25"], n_resamples=1000)
    for entry in cmp["copy"]["vs_bm25"].values():
        assert entry["diff"] == 0.0 and entry["p_value"] == 1.0 and not entry["significant"]
        assert entry["ci95"] == [0.0, 0.0]
    assert significance_markers(cmp, "copy", "map", ["bm25"]) == ""


def test_baseline_letters_and_legend():
    assert baseline_letters(["bm25", "dsr"]) == {"bm25": "b", "dsr": "d"}
    # clashes take the next unused letter of the name, then of the alphabet
    assert baseline_letters(["bm25", "bm25_rm3", "dsr", "dense", "ddd"]) == {
        "bm25": "b",
        "bm25_rm3": "m",
        "dsr": "d",
        "dense": "e",
        "ddd": "a",
    }
    legend = marker_legend(["bm25", "dsr"])
    assert "ᵇ bm25" in legend and "ᵈ dsr" in legend and "p < 0.05 after Holm's adjustment" in legend
    assert marker_legend([]) == ""
