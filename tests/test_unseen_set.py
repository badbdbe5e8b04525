"""data/unseen/questions.jsonl (the held-out set) and benchmarks/unseen.py's scoring, by hand."""

from __future__ import annotations

import json
import math
import re

import polars as pl
import pytest

from conftest import ROOT, load_benchmark

unseen = load_benchmark("unseen")

QUESTIONS = ROOT / "data/unseen/questions.jsonl"
SAMPLE = ROOT / "data/sample"
FIRST_ID = 900001
KEYS = {"id", "question", "article_ids", "article_numbers", "category"}


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


@pytest.fixture(scope="module")
def records() -> list[dict]:
    lines = [line for line in QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [json.loads(line) for line in lines]


def test_records_are_well_formed(records):
    assert len(records) == 60
    for rec in records:
        assert set(rec) == KEYS, rec.get("id")
        assert isinstance(rec["question"], str) and rec["question"].strip()
        assert isinstance(rec["category"], str) and rec["category"].strip()
        assert 1 <= len(rec["article_ids"]) <= 5
        assert len(rec["article_ids"]) == len(set(rec["article_ids"])) == len(rec["article_numbers"])
        assert all(isinstance(i, int) for i in rec["article_ids"])


def test_ids_are_unique_and_consecutive_from_900001(records):
    assert [rec["id"] for rec in records] == list(range(FIRST_ID, FIRST_ID + len(records)))


def test_gold_articles_exist_and_numbers_match(records):
    articles = pl.read_csv(SAMPLE / "articles.csv", columns=["id", "reference"])
    assert articles["id"].to_list() == list(range(1, 2761))
    reference = dict(zip(articles["id"].to_list(), articles["reference"].to_list()))
    for rec in records:
        for article_id, number in zip(rec["article_ids"], rec["article_numbers"]):
            assert article_id in reference, (rec["id"], article_id)
            assert reference[article_id].startswith(f"Art. {number},"), (rec["id"], article_id, number)


def test_no_question_repeats_a_sample_question(records):
    sample = set()
    for path in sorted(SAMPLE.glob("questions_*.csv")):
        sample |= {_norm(q) for q in pl.read_csv(path, columns=["question"])["question"].to_list()}
    assert len(sample) >= 330
    ours = [_norm(rec["question"]) for rec in records]
    assert len(set(ours)) == len(ours)
    assert not set(ours) & sample


# Toy run, 2 questions. q1: gold {10, 20}; q2: gold {30}.
#   a: q1 ranks 10 at 1 and 20 at 3; q2 ranks 30 at 3.
#   b: q1 ranks 10 at 2, never 20; q2 retrieves nothing relevant.
QRELS = {1: [10, 20], 2: [30]}
RUNS = {"a": {1: [10, 5, 20], 2: [7, 8, 30]}, "b": {1: [5, 10], 2: [1, 2]}}
IDCG2 = 1 + 1 / math.log2(3)


def test_score_matches_hand_computation():
    result = unseen.score(RUNS, QRELS, baseline="b", n_resamples=4000, seed=0)
    a, b = result["systems"]["a"], result["systems"]["b"]
    assert result["n_queries"] == 2 and result["baseline"] == "b"
    # a: every gold article in the top 3; AP q1 = (1/1 + 2/3) / 2, AP q2 = 1/3
    assert a["metrics"]["recall@10"] == a["metrics"]["recall@100"] == a["metrics"]["recall@500"] == 1.0
    assert a["metrics"]["map"] == pytest.approx(((1 + 2 / 3) / 2 + 1 / 3) / 2, abs=1e-4)  # 0.5833
    # nDCG@10 q1 = (1 + 1/log2 4) / IDCG(2), q2 = (1/log2 4) / 1
    assert a["metrics"]["ndcg@10"] == pytest.approx(((1 + 0.5) / IDCG2 + 0.5) / 2, abs=1e-4)  # 0.7099
    # b: q1 half its gold, AP = (1/2) / 2; q2 nothing
    assert b["metrics"]["recall@100"] == pytest.approx(0.25)
    assert b["metrics"]["map"] == pytest.approx(0.125, abs=1e-4)
    assert b["metrics"]["ndcg@10"] == pytest.approx((1 / math.log2(3)) / IDCG2 / 2, abs=1e-4)  # 0.1934
    assert a["per_query"]["1"]["map"] == pytest.approx(0.8333, abs=1e-4)
    # paired differences: recall@100 (0.5, 1.0), map (0.5833, 0.3333). Of the 4 sign patterns,
    # only the 2 with equal signs reach the observed |sum|: p = 1/2 (Monte-Carlo)
    recall, ap = a["vs_baseline"]["recall@100"], a["vs_baseline"]["map"]
    assert recall["diff"] == pytest.approx(0.75) and ap["diff"] == pytest.approx(0.4583, abs=1e-4)
    assert recall["p_value"] == pytest.approx(0.5, abs=0.03) and ap["p_value"] == pytest.approx(0.5, abs=0.03)
    # bootstrap means of (0.5, 1.0) can only be 0.5, 0.75 or 1.0
    assert recall["ci95"] == [0.5, 1.0]
    assert b["vs_baseline"] is None


def test_markdown_table_rows():
    result = unseen.score(RUNS, QRELS, baseline="b", n_resamples=1000)
    table = unseen.markdown_table(result)
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "ΔR@100 (p adj.)" in rows["System"]
    # the deltas carry the Holm-adjusted p over the table's 2 tests (a's R@100 and mAP against b)
    vs = result["systems"]["a"]["vs_baseline"]
    assert vs["recall@100"]["p_holm"] == pytest.approx(
        min(1.0, 2 * min(vs["recall@100"]["p_value"], vs["map"]["p_value"])), abs=1e-4
    )
    assert "| 100.0 | 100.0 | 100.0 | 58.3 | 71.0 |" in rows["a"]
    assert f"+75.0 ({unseen.format_p(vs['recall@100']['p_holm'])}) |" in rows["a"]
    assert rows["b"].endswith("|  |  |")
    assert "Holm-adjusted over the table's 2 tests" in table


def test_format_p():
    assert [unseen.format_p(p) for p in (0.0018, 0.0325, 0.2, 0.02, 1.0, 1.2)] == [
        "0.0018",
        "0.033",
        "0.20",
        "0.020",
        "1.0",
        "1.0",
    ]


def test_docs_table_is_the_committed_result():
    """The docs' table of the unseen questions (docs/analysis.md, moved there from the README) is
    ``benchmarks/unseen.py --table benchmarks/unseen.json``, line for line (rerun the benchmark,
    then paste its table)."""
    import json

    result = json.loads((ROOT / "benchmarks/unseen.json").read_text(encoding="utf-8"))
    expected = [line for line in unseen.markdown_table(result).splitlines() if line.startswith("|")]
    readme = (ROOT / "docs" / "analysis.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(readme) if line.startswith("**Questions the project never saw**"))
    first = next(i for i in range(start, len(readme)) if readme[i].startswith("|"))
    table = readme[first : first + len(expected)]
    assert table == expected
    assert not readme[first + len(expected)].startswith("|")
