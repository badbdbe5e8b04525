"""The statute hierarchy: the sample's level mapping, the hierarchy prior (hand-computed), the
graph encoders' starting point, and QABISAR's teacher neighbourhood (exact node and edge lists)."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch
import torch.nn.functional as F

from lexgraph.data.sample import build_sample, heading_value, map_levels
from lexgraph.graph.build import EdgeType, GraphConfig, build_graph
from lexgraph.graph.hierarchy import best_weight, hierarchy_prior, subtree_means
from lexgraph.methods.gnn.data import batch_subgraph
from lexgraph.methods.gnn.model import GraphEncoder, GraphEncoderConfig

# ---------------------------------------------------------------------------
# The sample builder
# ---------------------------------------------------------------------------


def test_six_levels_fill_the_six_columns_in_order():
    labels = ["Livre III", "Titre III", "Chapitre IV", "Section 4", "Sous-section 1", "Paragraphe 2"]
    assert map_levels(labels) == [
        ("book", [0]),
        ("part", [1]),
        ("act", [2]),
        ("chapter", [3]),
        ("section", [4]),
        ("subsection", [5]),
    ]


def test_levels_take_their_preferred_column_and_leave_the_others_empty():
    assert map_levels(["Livre II", "Titre II", "Chapitre II", "Section 1"]) == [
        ("book", [0]),
        ("act", [1]),
        ("chapter", [2]),
        ("section", [3]),
    ]
    # a missing Livre (the Titre préliminaire) and a Sous-titre pushed down by its Chapitre
    assert map_levels(["Titre préliminaire"]) == [("act", [0])]
    assert map_levels(["Livre III", "Titre XX", "Sous-Titre Ier", "Chapitre II"]) == [
        ("book", [0]),
        ("act", [1]),
        ("chapter", [2]),
        ("section", [3]),
    ]


def test_paths_deeper_than_the_columns_fold_into_the_last():
    labels = ["Livre I", "Partie 1", "Titre I", "Chapitre I", "Section 1", "Sous-section 1", "Paragraphe 1", "Alinéa a"]
    assert map_levels(labels) == [
        ("book", [0]),
        ("part", [1]),
        ("act", [2]),
        ("chapter", [3]),
        ("section", [4]),
        ("subsection", [5, 6, 7]),
    ]


def test_build_sample_writes_a_six_level_path_and_an_untitled_heading(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    path = ["Livre III", "Titre III", "Chapitre IV", "Section 4", "Sous-section 1", "Paragraphe 2"]
    headings = {"/".join(path[: i + 1]): f"Titre {i}" for i in range(6)}
    headings["Livre III/Titre III/Chapitre IV"] = ""  # the source knows only the label
    (src / "headings.json").write_text(json.dumps(headings), encoding="utf-8")
    (src / "articles.jsonl").write_text(
        json.dumps({"id": 7, "number": "1214", "path": path, "text": "Texte."}) + "\n", encoding="utf-8"
    )
    (src / "questions.jsonl").write_text(
        json.dumps({"id": 1, "question": "Q ?", "split": "train", "article_ids": [7]}) + "\n", encoding="utf-8"
    )
    build_sample(src, tmp_path / "out")
    row = pl.read_csv(tmp_path / "out/articles.csv").row(0, named=True)
    assert [row[c] for c in ("book", "part", "act", "chapter", "section", "subsection")] == [
        "Livre III : Titre 0",
        "Titre III : Titre 1",
        "Chapitre IV",
        "Section 4 : Titre 3",
        "Sous-section 1 : Titre 4",
        "Paragraphe 2 : Titre 5",
    ]
    assert row["law_type"] is None and row["code"] == "Code civil"
    assert (
        row["reference"] == "Art. 1214, Code civil (Livre III, Titre III, Chapitre IV, Section 4, Sous-section 1, "
        "Paragraphe 2)"
    )
    assert heading_value("Chapitre IV", "") == "Chapitre IV"


# ---------------------------------------------------------------------------
# A 6-article toy hierarchy
#
#   R (heading 0) ── H1 (1) ── H3 (3): a1 (1, 0), a2 (0, 1)
#    │               └ a3 (1, 0)
#    ├── H2 (2): a4 (0, 1), a5 (1, 0)
#    └ a6 (0, 1)
# Nodes: articles 1..6 -> 0..5, headings 0..3 -> 6..9, train questions 100, 101 -> 10, 11.
# ---------------------------------------------------------------------------

VECTORS = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])  # unit already


def toy_graph(directed: bool = True, questions: bool = False):
    articles = pl.DataFrame({"id": [1, 2, 3, 4, 5, 6], "article": ["t"] * 6, "heading_id": [3, 3, 1, 2, 2, 0]})
    headings = pl.DataFrame(
        {
            "heading_id": [0, 1, 2, 3],
            "parent_id": [-1, 0, 0, 1],
            "label": ["R", "H1", "H2", "H3"],
            "text": ["R", "H1", "H2", "H3"],
        }
    )
    qs = pl.DataFrame(
        {"id": [100, 101], "question": ["q", "r"], "article_ids": [[1, 2], [2, 4]], "split": ["train", "train"]}
    )
    data, _ = build_graph(
        articles, headings, qs, GraphConfig(directed=directed, consecutive=False, questions=questions)
    )
    return data


def test_subtree_means_by_hand():
    expected = torch.tensor(
        [
            [0.5, 0.5],  # R: all six
            [2 / 3, 1 / 3],  # H1: a3, a1, a2
            [0.5, 0.5],  # H2: a4, a5
            [0.5, 0.5],
        ]
    )  # H3: a1, a2
    assert torch.allclose(subtree_means(toy_graph(), VECTORS), expected)


@pytest.mark.parametrize("directed", [True, False])
def test_hierarchy_prior_equals_the_hand_computed_propagation(directed):
    graph = toy_graph(directed)
    # scope 0: u_a + w * mean of the deepest heading's subtree
    w = 2.0
    expected = VECTORS + w * torch.tensor([[0.5, 0.5], [0.5, 0.5], [2 / 3, 1 / 3], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    assert torch.allclose(hierarchy_prior(graph, VECTORS, w, 0), expected)
    # scope 1: one level up (H3 -> H1, H1 -> R, H2 -> R; R has no parent and stays)
    expected = VECTORS + w * torch.tensor(
        [[2 / 3, 1 / 3], [2 / 3, 1 / 3], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]
    )
    assert torch.allclose(hierarchy_prior(graph, VECTORS, w, 1), expected)
    # the vectors are normalised first; weight 0 is DSR itself
    assert torch.allclose(hierarchy_prior(graph, 3 * VECTORS, w, 1), expected)
    assert torch.equal(hierarchy_prior(graph, VECTORS, 0.0, 0), VECTORS)


def test_best_weight_reads_the_deepest_scope_of_the_dev_grid():
    report = {
        "metric": "recall@100",
        "grid": [
            {"scope": 0, "weight": 0.0, "recall@100": 0.70},
            {"scope": 0, "weight": 1.0, "recall@100": 0.80},
            {"scope": 0, "weight": 2.0, "recall@100": 0.80},
            {"scope": 1, "weight": 1.0, "recall@100": 0.90},
        ],
    }
    assert best_weight(report) == 1.0  # the first best at scope 0; scope 1 is not what the GNN can start as
    report["grid"][1]["recall@100"] = report["grid"][2]["recall@100"] = 0.6
    assert best_weight(report) == 0.0  # dev prefers DSR: the encoder starts as the identity


# ---------------------------------------------------------------------------
# The untrained graph encoder is the prior
# ---------------------------------------------------------------------------


def features(graph) -> torch.Tensor:
    """What train_gnn feeds the encoder: unit article vectors, then the heading means."""
    return torch.cat([F.normalize(VECTORS, dim=-1), subtree_means(graph, VECTORS)])  # (10, 2)


@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("directed", [True, False])
@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("model", ["gatv2", "gat"])
def test_the_untrained_encoder_is_the_hierarchy_prior(layers, directed, concat, model):
    torch.manual_seed(0)
    graph = toy_graph(directed)
    x = features(graph)
    config = GraphEncoderConfig(
        in_dim=2,
        model=model,
        layers=layers,
        hidden=None,
        heads=2,
        concat_heads=concat,
        dropout=0.1,
        residual=True,
        edge_dim=4,
        init="prior",
        prior_weight=1.5,
        attention_dropout=None,
        self_loops=None,
        projections="linear",
        activation="elu",
    )
    encoder = GraphEncoder(config).eval()
    with torch.no_grad():
        out = encoder(x, graph.edge_index, graph.edge_type)[:6]  # (articles, dim)
    assert torch.allclose(out, hierarchy_prior(graph, VECTORS, 1.5, 0), atol=1e-6)
    # identity init: DSR itself; and the prior init trains (its message weights get gradients)
    identity = GraphEncoder(GraphEncoderConfig(**{**config.to_dict(), "init": "identity"})).eval()
    assert torch.allclose(identity(x, graph.edge_index, graph.edge_type), x, atol=1e-6)
    encoder.train()
    encoder(x, graph.edge_index, graph.edge_type)[:6].sum().backward()
    last = encoder.convs[-1][0]
    source = last.lin_l if model == "gatv2" else last.lin
    assert source.weight.grad.abs().sum() > 0
    assert all(conv.bias.grad.abs().sum() > 0 for layer in encoder.convs for conv in layer)


def test_question_edges_start_silent_in_their_own_convolution():
    """QABISAR: bipartite edges get a second, zero-initialised convolution, so the untrained
    encoder still gives the prior's articles and a question node keeps its own vector."""
    graph = toy_graph(questions=True)
    q = torch.tensor([[0.6, 0.8], [0.8, 0.6]])
    x = torch.cat([features(graph), q])  # (12, 2)
    structure = tuple(int(t) for t in EdgeType if t not in (EdgeType.QUESTION_ARTICLE, EdgeType.ARTICLE_QUESTION))
    groups = (structure, (int(EdgeType.QUESTION_ARTICLE), int(EdgeType.ARTICLE_QUESTION)))
    encoder = GraphEncoder(
        GraphEncoderConfig(
            in_dim=2,
            model="gatv2",
            layers=2,
            hidden=None,
            heads=1,
            concat_heads=True,
            dropout=0.0,
            residual=True,
            edge_dim=2,
            init="prior",
            prior_weight=1.0,
            edge_groups=groups,
            attention_dropout=None,
            self_loops=None,
            projections="linear",
            activation="elu",
        )
    ).eval()
    with torch.no_grad():
        out = encoder(x, graph.edge_index, graph.edge_type)
    assert torch.allclose(out[:6], hierarchy_prior(graph, VECTORS, 1.0, 0), atol=1e-6)
    assert torch.allclose(out[10:], q, atol=1e-6)


