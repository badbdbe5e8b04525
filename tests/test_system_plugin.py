"""Adding a system is one module (issue 42, "one system, one place"): ``tests/toy_system.py``
declares ``centred`` and is registered under the ``lexgraph.systems`` entry points of a
distribution of its own, with no edit anywhere in lexgraph. ``lexgraph systems`` lists it,
``lexgraph search``, the ``evaluate`` stage's code, ``lexgraph export``, ``lexgraph serve`` and
``lexgraph index`` find it, and each gives what a brute-force cosine over DSR's centred article
vectors gives."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch

from helpers_workspace import build_tiny_workspace, random_texts
from lexgraph.cli.main import main

QUESTIONS = ["le bail du contrat", "divorce et enfant", "la loi du mariage"]
K = 5


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """A distribution on sys.path whose entry point ``centred = toy_system:SYSTEM`` declares the system."""
    import sys

    from lexgraph.methods import catalog

    site = tmp_path_factory.mktemp("site")
    info = site / "toy_lexgraph_system-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-lexgraph-system\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[lexgraph.systems]\ncentred = toy_system:SYSTEM\n")
    sys.path.insert(0, str(site))
    catalog.systems.cache_clear()
    yield
    sys.path.remove(str(site))
    catalog.systems.cache_clear()


@pytest.fixture(scope="module")
def ws(registered, tiny_model_dir, tmp_path_factory):
    import toy_system

    root = build_tiny_workspace(tmp_path_factory.mktemp("plugin_ws"), tiny_model_dir)
    toy_system.build(root)  # its own stage
    return root


def brute_force(workspace, questions, article_vectors, ids, k=K):
    """The top ``k`` ids by cosine of DSR's question vectors with ``article_vectors`` centred (ties: lower id)."""
    from lexgraph.models.dsr import DSR

    queries = DSR.load(workspace / "models" / "dsr", with_article_backbone=False).encode_queries(questions)
    centred = article_vectors - article_vectors.mean(dim=0, keepdim=True)  # written here, not imported
    scores = (torch.nn.functional.normalize(queries, dim=-1) @ torch.nn.functional.normalize(centred, dim=-1).T).numpy()
    order = np.lexsort((np.broadcast_to(ids, scores.shape), -scores), axis=1)[:, :k]
    return ids[order], np.take_along_axis(scores, order, axis=1)


def workspace_reference(workspace):
    from lexgraph.encoding.embed import load_embeddings

    ids, vectors = load_embeddings(workspace / "data" / "embed" / "articles.safetensors")
    return brute_force(workspace, QUESTIONS, vectors, ids)


