"""Qrels beside the runs (issue 26, item 4): ``evaluate`` writes ``data/runs/<split>.qrels`` next to
``data/runs/<system>/<split>.trec``, ids spelt as the runs spell them, so trec_eval (here
pytrec_eval, its library form) scores a written run with the written qrels to the project's own
numbers (``lexgraph.metrics.ir``, ``metrics/<system>.json``)."""

from __future__ import annotations

import json
import random

import numpy as np
import polars as pl
import pytest

from helpers_cli import write_articles
from helpers_config import sample_config
from lexgraph.core.errors import DataError
from lexgraph.core.stage import StageContext
from lexgraph.evaluation.evaluate import EvaluateConfig, EvaluatePaths, run_evaluate
from lexgraph.evaluation.trec import read_trec, trec_id, write_qrels, write_trec
from lexgraph.metrics.ir import evaluate_run, rounded
from lexgraph.search.bm25 import BM25

pytrec_eval = pytest.importorskip("pytrec_eval")

#: lexgraph's metric -> trec_eval's measure (pytrec_eval spells the cut-off with a dot)
TREC_MEASURES = {"map": "map", "recall@100": "recall_100", "ndcg@10": "ndcg_cut_10"}


def test_qrels_lines_and_ids_are_the_runs(tmp_path):
    path = tmp_path / "runs" / "test.qrels"
    write_qrels(path, {7: [30, 4, 30], np.int64(12): (9,), "q-3": {5, 1}})
    assert path.read_text(encoding="utf-8") == (
        "7 0 4 1\n7 0 30 1\n12 0 9 1\n" + "q-3 0 1 1\nq-3 0 5 1\n"  # ascending, once each
    )
    assert [p.name for p in path.parent.iterdir()] == ["test.qrels"]  # atomic: no temporary left
    write_trec(tmp_path / "run.trec", [np.int64(12)], np.array([[9, 4]]), np.array([[2.0, 1.0]]), "t")
    qid, _, doc, *_ = (tmp_path / "run.trec").read_text(encoding="utf-8").split()
    assert (qid, doc) == ("12", "9")  # the run spells the qid and docid as the qrels do
    assert trec_id(np.int64(12)) == trec_id(12) == "12" and trec_id("q-3") == "q-3"
    with open(path, encoding="utf-8") as fh:
        assert pytrec_eval.parse_qrel(fh) == {"7": {"4": 1, "30": 1}, "12": {"9": 1}, "q-3": {"1": 1, "5": 1}}


@pytest.mark.parametrize(("qrels", "match"), [({1: []}, "no relevant article"), ({"a b": [1]}, "whitespace")])
def test_qrels_refuse_what_trec_eval_could_not_read(tmp_path, qrels, match):
    with pytest.raises(ValueError, match=match):
        write_qrels(tmp_path / "x.qrels", qrels)
    assert not (tmp_path / "x.qrels").exists()


def _corpus(seed: int = 3, n_articles: int = 160, n_questions: int = 40):
    """Articles of made-up words, and questions that share a rare word with some of the articles
    they cite and a common one ("lex", in fewer than half of the articles) with all of them, so
    the metrics are neither 0 nor 1 (recall@100 included). No cited article ties with another
    in score (trec_eval orders ties by docno, lexgraph by lower id): each scores above 0, and no
    two articles have the same length."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bdfglmnprstv" for v in "aeiou"]
    vocab = sorted({"".join(rng.sample(syllables, 3)) for _ in range(400)})
    articles = {i: rng.sample(vocab, 8 + i) for i in range(1, n_articles + 1)}
    common = [i for i in articles if i % 9 < 4]  # fewer than half: "lex" keeps a positive idf
    for i in common:
        articles[i].append("lex")
    rows = []
    for qid in range(1, n_questions + 1):
        gold = sorted(rng.sample(common, rng.randint(1, 3)))
        words = ["lex"] + [rng.choice(articles[a]) for a in gold[::2]] + rng.sample(vocab, 1)
        rows.append((qid, " ".join(words), gold, "dev" if qid % 2 else "test"))
    ids, texts, golds, splits = zip(*rows)
    questions = pl.DataFrame(
        {"id": list(ids), "question": list(texts), "article_ids": list(golds), "split": list(splits)},
        schema_overrides={"article_ids": pl.List(pl.Int64)},
    )
    return {i: " ".join(words) for i, words in articles.items()}, questions


def _trec_eval(qrels_path, run_path, n_queries: int) -> dict[str, float]:
    """pytrec_eval's means over the qrels' queries (a query without a line in the run scores 0,
    as ``trec_eval -c`` counts it and as lexgraph does)."""
    with open(qrels_path, encoding="utf-8") as fh:
        qrels = pytrec_eval.parse_qrel(fh)
    with open(run_path, encoding="utf-8") as fh:
        run = pytrec_eval.parse_run(fh)
    assert len(qrels) == n_queries
    per_query = pytrec_eval.RelevanceEvaluator(qrels, set(TREC_MEASURES.values())).evaluate(run)
    return {ours: sum(q[theirs] for q in per_query.values()) / len(qrels) for ours, theirs in TREC_MEASURES.items()}


def test_pytrec_eval_scores_evaluates_runs_with_its_qrels_to_our_numbers(tmp_path):
    articles, questions = _corpus()
    ws = tmp_path / "ws"
    write_articles(ws, articles)
    BM25(k1=1.2, b=0.75).fit_texts(list(articles.values()), list(articles)).save(ws / "models" / "bm25")
    questions.write_parquet(ws / "data" / "clean" / "questions.parquet")
    config = sample_config(EvaluateConfig, "evaluate", systems=["bm25"], baselines=[])
    paths = EvaluatePaths(
        questions=ws / "data" / "clean" / "questions.parquet",
        keys=ws / "data" / "clean" / "keys.parquet",
        runs=ws / "data" / "runs",
        metrics_dir=ws / "metrics",
        workspace=ws,
    )
    run_evaluate(paths, config, StageContext(seed=0, device="cpu"))

    assert sorted(p.name for p in paths.runs.iterdir()) == ["bm25", "dev.qrels", "test.qrels"]
    reported = json.loads((paths.metrics_dir / "bm25.json").read_text(encoding="utf-8"))
    for split in ("dev", "test"):
        sub = questions.filter(pl.col("split") == split)
        qrels_path, run_path = paths.runs / f"{split}.qrels", paths.runs / "bm25" / f"{split}.trec"
        theirs = _trec_eval(qrels_path, run_path, sub.height)
        ours = evaluate_run(read_trec(run_path), dict(zip(sub["id"], sub["article_ids"].to_list())))
        for metric, value in theirs.items():
            assert value == pytest.approx(ours[metric], abs=1e-12), (split, metric)
            assert rounded(value) == reported[split][metric], (split, metric)
        assert 0.05 < theirs["map"] < 0.95 and theirs["recall@100"] < 1, theirs  # misses and hits
    # evaluate reads the user's ids from its --keys file (a dvc.yaml dep): without it, one line naming it
    paths.keys.unlink()
    with pytest.raises(DataError) as err:
        run_evaluate(paths, config, StageContext(seed=0, device="cpu"))
    assert str(err.value) == f"{paths.keys}: file not found; rerun `dvc repro clean` (or `dvc checkout`) to restore it"
