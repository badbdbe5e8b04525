"""TREC run files, metric rounding and the Markdown results table."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import replace_loader
from lexgraph.core.errors import DataError
from lexgraph.evaluation.evaluate import results_markdown, results_table, round_metrics
from lexgraph.evaluation.trec import read_trec, write_trec


def test_trec_round_trip(tmp_path):
    ids = np.array([[5, 3, 9], [7, 1, -1]], dtype=np.int64)
    scores = np.array([[2.5, 1.25, -0.3333333], [10.0, 9.5, 0.0]], dtype=np.float32)
    path = tmp_path / "runs" / "test.trec"
    write_trec(path, [101, 202], ids, scores, "bm25")
    text = path.read_text(encoding="utf-8")
    assert text == (
        "101 Q0 5 1 2.500000 bm25\n"
        "101 Q0 3 2 1.250000 bm25\n"
        "101 Q0 9 3 -0.333333 bm25\n"
        "202 Q0 7 1 10.000000 bm25\n"
        "202 Q0 1 2 9.500000 bm25\n"
    )
    assert read_trec(path) == {101: [5, 3, 9], 202: [7, 1]}
    assert read_trec(path, qid_type=str) == {"101": [5, 3, 9], "202": [7, 1]}
    # byte-deterministic, and no temporary left behind
    write_trec(path, [101, 202], ids, scores, "bm25")
    assert path.read_text(encoding="utf-8") == text
    assert [p.name for p in path.parent.iterdir()] == ["test.trec"]


def test_read_trec_orders_by_rank(tmp_path):
    path = tmp_path / "run.trec"
    path.write_text("1 Q0 30 3 0.1 x\n1 Q0 10 1 0.9 x\n\n2 Q0 4 1 1 x\n1 Q0 20 2 0.5 x\n", encoding="utf-8")
    assert read_trec(path) == {1: [10, 20, 30], 2: [4]}


@pytest.mark.parametrize(
    ("content", "row", "match"),
    [
        ("1 Q0 5 1 0.5 t\n1 Q0 6 2 0.4\n", 2, "6 fields"),
        ("1 Q0 abc 1 0.5 t\n", 1, "integers"),
        ("1 Q0 5 1 0.5 t\n1 Q0 6 two 0.4 t\n", 2, "integers"),
        ("1 Q0 5 1 high t\n", 1, "number"),
        ("q1 Q0 5 1 0.5 t\n", 1, "query id"),
        ("1 Q0 5 1 0.5 t\n1 Q0 5 2 0.4 t\n", 2, "twice"),
    ],
)
def test_read_trec_malformed(tmp_path, content, row, match):
    path = tmp_path / "bad.trec"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=match) as info:
        read_trec(path)
    assert info.value.row == row
    assert str(path) in str(info.value)


def test_read_trec_missing_file(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_trec(tmp_path / "nope.trec")


def test_write_trec_rejects_bad_input(tmp_path):
    path = tmp_path / "x.trec"
    with pytest.raises(ValueError):
        write_trec(path, [1], np.array([[1, 2]]), np.array([[1.0]]), "t")
    with pytest.raises(ValueError):
        write_trec(path, [1, 2], np.array([[1, 2]]), np.array([[1.0, 0.5]]), "t")
    with pytest.raises(ValueError):
        write_trec(path, [1], np.array([[1, 2]]), np.array([[1.0, 0.5]]), "two words")
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_round_metrics():
    assert round_metrics({"map": 0.123456, "n": 3, "test": {"recall@10": np.float64(0.99995)}}) == {
        "map": 0.1235,
        "n": 3,
        "test": {"recall@10": 1.0},
    }


def test_reported_values_round_as_python_floats():
    """``rounded`` / ``rounded_all`` (every stage's ``round(float(v), 4)``): a numpy scalar is
    rounded as the Python float it is (numpy's own ``round`` gives 0.9098 for 0.90975, whose
    binary value lies below the half), ints become floats, keys keep their order."""
    from lexgraph.metrics.ir import rounded, rounded_all

    for value in (0.90975, 0.32005, 0.66025, 0.123456, 2, -0.5, float(np.float32(0.1))):
        for v in (value, np.float64(value), np.float32(value)):
            assert rounded(v) == round(float(v), 4) and type(rounded(v)) is float
    assert rounded(np.float64(0.90975)) == 0.9097 != round(np.float64(0.90975), 4)
    assert rounded(0.123456, 2) == 0.12
    got = rounded_all({"map": np.float64(0.32005), "n": 3, "a": 0.123456})
    assert got == {"map": 0.3201, "n": 3.0, "a": 0.1235} and list(got) == ["map", "n", "a"]
    assert all(type(v) is float for v in got.values())


METRICS_BY_SYSTEM = {
    "bm25": {
        "test": {
            "recall@10": 0.3,
            "recall@100": 0.41249,
            "recall@200": 0.5,
            "recall@500": 0.6125,
            "map": 0.1,
            "r_precision": 0.08,
            "mrr@10": 0.2,
            "ndcg@10": 0.25,
        },
        "dev": {
            "recall@10": 0.35,
            "recall@100": 0.45,
            "recall@200": 0.55,
            "recall@500": 0.65,
            "map": 0.15,
            "r_precision": 0.1,
            "mrr@10": 0.25,
            "ndcg@10": 0.3,
        },
    },
    "dsr": {
        "test": {
            "recall@10": 0.5,
            "recall@100": 0.8,
            "recall@200": 0.85,
            "recall@500": 0.9,
            "map": 0.33333,
            "r_precision": 0.3,
            "mrr@10": 0.4,
            "ndcg@10": 1.0,
        },
    },
}


def test_results_table():
    expected = (
        "Table: retrieval results on the test split (222 questions), in %.\n"
        "\n"
        "| System | R@100 | R@200 | R@500 | mAP | mRP | R@10 | nDCG@10 |\n"
        "|:---|---:|---:|---:|---:|---:|---:|---:|\n"
        "| bm25 | 41.2 | 50.0 | 61.3 | 10.0 | 8.0 | 30.0 | 25.0 |\n"
        "| dsr | 80.0 | 85.0 | 90.0 | 33.3 | 30.0 | 50.0 | 100.0 |\n"
    )
    assert results_table(METRICS_BY_SYSTEM, "test", n_questions=222) == expected
    assert results_table(METRICS_BY_SYSTEM).startswith("Table: retrieval results on the test split, in %.\n")


def test_results_markdown():
    text = results_markdown(METRICS_BY_SYSTEM, ["dev", "test"], {"test": 222})
    assert text == (
        "# Retrieval results\n"
        "\n"
        "## dev split\n"
        "\n"
        "Table: retrieval results on the dev split, in %.\n"
        "\n"
        "| System | R@100 | R@200 | R@500 | mAP | mRP | R@10 | nDCG@10 |\n"
        "|:---|---:|---:|---:|---:|---:|---:|---:|\n"
        "| bm25 | 45.0 | 55.0 | 65.0 | 15.0 | 10.0 | 35.0 | 30.0 |\n"
        "| dsr | – | – | – | – | – | – | – |\n"
        "\n"
        "## test split\n"
        "\n" + results_table(METRICS_BY_SYSTEM, "test", n_questions=222)
    )


def test_evaluate_systems_shares_a_query_encoder_between_systems(tmp_path, tiny_model_dir, monkeypatch):
    """Systems with one query-encoder directory (dsr, hprior, gdsr, hybrid's dense half)
    load it once and encode each split once; their runs are those of separate encoders."""
    import polars as pl
    import torch

    from lexgraph.evaluation.evaluate import evaluate_systems
    from lexgraph.methods.dense import DenseRetriever, load_query_encoder
    from lexgraph.models.encoders import QueryEncoder

    directory = tmp_path / "query_encoder"
    QueryEncoder.from_pretrained(tiny_model_dir, token_pooling="mean").save_pretrained(directory)
    ids, emb = np.arange(1, 9), torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    for name, scale in (("dsr", 1.0), ("gdsr", -1.0)):
        replace_loader(
            monkeypatch,
            name,
            lambda ws, device, s=scale, n=name: DenseRetriever(load_query_encoder(directory), ids, emb * s, name=n),
        )
    questions = pl.DataFrame(
        {
            "id": [1, 2, 3],
            "question": ["le bail", "la loi", "divorce"],
            "article_ids": [[1], [2, 3], [8]],
            "split": ["dev", "dev", "test"],
        }
    )
    separate = {}
    for name in ("dsr", "gdsr"):
        separate |= evaluate_systems([name], questions, ["dev", "test"], 500, tmp_path / "alone", tmp_path, "cpu")
    loads, encodes = [], []
    load, encode = QueryEncoder.from_pretrained.__func__, QueryEncoder.encode
    monkeypatch.setattr(
        QueryEncoder, "from_pretrained", classmethod(lambda cls, *a, **kw: loads.append(a) or load(cls, *a, **kw))
    )
    monkeypatch.setattr(
        QueryEncoder, "encode", lambda self, texts, **kw: encodes.append(list(texts)) or encode(self, texts, **kw)
    )
    shared = evaluate_systems(["dsr", "gdsr"], questions, ["dev", "test"], 500, tmp_path / "shared", tmp_path, "cpu")
    assert len(loads) == 1 and encodes == [["le bail", "la loi"], ["divorce"]]
    assert shared == separate
    for name in ("dsr", "gdsr"):
        for split in ("dev", "test"):
            assert (tmp_path / "shared" / name / f"{split}.trec").read_bytes() == (
                tmp_path / "alone" / name / f"{split}.trec"
            ).read_bytes()
