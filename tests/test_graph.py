"""The legislative graph (lexgraph.graph.build, stages/build_graph.py): exact nodes and edges."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import torch

from conftest import load_benchmark, write_params
from helpers_config import sample_config
from helpers_graph import ARTICLES, HEADINGS, QUESTIONS
from lexgraph.core.errors import DataError
from lexgraph.graph.build import (
    EdgeType,
    GraphConfig,
    NodeType,
    build_graph,
    graph_bytes,
    graph_stats,
    load_graph,
    restrict_graph,
)

ROOT = Path(__file__).resolve().parents[1]

# node ids: articles 10,11,12,13,20,21,30 -> 0..6; headings 0..4 -> 7..11; train questions 1,2,6 -> 12..14
H = {h: 7 + h for h in range(5)}
A = {10: 0, 11: 1, 12: 2, 13: 3, 20: 4, 21: 5, 30: 6}
Q = {1: 12, 2: 13, 6: 14}

FORWARD = [
    (0, H[0], H[1]),
    (0, H[1], H[2]),
    (0, H[1], H[3]),
    (1, H[1], A[13]),
    (1, H[2], A[10]),
    (1, H[2], A[11]),
    (1, H[3], A[12]),
    (1, H[4], A[20]),
    (1, H[4], A[21]),
    (2, Q[1], A[10]),
    (2, Q[1], A[12]),
    (2, Q[2], A[20]),
    (2, Q[6], A[10]),
]
CONSECUTIVE = [(3, A[10], A[11]), (3, A[20], A[21])]


def edges(data) -> list[tuple[int, int, int]]:
    return [(int(t), int(s), int(d)) for t, (s, d) in zip(data.edge_type, data.edge_index.T)]


def reverse(forward):
    return [(t + 4, d, s) for t, s, d in forward]


def question_reverse(forward):
    """The reverse of the question-article edges only: they go both ways even when directed."""
    return reverse([e for e in forward if e[0] == EdgeType.QUESTION_ARTICLE])


def build(**config):
    return build_graph(ARTICLES, HEADINGS, QUESTIONS, sample_config(GraphConfig, "graph", **config))


def test_nodes_exact():
    data, nodes = build()
    assert nodes["node_id"].to_list() == list(range(15))
    assert nodes["type"].to_list() == ["article"] * 7 + ["heading"] * 5 + ["question"] * 3
    assert nodes["source_id"].to_list() == [10, 11, 12, 13, 20, 21, 30, 0, 1, 2, 3, 4, 1, 2, 6]
    assert nodes["text"].to_list()[:7] == [f"texte {i}" for i in (10, 11, 12, 13, 20, 21, 30)]
    assert nodes["text"].to_list()[7:] == ["Code A", "Des biens", "Du mur", "Du bornage", "Code B", "q1", "q2", "q6"]
    assert data.node_type.tolist() == [0] * 7 + [1] * 5 + [2] * 3
    assert data.article_ids.tolist() == [10, 11, 12, 13, 20, 21, 30]
    assert data.heading_ids.tolist() == [0, 1, 2, 3, 4]
    assert data.question_ids.tolist() == [1, 2, 6]
    assert data.num_nodes == 15


def test_edges_directed_exact():
    data, _ = build(directed=True)
    # the hierarchy points down only; question <-> article edges keep both directions
    assert edges(data) == sorted(FORWARD + question_reverse(FORWARD))
    assert not any(t in (EdgeType.SUBHEADING_HEADING, EdgeType.ARTICLE_HEADING) for t, _, _ in edges(data))
    assert sample_config(GraphConfig, "graph").directed is True and edges(build()[0]) == edges(
        data
    )  # directed in params.yaml


def test_edges_undirected_exact():
    data, _ = build(directed=False)
    assert edges(data) == sorted(FORWARD + reverse(FORWARD))


def test_edges_consecutive_exact():
    data, _ = build(directed=False, consecutive=True)
    forward = FORWARD + CONSECUTIVE
    assert edges(data) == sorted(forward + reverse(forward))


def test_without_questions():
    data, nodes = build(questions=False)  # directed (the default): no reverse edge at all
    forward = [e for e in FORWARD if e[0] != EdgeType.QUESTION_ARTICLE]
    assert edges(data) == sorted(forward)
    assert data.num_nodes == 12 and "question" not in nodes["type"].to_list()
    undirected, _ = build(questions=False, directed=False)
    assert edges(undirected) == sorted(forward + reverse(forward))


def test_only_train_questions_become_nodes():
    """The leak test: dev/test/synthetic question ids appear nowhere in the graph."""
    data, nodes = build(directed=False, consecutive=True)
    q_nodes = nodes.filter(pl.col("type") == "question")
    assert q_nodes["source_id"].to_list() == [1, 2, 6]
    assert not {"q3 dev", "q4 test", "q5 synthetic"} & set(nodes["text"].to_list())
    # their gold articles (11, 21, 13) get no question edge
    q_edges = [e for e in edges(data) if e[0] in (EdgeType.QUESTION_ARTICLE, EdgeType.ARTICLE_QUESTION)]
    touched = {n for _, s, d in q_edges for n in (s, d)}
    assert not touched & {A[11], A[21], A[13]}
    assert set(data.question_ids.tolist()) == {1, 2, 6}


def test_stats_and_restrict():
    data, _ = build(directed=False, consecutive=True)
    stats = graph_stats(data)
    assert stats["nodes"] == {"article": 7, "heading": 5, "question": 3, "total": 15}
    assert stats["edges"]["heading_article"] == 6 and stats["edges"]["article_heading"] == 6
    assert stats["edges"]["question_article"] == 4 and stats["edges"]["next_article"] == 2
    assert stats["edges"]["total"] == 2 * (len(FORWARD) + len(CONSECUTIVE))
    directed = graph_stats(build(directed=True, consecutive=True)[0])["edges"]
    assert directed["heading_article"] == 6 and directed["article_heading"] == 0
    assert directed["question_article"] == 4 and directed["article_question"] == 4
    assert directed["article_next"] == 2 and directed["next_article"] == 0
    assert directed["total"] == len(FORWARD) + len(CONSECUTIVE) + 4

    no_q = restrict_graph(data, questions=False)
    full_no_q, _ = build(directed=False, consecutive=True, questions=False)
    assert edges(no_q) == edges(full_no_q) and no_q.num_nodes == 12

    no_h = restrict_graph(data, headings=False, consecutive=False)
    # articles keep 0..6, questions move to 7..9; only question edges remain
    expected = [(2, Q[q] - 5, A[a]) for q, a in ((1, 10), (1, 12), (2, 20), (6, 10))]
    assert sorted(edges(no_h)) == sorted(expected + reverse(expected))
    assert no_h.node_type.tolist() == [NodeType.ARTICLE] * 7 + [NodeType.QUESTION] * 3


def test_bad_references_raise():
    bad = ARTICLES.with_columns(
        pl.when(pl.col("id") == 10).then(99).otherwise(pl.col("heading_id")).alias("heading_id")
    )
    with pytest.raises(DataError, match="article 10 refers to unknown heading_id 99"):
        build_graph(bad, HEADINGS, QUESTIONS, sample_config(GraphConfig, "graph"))
    bad_h = HEADINGS.with_columns(
        pl.when(pl.col("heading_id") == 2).then(7).otherwise(pl.col("parent_id")).alias("parent_id")
    )
    with pytest.raises(DataError, match="heading 2 refers to unknown parent heading_id 7"):
        build_graph(ARTICLES, bad_h, QUESTIONS, sample_config(GraphConfig, "graph"))
    bad_q = QUESTIONS.with_columns(
        pl.when(pl.col("id") == 1).then(pl.lit([999])).otherwise(pl.col("article_ids")).alias("article_ids")
    )
    with pytest.raises(DataError, match="question 1 cites unknown article id 999"):
        build_graph(ARTICLES, HEADINGS, bad_q, sample_config(GraphConfig, "graph"))
    # an unknown article cited by a *test* question is not the graph's business
    ok_q = QUESTIONS.with_columns(
        pl.when(pl.col("id") == 4).then(pl.lit([999])).otherwise(pl.col("article_ids")).alias("article_ids")
    )
    build_graph(ARTICLES, HEADINGS, ok_q, sample_config(GraphConfig, "graph"))


def test_stage_writes_deterministic_outputs(tmp_path, monkeypatch):
    stage = load_benchmark("build_graph", folder="stages")

    for name, df in (("articles", ARTICLES), ("headings", HEADINGS), ("questions", QUESTIONS)):
        df.write_parquet(tmp_path / f"{name}.parquet")
    write_params(
        tmp_path / "params.yaml", base={"seed": 1}, graph={"directed": False, "consecutive": True, "questions": True}
    )
    outs = []
    for run in ("a", "b"):
        argv = ["--params", str(tmp_path / "params.yaml")]
        for name in ("articles", "headings", "questions"):
            argv += [f"--{name}", str(tmp_path / f"{name}.parquet")]
        argv += ["--out", str(tmp_path / run), "--metrics", str(tmp_path / f"{run}.json")]
        from lexgraph.core.stage import run_stage

        assert run_stage(stage.STAGE, argv) == 0
        outs.append([(tmp_path / run / f).read_bytes() for f in ("graph.pt", "nodes.parquet")])
    assert outs[0] == outs[1]
    loaded = load_graph(tmp_path / "a")
    data, _ = build(directed=False, consecutive=True)
    assert edges(loaded) == edges(data) and torch.equal(loaded.node_type, data.node_type)
    assert torch.load(tmp_path / "a" / "graph.pt", weights_only=True)["config"]["consecutive"] is True
    assert json.loads((tmp_path / "a.json").read_text())["nodes"]["total"] == 15
    assert graph_bytes(data) == graph_bytes(loaded)
