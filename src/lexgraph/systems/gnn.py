"""Graph-augmented dense systems: ``gdsr`` (G-DSR as published), ``qabisar`` (QABISAR as
published) and lexgraph's recipes ``hgraph`` and ``hgraph_qa``.

Each scores questions (cosine or dot product, ``gnn.json``'s ``similarity``) against the
article embeddings that ``train_gnn`` computed with one full-graph pass
(``models/gnn_<variant>/article_embeddings.safetensors``):

* ``gdsr``, ``hgraph`` — questions encoded by the DSR query encoder (``models/dsr/query_encoder``),
  as in G-DSR, where only the legislative graph encoder is trained on top of DSR;
* ``qabisar``, ``hgraph_qa`` — questions encoded by the variant's distilled query encoder
  (``models/gnn_<variant>/query_encoder``): unseen questions have no node in the graph. Without
  distillation (``kd_weight: 0``) that directory references ``models/dsr/query_encoder``
  (``backbone.json``) instead of holding a copy of it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from lexgraph.core import layout
from lexgraph.encoding.embed import ARTICLE_EMBEDDINGS
from lexgraph.systems.dense import DenseRetriever, load_dense

log = logging.getLogger(__name__)

#: the systems whose graph holds train questions and whose query encoder is their own
QUESTION_SYSTEMS = ("qabisar", "hgraph_qa")


def _cosine(model_dir: Path) -> bool:
    """Whether the graph model in ``model_dir`` scores by cosine (``gnn.json``'s
    ``similarity``; dot product otherwise)."""
    from lexgraph.core.inputs import read_json_object

    settings = read_json_object(
        model_dir / "gnn.json",
        what="the graph encoder settings train_gnn writes",
        optional={"similarity": (lambda v: v in ("cosine", "dot"), "cosine or dot")},
        fix="rerun `dvc repro train_gnn` (or `dvc checkout`) to restore it",
    )
    return settings.get("similarity", "cosine") == "cosine"


def load_graph_system(
    variant: str, workspace: Path, device: str = "auto", index=None, corpus: Path | None = None
) -> DenseRetriever:
    """The system of ``train_gnn --variant <variant>``: its article embeddings (those of ``corpus``,
    an index of another corpus, when given), and the DSR query encoder (gdsr, hgraph) or the
    variant's distilled one (qabisar, hgraph_qa)."""
    workspace = Path(workspace)
    artifact = layout.GNN[variant]
    model_dir = artifact.under(workspace)
    query_dir = (
        model_dir / "query_encoder" if variant in QUESTION_SYSTEMS else layout.DSR.under(workspace, "query_encoder")
    )
    return load_dense(
        variant,
        query_dir,
        artifact.under(corpus or workspace, ARTICLE_EMBEDDINGS),
        artifact.stage,
        device,
        index,
        _cosine(model_dir),
        workspace=workspace,
    )


def load_gdsr(workspace: Path, device: str = "auto", index=None, *, corpus: Path | None = None) -> DenseRetriever:
    """``gdsr``: G-DSR as published, the DSR query encoder + its LGE's article embeddings."""
    return load_graph_system("gdsr", workspace, device, index, corpus)


def load_qabisar(workspace: Path, device: str = "auto", index=None, *, corpus: Path | None = None) -> DenseRetriever:
    """``qabisar``: QABISAR as published, its distilled query encoder + its article embeddings."""
    return load_graph_system("qabisar", workspace, device, index, corpus)


def load_hgraph(workspace: Path, device: str = "auto", index=None, *, corpus: Path | None = None) -> DenseRetriever:
    """``hgraph``: lexgraph's statute-graph recipe, the DSR query encoder + its article embeddings."""
    return load_graph_system("hgraph", workspace, device, index, corpus)


def load_hgraph_qa(workspace: Path, device: str = "auto", index=None, *, corpus: Path | None = None) -> DenseRetriever:
    """``hgraph_qa``: lexgraph's recipe with train questions, its query encoder + its article embeddings."""
    return load_graph_system("hgraph_qa", workspace, device, index, corpus)
