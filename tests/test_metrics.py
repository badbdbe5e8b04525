"""lexgraph.metrics.ir against pytrec_eval (trec_eval) on random runs, plus hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lexgraph.metrics.ir import (
    METRICS,
    average_precision,
    evaluate_run,
    mrr_at_k,
    ndcg_at_k,
    per_query,
    r_precision,
    recall_at_k,
)

pytrec_eval = pytest.importorskip("pytrec_eval")

TREC_NAMES = {
    "recall@10": "recall_10",
    "recall@100": "recall_100",
    "recall@200": "recall_200",
    "recall@500": "recall_500",
    "map": "map",
    "map@100": "map_cut_100",
    "r_precision": "Rprec",
    "ndcg@10": "ndcg_cut_10",
}
#: mrr@k is trec_eval's recip_rank on the run truncated to its top k
RR_CUTS = {"mrr@10": 10, "mrr@100": 100}


def random_case(seed: int, n_queries: int = 300, n_docs: int = 2000):
    """A random run and qrels: variable depth and gold sizes, misses and absent queries."""
    rng = np.random.default_rng(seed)
    run, qrels = {}, {}
    for q in range(n_queries):
        qid = f"q{q}"
        n_rel = int(rng.choice([1, 1, 2, 3, 5, 12, 40, 150]))
        gold = rng.choice(n_docs, size=n_rel, replace=False)
        qrels[qid] = set(gold.tolist())
        kind = rng.random()
        if kind < 0.1:
            continue  # no ranked list at all
        depth = int(rng.choice([5, 10, 37, 200, 500, 650]))
        if kind < 0.2:  # nothing relevant retrieved
            pool = np.setdiff1d(np.arange(n_docs), gold)
            ranked = rng.choice(pool, size=depth, replace=False)
        else:  # mix gold into a random list at random positions
            ranked = rng.choice(n_docs, size=depth, replace=False)
            k = int(rng.integers(0, n_rel + 1))
            chosen = rng.choice(gold, size=k, replace=False)
            ranked = np.concatenate([chosen, ranked[~np.isin(ranked, chosen)]])[:depth]
            rng.shuffle(ranked[: max(1, depth // int(rng.choice([1, 4, 20])))])
        run[qid] = ranked.tolist()
    return run, qrels


def trec_eval_scores(run, qrels, measures, cut=None):
    """pytrec_eval scores; strictly decreasing scores so trec_eval keeps our order."""
    trec_run = {
        qid: {str(doc): float(len(ranked) - i) for i, doc in enumerate(ranked[:cut] if cut else ranked)}
        for qid, ranked in run.items()
    }
    trec_qrels = {qid: {str(doc): 1 for doc in gold} for qid, gold in qrels.items()}
    evaluator = pytrec_eval.RelevanceEvaluator(trec_qrels, measures)
    return evaluator.evaluate(trec_run)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_agrees_with_pytrec_eval(seed):
    run, qrels = random_case(seed)
    ref = trec_eval_scores(run, qrels, {"recall.10,100,200,500", "map", "map_cut.100", "Rprec", "ndcg_cut.10"})
    ref_rr = {name: trec_eval_scores(run, qrels, {"recip_rank"}, cut=k) for name, k in RR_CUTS.items()}
    full_rr = trec_eval_scores(run, qrels, {"recip_rank"})
    ours = per_query(run, qrels)
    # the random runs put relevant articles both within and beyond rank 100: the cut-offs matter
    assert any(0 < ours[q]["map@100"] < ref[q]["map"] - 1e-6 for q in run)
    assert any(ours[q]["mrr@100"] == 0 < full_rr[q]["recip_rank"] for q in run)
    assert any(ours[q]["mrr@10"] == 0 < ours[q]["mrr@100"] for q in run)
    assert list(ours) == list(qrels)
    assert any(qid not in run for qid in qrels)
    for qid, values in ours.items():
        assert list(values) == list(METRICS)
        if qid not in run:
            assert all(v == 0.0 for v in values.values())
            continue
        for name, trec_name in TREC_NAMES.items():
            assert values[name] == pytest.approx(ref[qid][trec_name], abs=1e-9), (qid, name)
        for name in RR_CUTS:
            assert values[name] == pytest.approx(ref_rr[name][qid]["recip_rank"], abs=1e-9), (qid, name)

    # macro-average over all qrels queries, absent ones counting 0
    macro = evaluate_run(run, qrels)
    assert list(macro) == list(METRICS)
    for name in METRICS:
        expected = sum(ours[q][name] for q in qrels) / len(qrels)
        assert macro[name] == pytest.approx(expected, abs=1e-12)
        trec = ref_rr[name] if name in RR_CUTS else ref
        key = "recip_rank" if name in RR_CUTS else TREC_NAMES[name]
        assert macro[name] == pytest.approx(sum(trec[q][key] for q in run) / len(qrels), abs=1e-9)


@pytest.mark.parametrize("seed", [10, 11])
def test_per_query_functions_agree_with_vectorised(seed):
    run, qrels = random_case(seed, n_queries=80)
    ours = per_query(run, qrels)
    for qid, gold in qrels.items():
        ranked = run.get(qid, [])
        expected = {
            "recall@10": recall_at_k(ranked, gold, 10),
            "recall@100": recall_at_k(ranked, gold, 100),
            "recall@200": recall_at_k(ranked, gold, 200),
            "recall@500": recall_at_k(ranked, gold, 500),
            "map": average_precision(ranked, gold),
            "map@100": average_precision(ranked, gold, 100),
            "r_precision": r_precision(ranked, gold),
            "mrr@10": mrr_at_k(ranked, gold, 10),
            "mrr@100": mrr_at_k(ranked, gold, 100),
            "ndcg@10": ndcg_at_k(ranked, gold, 10),
        }
        for name in METRICS:
            assert ours[qid][name] == pytest.approx(expected[name], abs=1e-12), (qid, name)


def test_hand_computed():
    ranked, gold = [3, 1, 2], {1, 2}
    assert average_precision(ranked, gold) == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert recall_at_k(ranked, gold, 1) == 0.0
    assert recall_at_k(ranked, gold, 2) == 0.5
    assert recall_at_k(ranked, gold, 10) == 1.0
    assert r_precision(ranked, gold) == 0.5
    assert mrr_at_k(ranked, gold, 10) == 0.5
    assert mrr_at_k(ranked, gold, 1) == 0.0
    idcg = 1 + 1 / math.log2(3)
    assert ndcg_at_k(ranked, gold, 10) == pytest.approx((1 / math.log2(3) + 1 / math.log2(4)) / idcg)
    # ideal DCG uses min(R, k) relevant articles
    assert ndcg_at_k([5, 9], {5, 6, 7}, 1) == 1.0
    # gold never retrieved, and an empty ranked list
    assert average_precision([7, 8], {1}) == 0.0
    assert ndcg_at_k([], {1}, 10) == 0.0
    # R-precision on a list shorter than R still divides by R
    assert r_precision([1], {1, 2, 3}) == pytest.approx(1 / 3)

    result = evaluate_run({"a": ranked, "b": [9]}, {"a": gold, "b": [9], "c": [4]})
    assert result["map"] == pytest.approx(((1 / 2 + 2 / 3) / 2 + 1 + 0) / 3)
    assert result["mrr@10"] == pytest.approx((0.5 + 1 + 0) / 3)
    # lists shorter than 100: the @100 cut-offs change nothing
    assert result["map@100"] == pytest.approx(result["map"])
    assert result["mrr@100"] == pytest.approx(result["mrr@10"])


def test_hand_computed_cut_offs_at_100():
    # 150 non-relevant fillers, of which articles 1, 2, 3 replace those at ranks 2, 100, 101
    ranked = [1000 + i for i in range(150)]
    ranked[1], ranked[99], ranked[100] = 1, 2, 3
    gold = {1, 2, 3, 4}  # R = 4; article 4 is never retrieved
    # AP@100 = (1/R) * (P@2 + P@100) = (1/2 + 2/100) / 4 = 0.52 / 4 = 0.13
    #   (rank 101 is beyond the cut; the sum is divided by R = 4, not by the 2 hits in the top 100)
    assert average_precision(ranked, gold, 100) == pytest.approx(0.13)
    # AP without a cut-off adds P@101 = 3/101: (0.52 + 3/101) / 4 = 0.137426 (to 6 decimals)
    assert average_precision(ranked, gold) == pytest.approx((0.52 + 3 / 101) / 4)
    assert average_precision(ranked, gold, 1) == 0.0  # rank 1 is a filler
    # RR@100: first relevant at rank 2 -> 1/2
    assert mrr_at_k(ranked, gold, 100) == 0.5
    # gold {2, 3}: first relevant at rank 100 -> RR@100 = 1/100 = 0.01, RR@10 = 0;
    # AP@100 = (1/R) * P@100 = (1/100) / 2 = 0.005 (P@100 counts 1 hit in 100 ranks)
    assert average_precision(ranked, {2, 3}, 100) == pytest.approx(0.005)
    assert mrr_at_k(ranked, {2, 3}, 100) == pytest.approx(0.01)
    assert mrr_at_k(ranked, {2, 3}, 10) == 0.0
    # gold {3}: only at rank 101, beyond the cut -> RR@100 = 0 (trec_eval's full recip_rank: 1/101);
    # AP@100 = 0, AP = (1/101) / 1
    assert mrr_at_k(ranked, {3}, 100) == 0.0
    assert average_precision(ranked, {3}, 100) == 0.0
    assert average_precision(ranked, {3}) == pytest.approx(1 / 101)

    # the vectorised run-level code gives the same numbers; the missing query "d" scores 0
    qrels = {"a": gold, "b": {2, 3}, "c": {3}, "d": {1}}
    run = {"a": ranked, "b": ranked, "c": ranked}
    ours = per_query(run, qrels)
    assert [ours[q]["map@100"] for q in qrels] == pytest.approx([0.13, 0.005, 0.0, 0.0])
    assert [ours[q]["mrr@100"] for q in qrels] == pytest.approx([0.5, 0.01, 0.0, 0.0])
    macro = evaluate_run(run, qrels)
    assert macro["map@100"] == pytest.approx((0.13 + 0.005 + 0 + 0) / 4)  # = 0.03375
    assert macro["mrr@100"] == pytest.approx((0.5 + 0.01 + 0 + 0) / 4)  # = 0.1275


def test_duplicates():
    # duplicate gold ids count once
    assert recall_at_k([1], [1, 1, 2], 10) == 0.5
    assert average_precision([1, 2], [2, 2, 1]) == 1.0
    # duplicate ranked ids: first occurrence only, later copies do not take a rank
    assert average_precision([3, 3, 3, 1], {1}) == 0.5
    assert average_precision([1, 1, 2], {1, 2}) == 1.0
    assert recall_at_k([1, 1, 1, 2], {1, 2}, 2) == 1.0
    assert ndcg_at_k([1, 1, 2], {1, 2}, 2) == pytest.approx(1.0)
    run = {"a": [1, 1, 2, 3, 3, 4], "b": np.array([5, 5, 5])}
    qrels = {"a": [2, 4, 4], "b": {5}}
    ours = per_query(run, qrels)
    assert ours["a"]["map"] == pytest.approx((1 / 2 + 2 / 4) / 2)
    assert ours["a"]["r_precision"] == pytest.approx(1 / 2)
    assert ours["b"]["mrr@10"] == 1.0


def test_empty_relevant_raises():
    with pytest.raises(ValueError, match="empty"):
        average_precision([1, 2], set())
    with pytest.raises(ValueError, match="'q7'"):
        evaluate_run({"q7": [1]}, {"q1": {1}, "q7": set()})
    with pytest.raises(ValueError, match="'q7'"):
        per_query({}, {"q7": []})
    with pytest.raises(ValueError):
        evaluate_run({}, {})
    with pytest.raises(ValueError):
        recall_at_k([1], {1}, 0)


def test_run_queries_without_qrels_are_ignored():
    result = evaluate_run({"a": [1], "zzz": [2]}, {"a": {1}})
    assert result == {name: 1.0 for name in METRICS}