def test_lexgraph_systems_lists_it(ws, capsys):
    assert main(["systems"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("centred ")]
    assert line.split()[1:3] == ["dense", "centred"]


def test_search_finds_it_and_ranks_by_its_own_vectors(ws, capsys):
    want_ids, want_scores = workspace_reference(ws)
    for question, ids, scores in zip(QUESTIONS, want_ids, want_scores):
        capsys.readouterr()
        args = ["search", "--workspace", str(ws), "--system", "centred", "--json", "--top", str(K), question]
        assert main(args) == 0
        hits = json.loads(capsys.readouterr().out)["hits"]
        assert [int(h["id"]) for h in hits] == ids.tolist()
        np.testing.assert_allclose([h["score"] for h in hits], scores, atol=1e-5)


def test_evaluate_takes_it_in_its_settings_and_scores_its_run(ws, tmp_path):
    import polars as pl

    from lexgraph.core.config import load_params
    from lexgraph.core.errors import ConfigError
    from lexgraph.evaluation.evaluate import EvaluateConfig, evaluate_systems

    section = {**load_params("evaluate", ws / "params.yaml")[1], "systems": ["bm25", "centred"], "baselines": ["bm25"]}
    assert EvaluateConfig.from_params(section).systems == ["bm25", "centred"]
    with pytest.raises(ConfigError, match=r"'evaluate.systems' = \['bm25', 'centered'\], expected .* centred"):
        EvaluateConfig.from_params({**section, "systems": ["bm25", "centered"]})
    want_ids, _ = workspace_reference(ws)
    gold = [
        [int(want_ids[0][0])],
        [int(want_ids[1][3]), 10**6],
        [10**6],
    ]  # found at 1, found at 4 of 2, missed (a run of depth 5)
    questions = pl.DataFrame(
        {"id": [1, 2, 3], "question": QUESTIONS, "article_ids": gold, "split": ["test"] * 3},
        schema={"id": pl.Int64, "question": pl.Utf8, "article_ids": pl.List(pl.Int64), "split": pl.Utf8},
    )
    metrics = evaluate_systems(["centred"], questions, ["test"], K, tmp_path / "runs", ws, "cpu")
    assert metrics["centred"]["test"]["recall@10"] == pytest.approx((1 + 0.5 + 0) / 3, abs=1e-4)
    run = (tmp_path / "runs" / "centred" / "test.trec").read_text().splitlines()
    assert [line.split()[2] for line in run if line.startswith("1 ")] == [str(i) for i in want_ids[0]]


def test_export_writes_its_query_encoder_and_vectors_and_its_article_side_refuses(ws, tmp_path):
    from safetensors.numpy import load_file

    from lexgraph.encoding.embed import load_embeddings
    from lexgraph.systems.export import export_system

    out = export_system("centred", ws, tmp_path / "export")
    saved = load_file(str(out / "article_vectors.safetensors"))
    ids, vectors = load_embeddings(ws / "data" / "embed" / "articles.safetensors")
    centred = torch.nn.functional.normalize(vectors - vectors.mean(dim=0, keepdim=True), dim=-1).numpy()
    order = np.argsort(ids)
    np.testing.assert_array_equal(saved["ids"], ids[order])
    np.testing.assert_allclose(saved["vectors"], centred[order], atol=1e-6)
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "DSR's article vectors, centred on the corpus mean" in card and "encode_document` refuses" in card
    assert json.loads((out / "lexgraph_export.json").read_text())["system"] == "centred"


def test_serve_serves_it_as_search_does(ws, capsys):
    from helpers_serve import RunningServer, set_serve

    set_serve(ws, systems=["centred", "bm25"])
    want_ids, _ = workspace_reference(ws)
    with RunningServer(ws) as server:
        for question, ids in zip(QUESTIONS, want_ids):
            response = httpx.get(f"{server.url}/search", params={"q": question, "system": "centred", "k": K})
            assert response.status_code == 200, response.text
            assert [int(h["id"]) for h in response.json()["hits"]] == ids.tolist()


def test_index_builds_its_side_and_searches_the_new_corpus(ws, tmp_path):
    from lexgraph.models.dsr import DSR
    from lexgraph.systems.corpus_index import index_corpus
    from lexgraph.systems.registry import load_retriever

    texts = random_texts(17, 3)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": f"c{i}", "text": t, "path": ["Code"]}) + "\n" for i, t in enumerate(texts))
    )
    record = index_corpus(corpus, tmp_path / "idx", ws, ["centred"], "cpu")
    assert list(record["systems"]) == ["centred"] and list(record["systems"]["centred"]) == ["models/dsr"]
    assert "models/centred/article_embeddings.safetensors" in record["files"]
    articles = DSR.load(ws / "models" / "dsr").encode_articles(texts)  # the new corpus, from its texts
    want_ids, want_scores = brute_force(ws, QUESTIONS, articles, np.arange(len(texts)))
    got_ids, got_scores = load_retriever("centred", ws, "cpu", corpus=tmp_path / "idx").search(QUESTIONS, K)
    np.testing.assert_allclose(got_scores, want_scores, atol=1e-5)
    assert (got_ids == want_ids).mean() > 0.9  # near-ties may swap


@pytest.mark.parametrize(
    "declaration",
    [
        'System(name="bare", summary="s", load=print, reads=())',  # no kind: not a class of one
        'DenseSystem(name="old", kind="dense", summary="s", load=print, reads=())',  # kind was a field before
    ],
)
def test_a_declaration_not_in_the_class_of_its_kind_is_one_line(tmp_path, monkeypatch, declaration):
    """A plugin that declares a bare System, or passes ``kind=`` as before issue 42's kinds, is refused
    in one line naming its entry point and what was expected, not a traceback later."""
    import sys

    from lexgraph.core.errors import LexgraphError
    from lexgraph.methods import catalog

    info = tmp_path / "bad_lexgraph_system-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bad-lexgraph-system\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[lexgraph.systems]\nbad = bad_system:SYSTEM\n")
    (tmp_path / "bad_system.py").write_text(
        f"from lexgraph.methods.system import DenseSystem, System\n\nSYSTEM = {declaration}\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "bad_system", raising=False)
    catalog.systems.cache_clear()
    try:
        with pytest.raises(LexgraphError) as caught:
            catalog.systems()
    finally:
        catalog.systems.cache_clear()
    message = str(caught.value)
    assert "\n" not in message and "entry point 'bad = bad_system:SYSTEM'" in message and "does not load" in message
