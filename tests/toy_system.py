"""A system of one's own, declared in this one module (docs/systems.md: adding a system):
``centred``, DSR's question encoder over DSR's article vectors centred on their corpus mean,
searched by cosine (centring removes the direction every article shares, so a cosine ranks by
what sets an article apart). Registered under the ``lexgraph.systems`` entry points
(``centred = toy_system:SYSTEM``) by tests/test_system_plugin.py; nothing else in lexgraph names it.
"""

from __future__ import annotations

from pathlib import Path

from lexgraph.core.layout import DSR, EMBED, Artifact
from lexgraph.methods.system import DenseSystem

NAME = "centred"
ARTIFACT = Artifact("models/centred", "centred")
VECTORS = "article_embeddings.safetensors"


def centre(vectors):
    return vectors - vectors.mean(dim=0, keepdim=True)  # (n, dim)


def build(workspace: Path) -> None:
    """Its own stage: the workspace's DSR article vectors (``data/embed``), centred."""
    from lexgraph.encoding.embed import load_embeddings, save_embeddings

    ids, vectors = load_embeddings(EMBED.under(workspace, "articles.safetensors"))
    save_embeddings(ARTIFACT.under(workspace, VECTORS), ids, centre(vectors))


def load(workspace: Path, device: str = "cpu", index=None, *, corpus: Path | None = None):
    from lexgraph.methods.dense import load_dense

    vectors = ARTIFACT.under(corpus or workspace, VECTORS)
    return load_dense(NAME, DSR.under(workspace, "query_encoder"), vectors, NAME, device, index, workspace=workspace)


def index_side(job) -> None:
    """``lexgraph index``: the corpus's DSR vectors (the index's own ``data/embed``), centred."""
    from lexgraph.encoding.embed import save_embeddings

    ids, vectors = job.embeddings(DSR)["articles"]
    out = ARTIFACT.under(job.root, VECTORS)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_embeddings(out, ids, centre(vectors))


SYSTEM = DenseSystem(
    name=NAME,
    summary="DSR's question encoder over DSR's article vectors centred on their mean, by cosine",
    load=load,
    reads=(ARTIFACT, DSR),
    stage=ARTIFACT.stage,
    sections=("dsr", "embed"),
    article_side="DSR's article vectors, centred on the corpus mean",
    index_models=(DSR.posix(),),
    index=index_side,
)
