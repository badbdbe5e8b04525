"""A workspace's trained hprior and graph encoders applied to a corpus they were not trained on
(lexgraph.methods.gnn.inductive, issue 26): on the training corpus they give the saved vectors; on a
new corpus, what a hand-built graph and a hand computation give."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch
import torch.nn.functional as F

from helpers_graph import ARTICLES, HEADINGS, NEGATIVES, QUESTIONS, embeddings, graph, settings
from lexgraph.core.errors import DataError
from lexgraph.graph.build import EdgeType, GraphConfig, save_graph
from lexgraph.graph.hierarchy import HPRIOR_FORMAT
from lexgraph.methods.gnn import inductive
from lexgraph.methods.gnn import io as gnn_io
from lexgraph.methods.gnn.data import prepare_training_set
from lexgraph.methods.gnn.train import train_graph_encoder
from lexgraph.methods.hprior.system import hprior_vectors

# A new corpus: code X -> title X1 -> chapters X1a, X1b; articles 500-503 (ids unseen in training)
NEW_HEADINGS = pl.DataFrame(
    {
        "heading_id": [70, 71, 72, 73],
        "parent_id": [-1, 70, 71, 71],
        "level": [1, 2, 3, 3],
        "level_name": ["code", "title", "chapter", "chapter"],
        "label": ["Code X", "Titre 1", "Chapitre a", "Chapitre b"],
        "path": [["Code X"], ["Code X", "Titre 1"], ["Code X", "Titre 1", "a"], ["Code X", "Titre 1", "b"]],
        "text": ["Code X", "Des choses", "Du mur", "Du bail"],
    }
)
NEW_ARTICLES = pl.DataFrame(
    {
        "id": [503, 500, 501, 502],
        "article": ["d", "a", "b", "c"],
        "reference": ["Art. 4", "Art. 1", "Art. 2", "Art. 3"],
        "heading_id": [71, 72, 72, 73],
    }
)
DIM = 8


def _vec(seed: int) -> torch.Tensor:
    return torch.randn(DIM, generator=torch.Generator().manual_seed(seed))


NEW_EMBEDDINGS = {
    "articles": (np.array([500, 501, 502, 503]), torch.stack([_vec(s) for s in (1, 2, 3, 4)])),
    "headings": (np.array([70, 71, 72, 73]), torch.stack([_vec(s) for s in (5, 6, 7, 8)])),
}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A workspace with the toy graph (its build settings saved), a trained hgraph (article-mean
    heading features) and gdsr (title features), and an hprior report."""
    root = tmp_path_factory.mktemp("ws")
    config = GraphConfig(directed=True, consecutive=False, questions=True)
    save_graph(graph(), pl.DataFrame({"node_id": [0]}), root / "data" / "graph", config)
    saved = {}
    for variant, changes in (("hgraph", {}), ("gdsr", {"heading_features": "title", "normalize_features": False})):
        s = settings(variant, **changes)
        ts = prepare_training_set(graph(), QUESTIONS, NEGATIVES, embeddings(), s)
        torch.manual_seed(3)
        result = train_graph_encoder(ts, s, "cpu", seed=3, show_progress=False, select=False)
        gnn_io.save_trained(result, ts, s, root / "models" / f"gnn_{variant}")
        saved[variant] = (ts.article_ids, result.article_embeddings)
    report = {"format": HPRIOR_FORMAT, "scope": 1, "weight": 0.5, "metric": "recall@100"}
    report["grid"] = [{"scope": 1, "weight": 0.5, "recall@100": 0.5}]
    (root / "models" / "hprior").mkdir(parents=True)
    (root / "models" / "hprior" / "hprior.json").write_text(json.dumps(report), encoding="utf-8")
    return root, saved


@pytest.mark.parametrize("variant", ["hgraph", "gdsr"])
def test_on_the_training_corpus_the_saved_vectors_come_back(workspace, variant):
    root, saved = workspace
    g = inductive.corpus_graph(ARTICLES, HEADINGS, root, questions=QUESTIONS)
    ids, vectors = saved[variant]
    assert np.array_equal(g.article_ids.numpy(), ids)
    assert torch.equal(inductive.graph_vectors(variant, root, g, embeddings()), vectors)