# ---------------------------------------------------------------------------
# QABISAR's teacher: its other gold articles stay, the scored positive's edge goes
# ---------------------------------------------------------------------------


def test_teacher_subgraph_keeps_other_gold_articles_and_cuts_the_scored_pair():
    graph = toy_graph(questions=True)
    a1, a2, h3, q100, q101 = 0, 1, 9, 10, 11
    # the batch: question 100 scored against its gold article 2 (node a2); its other gold is article 1
    subset, edge_index, edge_type = batch_subgraph(
        graph.edge_index,
        graph.edge_type,
        torch.tensor([a2, q100]),
        1,
        graph.num_nodes,
        cut_pairs=(torch.tensor([q100]), torch.tensor([a2])),
    )
    assert subset.tolist() == [a1, a2, h3, q100, q101]
    edges = sorted(
        (int(subset[s]), int(subset[d]), EdgeType(int(t)).name)
        for s, d, t in zip(edge_index[0], edge_index[1], edge_type)
    )
    assert edges == sorted(
        [
            (h3, a1, "HEADING_ARTICLE"),
            (h3, a2, "HEADING_ARTICLE"),
            (q100, a1, "QUESTION_ARTICLE"),
            (a1, q100, "ARTICLE_QUESTION"),  # the other gold article: kept
            (q101, a2, "QUESTION_ARTICLE"),
            (a2, q101, "ARTICLE_QUESTION"),  # another question's edges: kept
        ]
    )
    # the scored pair's edges are gone both ways (they are in the full graph)
    full = set(zip(graph.edge_index[0].tolist(), graph.edge_index[1].tolist()))
    assert {(q100, a2), (a2, q100)} <= full
    assert (q100, a2) not in {(e[0], e[1]) for e in edges} and (a2, q100) not in {(e[0], e[1]) for e in edges}


