"""Per-question results and the recall@k curve of the evaluate stage (lexgraph.evaluation.per_query,
issue 10, item 5): they agree with lexgraph.metrics.ir, and the files are sorted and deterministic."""

from __future__ import annotations

import csv
import json
import logging

import numpy as np
import polars as pl
import pytest
import yaml

from conftest import ROOT
from lexgraph.evaluation.per_query import first_relevant_rank, per_query_table, recall_curve, write_per_query_reports
from lexgraph.evaluation.trec import write_trec
from lexgraph.metrics.ir import evaluate_run, recall_at_k


def random_runs(seed: int = 0, n_queries: int = 40, n_docs: int = 300, depth: int = 120):
    rng = np.random.default_rng(seed)
    qrels = {
        int(q): rng.choice(n_docs, size=int(rng.integers(1, 6)), replace=False).tolist()
        for q in rng.choice(10_000, size=n_queries, replace=False)
    }
    runs = {}
    for system in ("sys_a", "sys_b"):
        run = {}
        for q in qrels:
            if rng.random() < 0.1:
                continue  # a query the system did not answer
            ranked = rng.permutation(n_docs)[: int(rng.integers(1, depth))].tolist()
            if rng.random() < 0.3:
                ranked.insert(int(rng.integers(0, len(ranked))), ranked[0])  # a duplicate id
            run[q] = ranked
        runs[system] = run
    return runs, qrels


def test_first_relevant_rank_by_hand():
    assert first_relevant_rank([5, 10, 7, 20], [10, 20], k=3) == 2
    assert first_relevant_rank([5, 10, 7, 20], [10, 20], k=1) is None
    assert first_relevant_rank([4, 4, 4, 30], [30], k=2) == 2  # a repeated id counts once
    assert first_relevant_rank([], [30], k=500) is None