def test_the_new_corpus_graph_is_the_statute_without_questions(workspace):
    root, _ = workspace
    g = inductive.corpus_graph(NEW_ARTICLES, NEW_HEADINGS, root)
    # nodes: articles 500..503 (0-3), then headings 70..73 (4-7); edges point down (directed)
    assert g.article_ids.tolist() == [500, 501, 502, 503] and g.heading_ids.tolist() == [70, 71, 72, 73]
    assert g.question_ids.numel() == 0 and g.num_nodes == 8
    edges = sorted(zip(g.edge_index[0].tolist(), g.edge_index[1].tolist(), g.edge_type.tolist()))
    hs, ha = int(EdgeType.HEADING_SUBHEADING), int(EdgeType.HEADING_ARTICLE)
    assert edges == sorted([(4, 5, hs), (5, 6, hs), (5, 7, hs), (6, 0, ha), (6, 1, ha), (7, 2, ha), (5, 3, ha)])


@pytest.mark.parametrize("variant", ["hgraph", "gdsr"])
def test_on_a_new_corpus_the_encoder_runs_over_a_hand_built_graph(workspace, variant):
    root, _ = workspace
    g = inductive.corpus_graph(NEW_ARTICLES, NEW_HEADINGS, root)
    got = inductive.graph_vectors(variant, root, g, NEW_EMBEDDINGS)
    a = NEW_EMBEDDINGS["articles"][1]
    if variant == "hgraph":  # unit article vectors; a heading is the mean of the unit articles under it
        u = F.normalize(a, dim=-1)
        heads = torch.stack([u.mean(0), u.mean(0), u[[0, 1]].mean(0), u[[2]].mean(0)])
        x = torch.cat([u, heads])
    else:  # the vectors as they are, headings by their own (title) vectors
        x = torch.cat([a, NEW_EMBEDDINGS["headings"][1]])
    src = [4, 5, 5, 6, 6, 7, 5]
    dst = [5, 6, 7, 0, 1, 2, 3]
    types = [EdgeType.HEADING_SUBHEADING] * 3 + [EdgeType.HEADING_ARTICLE] * 4
    model = gnn_io.load_graph_encoder(root / "models" / f"gnn_{variant}")
    with torch.no_grad():
        want = model(x, torch.tensor([src, dst]), torch.tensor([int(t) for t in types]))[:4]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_hprior_on_a_new_corpus_is_the_hand_computation(workspace):
    root, _ = workspace
    g = inductive.corpus_graph(NEW_ARTICLES, NEW_HEADINGS, root)
    ids, vectors = NEW_EMBEDDINGS["articles"]
    order = [3, 0, 1, 2]  # rows given in another order than the graph's
    got = hprior_vectors(root, g, ids[order], vectors[order])
    u = F.normalize(vectors, dim=-1)  # rows 500..503
    # scope 1: the heading one level above each article's deepest one: title 71 for 500-502, code 70
    # for 503 (it hangs under 71 itself); both subtrees hold the four articles: the same mean
    want = u + 0.5 * u.mean(0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_gnn_json_without_its_settings_is_one_line(workspace, tmp_path):
    root, _ = workspace
    import shutil

    copy = tmp_path / "ws"
    shutil.copytree(root, copy)
    (copy / "models" / "gnn_hgraph" / "gnn.json").write_text(json.dumps({"similarity": "cosine"}), encoding="utf-8")
    with pytest.raises(DataError) as err:
        inductive.graph_vectors(
            "hgraph", copy, inductive.corpus_graph(NEW_ARTICLES, NEW_HEADINGS, copy), NEW_EMBEDDINGS
        )
    assert "gnn.json" in str(err.value) and "'settings'" in str(err.value) and "\n" not in str(err.value)