def test_directed_graph_points_down_but_questions_hear_their_articles():
    down = toy_graph(directed=True, questions=True)
    types = {EdgeType(int(t)).name for t in down.edge_type.unique()}
    assert types == {"HEADING_SUBHEADING", "HEADING_ARTICLE", "QUESTION_ARTICLE", "ARTICLE_QUESTION"}
    both = toy_graph(directed=False, questions=True)
    assert int(both.edge_type.numel()) == int(down.edge_type.numel()) + 3 + 6  # + reverse subheading, article edges
    assert np.array_equal(np.sort(down.edge_index.numpy(), axis=1).shape, down.edge_index.shape)


@pytest.mark.parametrize("variant", ["gdsr", "hgraph"])
def test_the_paper_profiles_lge_has_the_papers_size(variant):
    """G-DSR reports about 28M parameters for its legislative graph encoder at 768 dimensions:
    gdsr (the public code's 3 single-head layers 768 -> 3072 -> 3072 -> 768) has it, and so
    does hgraph (8 averaged heads of width 768)."""
    import yaml

    from conftest import ROOT
    from lexgraph.methods.gnn.config import GNNSettings

    params = yaml.safe_load((ROOT / "profiles" / "paper.yaml").read_text(encoding="utf-8"))["gnn"]
    count = GNNSettings.from_params(params, variant).encoder.with_input(768, prior_weight=1.0).parameter_count()
    assert 27_000_000 <= count <= 29_000_000, count
