"""Graph-augmented dense systems: ``gdsr`` (G-DSR) and ``qabisar``.

Both score questions by exact cosine against the article embeddings that ``train_gnn``
computed with one full-graph pass (``models/gnn_<variant>/article_embeddings.safetensors``):

* ``gdsr`` — questions encoded by the DSR query encoder (``models/dsr/query_encoder``),
  as in G-DSR, where only the legislative graph encoder is trained on top of DSR;
* ``qabisar`` — questions encoded by QABISAR's distilled query encoder
  (``models/gnn_qabisar/query_encoder``): unseen questions have no node in the graph.
"""

from __future__ import annotations

import logging
from pathlib import Path

from lexgraph.errors import LexgraphError
from lexgraph import layout
from lexgraph.embed import ARTICLE_EMBEDDINGS
from lexgraph.retrieval.dense import DenseRetriever, load_query_encoder

log = logging.getLogger(__name__)



def _require(path: Path, what: str, stage: str) -> Path:
    if not path.exists():
        raise LexgraphError(f"{path}: {what} not found; run `dvc repro {stage}` first")
    return path


def load_dense(name: str, query_dir: Path, emb_path: Path, stage: str, device: str, index=None,
               normalize: bool = True) -> DenseRetriever:
    """A :class:`DenseRetriever` from a query encoder directory and an article embeddings file."""
    from lexgraph.config import resolve_device
    from lexgraph.embed import load_embeddings

    _require(emb_path, f"the {name} article embeddings", stage)
    _require(query_dir, f"the {name} query encoder", stage)
    ids, embeddings = load_embeddings(emb_path)
    encoder = load_query_encoder(query_dir)
    return DenseRetriever(encoder, ids, embeddings, name=name, device=resolve_device(device), source=emb_path,
                          index=index, normalize=normalize)


def _cosine(model_dir: Path) -> bool:
    """Whether the graph model in ``model_dir`` scores by cosine (``gnn.json``'s
    ``similarity``; dot product otherwise)."""
    from lexgraph.inputs import read_json_object

    settings = read_json_object(model_dir / "gnn.json", what="the graph encoder settings train_gnn writes",
                                optional={"similarity": (lambda v: v in ("cosine", "dot"), "cosine or dot")},
                                fix="rerun `dvc repro train_gnn` (or `dvc checkout`) to restore it")
    return settings.get("similarity", "cosine") == "cosine"


def load_gdsr(workspace: Path, device: str = "auto", index=None) -> DenseRetriever:
    """The ``gdsr`` system: DSR query encoder + LGE article embeddings."""
    workspace = Path(workspace)
    model_dir = layout.GNN["lge"].under(workspace)
    return load_dense("gdsr", layout.DSR.under(workspace, "query_encoder"), model_dir / ARTICLE_EMBEDDINGS,
                      layout.GNN["lge"].stage, device, index, _cosine(model_dir))


def load_qabisar(workspace: Path, device: str = "auto", index=None) -> DenseRetriever:
    """The ``qabisar`` system: distilled query encoder + QABISAR article embeddings."""
    workspace = Path(workspace)
    model_dir = layout.GNN["qabisar"].under(workspace)
    return load_dense("qabisar", model_dir / "query_encoder", model_dir / ARTICLE_EMBEDDINGS, layout.GNN["qabisar"].stage, device,
                      index, _cosine(model_dir))
