"""A workspace's trained hierarchy systems applied to a corpus they were not trained on.

``lexgraph index`` (issue 26, item 2) and ``benchmarks/french_law.py`` (item 3) give a new
corpus, or the sample plus 88k distractors, the article vectors that ``hprior`` and the graph
encoders give the workspace's own corpus, with no retraining:

* :func:`corpus_graph` builds the corpus's statute graph with the settings the workspace's
  ``build_graph`` recorded in ``data/graph/graph.pt`` (directed or not, consecutive edges); a
  corpus of one's own has no train questions, so no question nodes, unless ``questions`` are
  given (the benchmark: the workspace's train questions, whose gold articles are in it);
* :func:`lexgraph.methods.hprior.system.hprior_vectors` propagates the DSR article vectors through
  that hierarchy with the weight and scope the workspace's ``hprior`` stage chose on dev
  (``models/hprior/hprior.json``);
* :func:`graph_vectors` runs the trained graph encoder of ``models/gnn_<variant>/`` once over the
  whole graph, as ``train_gnn`` computes the embeddings it saves
  (:func:`lexgraph.methods.gnn.train.graph_pass`), with the node features its
  ``gnn.json`` names. G-DSR's and lexgraph's graph encoders are inductive (GATv2 layers over
  node features, no per-node parameters); QABISAR's graph without question nodes is its graph
  at test time for an unseen corpus (its questions are encoded by its own query encoder).

Applied to the workspace's own corpus (its articles, headings and train questions), the three
reproduce the vectors the pipeline saved (``tests/test_pipeline.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lexgraph.core import layout
from lexgraph.core.errors import DataError
from lexgraph.core.inputs import read_json_object

log = logging.getLogger(__name__)

#: train_gnn's saved settings (``gnn.json``'s ``settings``) that applying the encoder reads
_APPLY_KEYS = ("variant", "heading_features", "normalize_features")
_QUESTION_KEYS = ("structure", "bipartite")  # saved by the question variants only


@dataclass(frozen=True)
class SavedGraphModel:
    """How ``train_gnn`` built a variant's inputs, as its ``gnn.json`` records them (the
    attributes :func:`lexgraph.methods.gnn.data.node_features` and ``variant_graph`` read)."""

    variant: str
    heading_features: str  # articles (mean of the articles under a heading) | title (its DSR vector)
    normalize_features: bool
    structure: bool  # heading nodes (question variants' ablation)
    bipartite: bool  # question-article edges (question variants' ablation)
    uses_questions: bool

    @classmethod
    def read(cls, model_dir: str | Path) -> SavedGraphModel:
        from lexgraph.methods.gnn.config import GRAPH_VARIANT_VALUES, QUESTION_VARIANTS

        path = Path(model_dir) / "gnn.json"
        config = read_json_object(
            path,
            what="the graph encoder settings train_gnn writes",
            keys={"settings": (lambda v: isinstance(v, dict) and all(k in v for k in _APPLY_KEYS), "an object")},
            fix=layout.restore_hint(Path(model_dir)),
        )
        settings = {key: config["settings"][key] for key in _APPLY_KEYS}
        # a graph variant saves no question keys: the values GNNSettings gives it
        questions = {key: config["settings"].get(key, GRAPH_VARIANT_VALUES[key]) for key in _QUESTION_KEYS}
        return cls(**settings, **questions, uses_questions=settings["variant"] in QUESTION_VARIANTS)


def workspace_graph_config(workspace: str | Path):
    """The :class:`~lexgraph.graph.build.GraphConfig` the workspace's graph was built with (the
    ``config`` that ``build_graph`` saves inside ``data/graph/graph.pt``)."""
    from lexgraph.graph.build import GraphConfig

    path = layout.GRAPH.under(workspace, "graph.pt")
    if not path.is_file():
        raise DataError(path, f"file not found; run `dvc repro {layout.GRAPH.stage}` in the workspace")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        return GraphConfig(**payload["config"])
    except Exception as exc:  # noqa: BLE001 - any reader failure is a bad file for the user
        raise DataError(path, f"holds no graph settings ({type(exc).__name__}); {layout.restore_hint(path)}") from None


def corpus_graph(articles, headings, workspace: str | Path, questions=None):
    """The statute graph of ``articles`` and ``headings`` (the clean tables' columns) built as
    the workspace built its own; ``questions`` (``id``, ``question``, ``article_ids``,
    ``split``): train questions as nodes when the workspace's graph has them."""
    import polars as pl

    from lexgraph.graph.build import GraphConfig, build_graph

    config = workspace_graph_config(workspace)
    if questions is None:
        questions = pl.DataFrame(
            schema={"id": pl.Int64, "question": pl.Utf8, "article_ids": pl.List(pl.Int64), "split": pl.Utf8}
        )
        config = GraphConfig(directed=config.directed, consecutive=config.consecutive, questions=False)
    graph, _ = build_graph(articles, headings, questions, config)
    return graph


def _ordered(graph, ids: np.ndarray, vectors: torch.Tensor, what: str, path: Any) -> torch.Tensor:
    """``vectors`` in the graph's article order (each of its articles must have a row)."""
    from lexgraph.encoding.embed import select_rows

    return select_rows(np.asarray(ids, dtype=np.int64), vectors, graph.article_ids.numpy(), path, what).float()


def _apply_graph(graph, saved: SavedGraphModel):
    """The graph the variant's encoder runs on: the corpus's, less what its ablations drop."""
    from lexgraph.graph.build import restrict_graph
    from lexgraph.methods.gnn.data import variant_graph

    if saved.uses_questions and graph.question_ids.numel():
        return variant_graph(graph, saved)
    return restrict_graph(graph, headings=saved.structure, questions=False, consecutive=saved.structure)


def graph_vectors(
    variant: str,
    workspace: str | Path,
    graph,
    embeddings: dict[str, tuple[np.ndarray, torch.Tensor]],
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``(A, dim)`` article vectors (the graph's article order) of the workspace's trained
    ``variant`` applied to ``graph``; ``embeddings``: ``{"articles"|"headings"|"questions": (ids,
    (n, dim))}``, the DSR vectors of the graph's nodes (headings: only for title features;
    questions: only with question nodes)."""
    from lexgraph.methods.gnn.data import node_features
    from lexgraph.methods.gnn.io import load_graph_encoder
    from lexgraph.methods.gnn.train import graph_pass

    model_dir = layout.GNN[variant].under(workspace)
    saved = SavedGraphModel.read(model_dir)
    g = _apply_graph(graph, saved)
    names = {f"{name}_embeddings": f"the DSR {name} vectors" for name in ("articles", "headings", "questions")}
    x = node_features(g, embeddings, saved, {**names, "graph": "the corpus graph"})  # (nodes, dim)
    model = load_graph_encoder(model_dir, device)
    out = graph_pass(model, g, x, torch.device(device))  # (A, dim)
    log.info("%s applied to %d articles and %d headings", variant, g.article_ids.numel(), g.heading_ids.numel())
    return out
