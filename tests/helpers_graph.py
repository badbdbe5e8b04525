"""The toy legislative graph and the GNN settings shared by test_graph, test_gnn and
test_gnn_published (and conftest's ``tiny_query_encoder_dir``)."""

from __future__ import annotations

import polars as pl
import torch

from helpers_config import sample_config
from lexgraph.graph.build import EdgeType, GraphConfig, build_graph
from lexgraph.methods.gnn.config import GNNSettings

# Code A: Livre 1 (no "part") -> Chapitre 1 / Chapitre 2; article 13 hangs directly
# under Livre 1 (its chapter level is missing). Code B: articles directly under the
# code. Article 30 has no hierarchy at all. Rows are deliberately out of order.
HEADINGS = pl.DataFrame(
    {
        "heading_id": [4, 0, 2, 1, 3],
        "parent_id": [-1, -1, 1, 0, 1],
        "level": [1, 1, 3, 2, 3],
        "level_name": ["code", "code", "chapter", "book", "chapter"],
        "label": ["Code B", "Code A", "Chapitre 1", "Livre 1", "Chapitre 2"],
        "path": [
            ["Code B"],
            ["Code A"],
            ["Code A", "Livre 1", "Chapitre 1"],
            ["Code A", "Livre 1"],
            ["Code A", "Livre 1", "Chapitre 2"],
        ],
        "text": ["Code B", "Code A", "Du mur", "Des biens", "Du bornage"],
    }
)
ARTICLES = pl.DataFrame(
    {
        "id": [21, 10, 12, 30, 11, 13, 20],
        "article": [f"texte {i}" for i in (21, 10, 12, 30, 11, 13, 20)],
        "reference": [f"Art. {i}" for i in (21, 10, 12, 30, 11, 13, 20)],
        "path": [
            ["Code B"],
            ["Code A", "Livre 1", "Chapitre 1"],
            ["Code A", "Livre 1", "Chapitre 2"],
            [],
            ["Code A", "Livre 1", "Chapitre 1"],
            ["Code A", "Livre 1"],
            ["Code B"],
        ],
        "heading_id": [4, 2, 3, -1, 2, 1, 4],
    }
)
QUESTIONS = pl.DataFrame(
    {
        "id": [6, 1, 3, 4, 5, 2],
        "question": ["q6", "q1", "q3 dev", "q4 test", "q5 synthetic", "q2"],
        "article_ids": [[10], [12, 10], [11], [21], [13], [20]],
        "split": ["train", "train", "dev", "test", "synthetic", "train"],
    },
    schema={"id": pl.Int64, "question": pl.Utf8, "article_ids": pl.List(pl.Int64), "split": pl.Utf8},
)


# ---------------------------------------------------------------------------
# GNN toy: node features, negatives and every gnn.* key at a plain setting
# ---------------------------------------------------------------------------

DIM = 8


def graph(**config):
    return build_graph(ARTICLES, HEADINGS, QUESTIONS, sample_config(GraphConfig, "graph", **config))[0]


def feature(kind: str, ident: int) -> torch.Tensor:
    """A distinct, recognisable vector per (kind, id)."""
    g = torch.Generator().manual_seed({"a": 1000, "h": 2000, "q": 3000}[kind] + ident)
    return torch.randn(DIM, generator=g)


#: generate_queries' output for the toy corpus: one synthetic query per article it names
SYNTHETIC = pl.DataFrame(
    {
        "id": [1000000, 1000001, 1000002],
        "question": ["texte 10 crop", "texte 21 crop", "texte 30 crop"],
        "article_ids": [[10], [21], [30]],
        "split": ["synthetic"] * 3,
    },
    schema=QUESTIONS.schema,
)


def embeddings():
    art = ARTICLES["id"].to_numpy()
    head = HEADINGS["heading_id"].to_numpy()
    ques = QUESTIONS["id"].to_numpy()  # every split, as the embed stage writes them
    syn = SYNTHETIC["id"].to_numpy()
    return {
        "articles": (art, torch.stack([feature("a", int(i)) for i in art])),
        "headings": (head, torch.stack([feature("h", int(i)) for i in head])),
        "questions": (ques, torch.stack([feature("q", int(i)) for i in ques])),
        "synthetic": (syn, torch.stack([feature("q", int(i)) for i in syn])),
    }


NEGATIVES = pl.DataFrame(
    {
        "question_id": [1, 2, 6, 4],
        "split": ["train", "train", "train", "test"],
        "negative_ids": [[20, 21], [10, 11, 12], [30], [10]],
    },
    schema={"question_id": pl.Int64, "split": pl.Utf8, "negative_ids": pl.List(pl.Int64)},
)

SHARED = {
    "model": "gatv2",
    "layers": 1,
    "dropout": 0.0,
    "hard_negatives": 1,
    "adam_epsilon": 1e-8,
    "weight_decay": 0.1,
    "max_grad_norm": 1.0,
    "accumulation_steps": 1,
}
#: lexgraph's recipe (hgraph), every key of a variant's mapping at a plain setting
GRAPH = {
    "layer": "stack",
    "hidden": None,
    "heads": 2,
    "concat_heads": True,
    "attention_dropout": 0.0,
    "residual": True,
    "self_loops": False,
    "projections": "linear",
    "edge_dim": None,
    "init": "random",
    "activation": "elu",
    "heading_features": "articles",
    "normalize_features": True,
    "synthetic": False,
    "batch_size": 3,
    "lr": 1e-2,
    "schedule": "linear",
    "warmup_ratio": 0.1,
    "epochs": 2,
    "selection": "dev",
    "similarity": "cosine",
    "temperature": 0.05,
    "refit": False,
}
QUESTION = {
    **GRAPH,
    "edge_dim": 4,
    "edge_attention": "per_group",
    "encoder_lr": 1e-3,
    "encoder_layers": None,
    "kd": {"weight": 0.3, "mode": "score", "temperature": 0.1, "student_contrastive": False},
    "leak_cut": True,
    "bipartite": True,
    "structure": True,
}
BASE_PARAMS = {
    **SHARED,
    "gdsr": dict(GRAPH),
    "qabisar": dict(QUESTION),
    "hgraph": dict(GRAPH),
    "hgraph_qa": dict(QUESTION),
}


def settings(variant: str, **overrides) -> GNNSettings:
    """``variant``'s settings; an override goes to the shared keys or to ``gnn.<variant>``."""
    params = {**BASE_PARAMS, variant: dict(BASE_PARAMS[variant])}
    for key, value in overrides.items():
        (params if key in SHARED else params[variant])[key] = value
    return GNNSettings.from_params(params, variant)


QA, AQ = int(EdgeType.QUESTION_ARTICLE), int(EdgeType.ARTICLE_QUESTION)
