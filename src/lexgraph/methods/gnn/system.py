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
from lexgraph.methods.dense import DenseRetriever, load_dense
from lexgraph.methods.system import DenseSystem

log = logging.getLogger(__name__)


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
        model_dir / "query_encoder"
        if variant in layout.QUESTION_VARIANTS
        else layout.DSR.under(workspace, "query_encoder")
    )
    return load_dense(
        variant,
        query_dir,
        artifact.under(corpus or workspace, layout.ARTICLE_EMBEDDINGS),
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


def first_stage(variant: str, workspace: Path) -> layout.Artifact:
    """The DSR whose vectors ``variant``'s graph encoder was trained on: QABISAR's own first stage
    where its ``gnn.json`` names it (``first_stage``), else G-DSR's DSR."""
    from lexgraph.core.inputs import read_json_object

    path = layout.GNN[variant].under(workspace, "gnn.json")
    saved = read_json_object(
        path,
        what="the graph encoder settings train_gnn writes",
        optional={"first_stage": (lambda v: isinstance(v, str), "a workspace path")},
        fix=layout.restore_hint(path),
    )
    return layout.DSR_QABISAR if saved.get("first_stage") == layout.DSR_QABISAR.path.as_posix() else layout.DSR


def index_side(variant: str):
    """``lexgraph index`` for ``variant``: its graph encoder applied inductively over the corpus's own
    statute graph (no question nodes: :mod:`lexgraph.methods.gnn.inductive`), on the corpus vectors of its
    own first stage (:func:`first_stage`)."""

    def write(job) -> None:
        from lexgraph.methods.gnn.inductive import graph_vectors

        embeddings = job.embeddings(first_stage(variant, job.workspace))
        vectors = graph_vectors(variant, job.workspace, job.graph(), embeddings, job.device)  # (A, dim)
        job.save_graph_vectors(variant, layout.GNN[variant], vectors)

    return write


#: each variant: what it is, where its article vectors come from, and its loader
_VARIANTS = {
    "gdsr": (
        "G-DSR as published: its legislative graph encoder (3-layer GATv2) over articles and headings on DSR",
        "G-DSR's legislative graph encoder: one full-graph pass over articles and headings on top of DSR",
        load_gdsr,
    ),
    "qabisar": (
        "QABISAR as published: the graph with train-question nodes, distilled into its query encoder",
        "QABISAR's graph encoder: one full-graph pass over articles, headings and train questions",
        load_qabisar,
    ),
    "hgraph": (
        "lexgraph's statute-graph encoder on top of DSR",
        "lexgraph's statute-graph encoder: one full-graph pass over the hierarchy on top of DSR",
        load_hgraph,
    ),
    "hgraph_qa": (
        "lexgraph's graph encoder with train-question nodes and its own query encoder",
        "lexgraph's graph encoder with train questions: one full-graph pass on top of DSR",
        load_hgraph_qa,
    ),
}

SYSTEMS = tuple(
    DenseSystem(
        name=variant,
        summary=summary,
        load=load,
        reads=(layout.GNN[variant], layout.DSR),
        # QABISAR may have its own first stage (dsr_qabisar), else it is built on dsr's
        sections=(
            "pretrain",
            "dsr",
            *(("dsr_qabisar",) if variant == "qabisar" else ()),
            "embed",
            "graph",
            "gnn",
        ),
        article_side=article_side,
        index_models=(layout.DSR.posix(), layout.GNN[variant].posix()),
        index=index_side(variant),
    )
    for variant, (summary, article_side, load) in _VARIANTS.items()
)
