"""The ``dsr`` system: DSR's query encoder (``models/dsr/query_encoder``) and the article
embeddings of the ``embed`` stage (``data/embed/articles.safetensors``), through
:func:`lexgraph.methods.dense.load_dense`."""

from __future__ import annotations

from pathlib import Path

from lexgraph.core import layout
from lexgraph.methods.dense import DenseRetriever, load_dense, require_built
from lexgraph.methods.system import DenseSystem


def dsr_cosine(dsr_dir: Path) -> bool:
    """Whether the DSR in ``dsr_dir`` ranks by cosine: its ``dsr.json``'s ``similarity``
    (``dsr.similarity``; cosine where no ``dsr.json`` lies beside a bare query encoder)."""
    from lexgraph.core.inputs import read_json_object
    from lexgraph.models.dsr import DSR_CONFIG

    path = dsr_dir / DSR_CONFIG
    settings = read_json_object(
        path,
        what="the DSR settings train_dsr writes",
        optional={"similarity": (lambda v: v in ("cosine", "dot"), "cosine or dot")},
        fix=layout.restore_hint(path),
        missing_ok=True,
    )
    return (settings or {}).get("similarity", "cosine") == "cosine"


def load_dsr(workspace: Path, device: str = "auto", index=None, *, corpus: Path | None = None) -> DenseRetriever:
    """The ``dsr`` system: DSR query encoder + the ``embed`` stage's article embeddings, ranked by the
    DSR's own score (``dsr.similarity``; the query encoder is checked first: both come from ``dvc
    repro embed``); ``corpus``: an index of another corpus (``lexgraph index``) whose ``data/embed``
    holds the article embeddings."""
    workspace = Path(workspace)
    query_dir = require_built(layout.DSR.under(workspace, "query_encoder"), "the trained DSR query encoder", "embed")
    return load_dense(
        "dsr",
        query_dir,
        layout.EMBED.under(corpus or workspace, "articles.safetensors"),
        "embed",
        device,
        index,
        dsr_cosine(layout.DSR.under(workspace)),
        embeddings_what="the DSR article embeddings",
    )


#: the params sections DSR's article vectors are built from (and those of every system built on them)
DSR_SECTIONS = ("pretrain", "dsr", "embed")


def export_articles(workspace: Path, device: str):
    """The export's article side: DSR's hierarchical article encoder (``models/dsr/article_encoder``)."""
    from lexgraph.models.article_encoder import HierarchicalArticleEncoder

    directory = layout.DSR.under(workspace, "article_encoder")
    return HierarchicalArticleEncoder.from_pretrained(directory, root=workspace).to(device).eval()


SYSTEM = DenseSystem(
    name="dsr",
    summary="DSR (G-DSR's dense statute retriever): a query encoder and a hierarchical article encoder",
    load=load_dsr,
    reads=(layout.DSR, layout.EMBED),
    stage=layout.EMBED.stage,
    sections=DSR_SECTIONS,
    article_side="DSR's hierarchical article encoder (models/dsr/article_encoder): chunks of the article "
    "encoded, contextualised by a small Transformer and pooled (the `embed` stage)",
    article_encoder=export_articles,
    index_models=(layout.DSR.posix(),),
    index=lambda job: job.embed(layout.DSR),
)