def test_table_by_hand():
    qrels = {2: [30], 1: [10, 20, 20]}
    runs = {"a": {1: [5, 10, 7, 20], 2: [1, 2]}, "b": {1: [20]}}
    table = per_query_table(runs, qrels, k=3, questions={1: "q un", 2: "q deux"})
    assert table.columns == [
        "id",
        "n_relevant",
        "a_recall@100",
        "a_ap",
        "a_first_rank",
        "b_recall@100",
        "b_ap",
        "b_first_rank",
        "question",
    ]
    assert table.to_dicts() == [
        {
            "id": 1,
            "n_relevant": 2,
            "a_recall@100": 1.0,
            "a_ap": (1 / 2 + 2 / 4) / 2,
            "a_first_rank": 2,
            "b_recall@100": 0.5,
            "b_ap": 0.5,
            "b_first_rank": 1,
            "question": "q un",
        },
        {
            "id": 2,
            "n_relevant": 1,
            "a_recall@100": 0.0,
            "a_ap": 0.0,
            "a_first_rank": None,
            "b_recall@100": 0.0,
            "b_ap": 0.0,
            "b_first_rank": None,
            "question": "q deux",
        },
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_column_means_are_the_run_metrics(seed):
    runs, qrels = random_runs(seed)
    table = per_query_table(runs, qrels, k=100)
    assert table["id"].to_list() == sorted(qrels)
    for system, run in runs.items():
        means = evaluate_run(run, qrels)
        assert table[f"{system}_recall@100"].mean() == pytest.approx(means["recall@100"], abs=1e-12)
        assert table[f"{system}_ap"].mean() == pytest.approx(means["map"], abs=1e-12)
        # first rank <= 10 <=> mrr@10 = 1 / rank
        ranks = table[f"{system}_first_rank"].to_list()
        rr = [1 / r if r is not None and r <= 10 else 0.0 for r in ranks]
        assert np.mean(rr) == pytest.approx(means["mrr@10"], abs=1e-12)
        for qid, rank in zip(table["id"].to_list(), ranks):  # against a plain loop over the run
            ranked = list(dict.fromkeys(run.get(qid, [])))[:100]
            expected = next((i for i, d in enumerate(ranked, 1) if d in set(qrels[qid])), None)
            assert rank == expected


def test_recall_curve_matches_the_metrics():
    runs, qrels = random_runs(3)
    curve = recall_curve(runs, qrels, depth=500)
    assert curve.columns == ["k", "system", "recall"] and curve.height == 2 * 500
    assert curve["system"].to_list() == ["sys_a"] * 500 + ["sys_b"] * 500
    for system, run in runs.items():
        rows = curve.filter(pl.col("system") == system)
        assert rows["k"].to_list() == list(range(1, 501))
        recall = rows["recall"].to_numpy()
        assert np.all(np.diff(recall) >= 0)
        means = evaluate_run(run, qrels)
        for k in (100, 200, 500):
            assert recall[k - 1] == pytest.approx(means[f"recall@{k}"], abs=1e-12)
        for k in (1, 3, 17, 119):
            expected = np.mean([recall_at_k(run.get(q, []), qrels[q], k) for q in qrels])
            assert recall[k - 1] == pytest.approx(expected, abs=1e-12)


def _workspace(tmp_path, splits=("dev", "test")):
    runs, qrels = random_runs(4)
    qids = sorted(qrels)
    split_of = {q: splits[i % len(splits)] for i, q in enumerate(qids)}
    questions = pl.DataFrame(
        {
            "id": qids,
            "question": [f"question {q}, « citée »" for q in qids],
            "article_ids": [qrels[q] for q in qids],
            "split": [split_of[q] for q in qids],
        }
    )
    for system, run in runs.items():
        for split in splits:
            sq = [q for q in qids if split_of[q] == split and q in run]
            depth = max(len(run[q]) for q in sq)
            ids = np.full((len(sq), depth), -1, dtype=np.int64)
            for row, q in enumerate(sq):
                ranked = list(dict.fromkeys(run[q]))
                ids[row, : len(ranked)] = ranked
            scores = np.where(ids >= 0, -np.arange(depth, dtype=np.float64)[None, :], 0.0)
            write_trec(tmp_path / "runs" / system / f"{split}.trec", [str(q) for q in sq], ids, scores, system)
    return runs, qrels, questions, split_of


def test_reports_on_disk(tmp_path):
    runs, qrels, questions, split_of = _workspace(tmp_path)
    out, curve = tmp_path / "metrics" / "per_query", tmp_path / "metrics" / "recall_curve_test.csv"
    write_per_query_reports(questions, tmp_path / "runs", list(runs), ["dev", "test"], 100, out, curve)
    assert sorted(p.name for p in out.iterdir()) == ["dev.csv", "test.csv"]
    for split in ("dev", "test"):
        sub = {q: g for q, g in qrels.items() if split_of[q] == split}
        with open(out / f"{split}.csv", encoding="utf-8", newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert [int(r["id"]) for r in rows] == sorted(sub)
        for system, run in runs.items():
            means = evaluate_run({q: r for q, r in run.items() if q in sub}, sub)
            column = [float(r[f"{system}_recall@100"]) for r in rows]
            assert np.mean(column) == pytest.approx(means["recall@100"], abs=1e-6)
            assert np.mean([float(r[f"{system}_ap"]) for r in rows]) == pytest.approx(means["map"], abs=1e-6)
            assert all(r[f"{system}_first_rank"] == "" or 1 <= int(r[f"{system}_first_rank"]) <= 100 for r in rows)
        assert any(r["sys_a_first_rank"] == "" for r in rows)  # a query without a gold article in the top 100
    with open(curve, encoding="utf-8", newline="") as fh:
        lines = list(csv.reader(fh))
    assert lines[0] == ["k", "system", "recall"] and len(lines) == 1 + 2 * 100  # k = 1 … min(500, evaluate.k)
    assert [line[:2] for line in lines[1:3]] == [["1", "sys_a"], ["2", "sys_a"]]
    before = {p.name: p.read_bytes() for p in [*out.iterdir(), curve]}
    write_per_query_reports(questions, tmp_path / "runs", list(runs), ["dev", "test"], 100, out, curve)
    assert {p.name: p.read_bytes() for p in [*out.iterdir(), curve]} == before  # byte-deterministic


def test_no_test_split_gives_an_empty_curve(tmp_path, caplog):
    runs, _, questions, _ = _workspace(tmp_path, splits=("dev",))
    (tmp_path / "metrics" / "per_query").mkdir(parents=True)
    (tmp_path / "metrics" / "per_query" / "stale.csv").write_text("old\n")
    curve = tmp_path / "metrics" / "recall_curve_test.csv"
    with caplog.at_level(logging.WARNING):
        write_per_query_reports(
            questions, tmp_path / "runs", list(runs), ["dev"], 500, tmp_path / "metrics" / "per_query", curve
        )
    assert curve.read_text(encoding="utf-8") == "k,system,recall\n"
    assert [p.name for p in (tmp_path / "metrics" / "per_query").iterdir()] == ["dev.csv"]  # replaced whole
    assert any("'test' is not evaluated" in r.getMessage() for r in caplog.records)


def test_dvc_plot_draws_one_line_per_system():
    from dvc_render.vega import VegaRenderer

    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]["evaluate"]
    plots = {next(iter(p)): next(iter(p.values())) for p in stage["plots"]}
    props = plots["metrics/recall_curve_test.csv"]
    assert props["x"] == "k" and props["y"] == "recall" and props["persist"] and props["cache"] is False
    outs = {next(iter(o)): next(iter(o.values())) for o in stage["outs"]}
    assert outs["metrics/per_query"] == {"persist": True, "cache": False}
    data = [{"k": k, "system": s, "recall": k / 10, "rev": "workspace"} for s in ("bm25", "dsr") for k in (1, 2)]
    spec = VegaRenderer(
        data,
        "metrics/recall_curve_test.csv",
        template=props["template"],
        template_dir=str(ROOT / ".dvc" / "plots"),
        x="k",
        y="recall",
    ).get_filled_template()
    assert spec["encoding"]["color"]["field"] == "system"
    assert spec["encoding"]["x"]["field"] == "k" and spec["encoding"]["y"]["field"] == "recall"
    assert json.dumps(spec).count("<DVC_METRIC") == 0
