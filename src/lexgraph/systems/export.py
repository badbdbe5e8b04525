"""Trained dense systems for others to load: ``lexgraph export``.

:func:`export_system` writes one dense system of a workspace to a folder that
``sentence_transformers.SentenceTransformer(OUT, trust_remote_code=True)`` loads (sentence-transformers 6):

* both sides of the system as one sentence-transformers model (:mod:`lexgraph.models.st_folder`):
  ``encode_query`` runs the query encoder (a full copy of its backbone and tokenizer, its pooling and
  prefix: the ``query`` prompt, used by default), ``encode_document`` the system's article text
  encoder (:func:`article_side`: DSR's hierarchical encoder, zeroshot's windowed mean), whose code
  travels in the folder (``lexgraph_st.py``, :mod:`lexgraph.models.st_article`: the reason for
  ``trust_remote_code``), so a client that encodes articles itself gets lexgraph's vectors. A
  system whose article vectors need the statute graph (:data:`GRAPH_SIDE`) has an article side that
  refuses in one line instead of giving another encoder's vectors;
* :data:`VECTORS` (safetensors, bytes in sorted order): ``ids`` int64 ``(n,)``, the article ids as
  lexgraph writes them, ascending, and ``vectors`` float32 ``(n, dim)``, the system's own article
  vectors (L2-normalised for a cosine system, so that ``query @ vectors.T`` is lexgraph's score);
* :data:`KEYS` (a workspace built from a corpus of one's own, whose articles have the user's string
  ids: ``data/clean/keys.parquet``): a JSON list, the user's id of each of ``ids``, in their order;
* ``README.md``, a model card (YAML front matter for the Hugging Face hub): the system's metrics
  (``metrics/<system>.json``), the exact ``params.yaml`` sections its artefacts were built with, where
  the article vectors come from, and how to search with them;
* :data:`MANIFEST` (``lexgraph_export.json``): the format marker (:data:`FORMAT`), the system, its
  similarity and sources, and the export's own files (with their SHA-256) and folders. An earlier
  export is replaced only when it is provably one: the manifest carries the marker and the folder
  holds nothing it does not list (:func:`lexgraph.systems.index_record.check_replaceable`); any
  other folder is refused in one line naming it and its first foreign entry, and nothing is deleted.

Two exports of one workspace are equal byte for byte. The folder is written atomically
(:func:`lexgraph.core.io.atomic_path`); nothing is uploaded (it is ready for ``hf upload``). BM25,
the hybrid and the re-rankers have no dense query encoder and are refused (:data:`NOT_DENSE`).
:mod:`lexgraph.systems.mteb_adapter` gives the same two sides to MTEB 2.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from lexgraph.core import layout
from lexgraph.core.errors import LexgraphError

log = logging.getLogger(__name__)

VECTORS = "article_vectors.safetensors"
#: on a corpus of one's own (``fetch.source: corpus``): the user's string ids of :data:`VECTORS`' ``ids``, in order
KEYS = "article_keys.json"
MANIFEST = "lexgraph_export.json"
#: the manifest's format marker: an export that carries it, and lists its files, may be replaced
FORMAT = "lexgraph-export"
VERSION = 1
CARD = "README.md"

#: the dense systems (a query encoder + fixed article vectors) and the params.yaml sections their
#: artefacts are built from (``gnn``: its shared keys and the variant's own mapping)
DENSE: dict[str, tuple[str, ...]] = {
    "zeroshot": ("pretrain", "zeroshot"),
    "dsr": ("pretrain", "dsr", "embed"),
    "hprior": ("pretrain", "dsr", "embed", "hprior"),
    **{variant: ("pretrain", "dsr", "embed", "graph", "gnn") for variant in layout.GNN},
    "qabisar": ("pretrain", "dsr", "dsr_qabisar", "embed", "graph", "gnn"),  # its own first stage (or dsr's)
}

#: the systems that export refuses, and why
NOT_DENSE: dict[str, str] = {
    "bm25": "a sparse BM25 index",
    "hybrid": "BM25 fused with a dense system (export that dense system)",
    "xrerank": "a re-ranker over a first stage's candidates",
    "mvcl": "a re-ranker over a first stage's candidates",
}

#: the systems whose article vectors come from a pass over the statute graph: their export's
#: ``encode_document`` refuses (:class:`lexgraph.models.st_article.GraphArticleSide`)
GRAPH_SIDE = ("hprior", *layout.GNN, "qabisar")

#: where each system's article vectors come from (the model card says it)
ARTICLE_SIDE: dict[str, str] = {
    "zeroshot": "the base checkpoint (models/pretrain) as it is: the mean of each article's windows "
    "of tokens, weighted by their token counts (E5's own recipe)",
    "dsr": "DSR's hierarchical article encoder (models/dsr/article_encoder): chunks of the article "
    "encoded, contextualised by a small Transformer and pooled (the `embed` stage)",
    "hprior": "DSR's article vectors propagated through the statute hierarchy (the `hprior` stage's "
    "weight and scope, chosen on dev)",
    "gdsr": "G-DSR's legislative graph encoder: one full-graph pass over articles and headings on top of DSR",
    "qabisar": "QABISAR's graph encoder: one full-graph pass over articles, headings and train questions",
    "hgraph": "lexgraph's statute-graph encoder: one full-graph pass over the hierarchy on top of DSR",
    "hgraph_qa": "lexgraph's graph encoder with train questions: one full-graph pass on top of DSR",
}


def check_system(system: str) -> None:
    """Refuse a system that cannot be exported, in one sentence."""
    if system in NOT_DENSE:
        raise LexgraphError(
            f"--system {system} is {NOT_DENSE[system]}, not a dense encoder; expected one of {', '.join(DENSE)}"
        )
    if system not in DENSE:
        raise LexgraphError(f"unknown system '{system}'; expected one of {', '.join(DENSE)}")


def check_out(out: str | os.PathLike, workspace: str | os.PathLike) -> Path:
    """Refuse an ``OUT`` that is not a directory, a directory that is not provably an earlier export
    (the whole folder is replaced: :data:`MANIFEST` with :data:`FORMAT`, and only the files it lists),
    or a path DVC owns (the workspace's data/ and models/, its cache, a tracked output). Nothing is
    deleted."""
    from lexgraph.core.inputs import shown_path
    from lexgraph.core.tracked import dvc_owner
    from lexgraph.systems.index_record import check_replaceable

    path = Path(out)
    if path.exists() and not path.is_dir():
        what = "a file" if path.is_file() else "not a directory"
        raise LexgraphError(f"OUT {shown_path(path)} is {what}; expected a new directory or an earlier export")
    check_replaceable(path, record=MANIFEST, marker=FORMAT, label="OUT", what="an earlier export")
    owner = dvc_owner(path, workspace)
    if owner:
        raise LexgraphError(f"OUT {shown_path(path)} {owner}; refusing to write there, expected a path outside")
    return path


def _sections(workspace: Path, system: str) -> dict[str, Any]:
    """The params.yaml sections ``system`` is built from, as written (``gnn``: the shared keys and
    the variant's mapping only); empty when the workspace has no params.yaml."""
    from lexgraph.core.config import read_params

    path = workspace / "params.yaml"
    if not path.is_file():
        return {}
    params = read_params(path)
    picked = {name: params[name] for name in DENSE[system] if name in params}
    if isinstance(picked.get("gnn"), dict):
        picked["gnn"] = {k: v for k, v in picked["gnn"].items() if k not in layout.GNN or k == system}
    return picked


def _metrics(workspace: Path, system: str) -> dict[str, dict[str, float]]:
    """``metrics/<system>.json`` by split (only splits holding numbers), or empty."""
    from lexgraph.core.inputs import read_json

    path = workspace / "metrics" / f"{system}.json"
    found = read_json(path, what="the evaluate stage's metrics", fix="rerun `dvc repro evaluate`", missing_ok=True)
    if not isinstance(found, dict):
        return {}
    return {
        split: {k: v for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        for split, values in found.items()
        if isinstance(values, dict) and any(isinstance(v, int | float) for v in values.values())
    }


def article_side(system: str, workspace: Path, device: str):
    """The text encoder of ``system``'s articles, as its stage encoded them: DSR's hierarchical
    encoder (``models/dsr/article_encoder``) or zeroshot's windowed mean of the base checkpoint;
    ``None`` for a system whose article vectors need the statute graph (:data:`GRAPH_SIDE`)."""
    from lexgraph.models.article_encoder import HierarchicalArticleEncoder

    if system in GRAPH_SIDE:
        return None
    if system == "zeroshot":
        from lexgraph.systems.corpus_index import workspace_params
        from lexgraph.systems.zeroshot import ZeroshotConfig, article_encoder

        config = workspace_params("zeroshot", workspace, ZeroshotConfig)
        return article_encoder(layout.PRETRAIN.under(workspace), config).to(device).eval()
    directory = layout.DSR.under(workspace, "article_encoder")
    return HierarchicalArticleEncoder.from_pretrained(directory, root=workspace).to(device).eval()


def article_vectors(retriever) -> tuple[np.ndarray, np.ndarray]:
    """``(ids int64 (n,), vectors float32 (n, dim))`` as the system scores them: ids ascending,
    vectors L2-normalised for a cosine system."""
    from lexgraph.search.index import normalise

    vectors = retriever.article_embeddings.numpy()  # (n, dim)
    vectors = normalise(vectors) if retriever.normalize else np.ascontiguousarray(vectors, dtype=np.float32)
    return np.asarray(retriever.article_ids, dtype=np.int64), vectors


def export_system(system: str, workspace: str | os.PathLike, out: str | os.PathLike, device: str = "cpu") -> Path:
    """Write ``system`` of ``workspace`` to the folder ``out`` (module docstring); returns ``out``."""
    import torch

    from lexgraph.core.io import atomic_path, save_tensors, write_json, write_text
    from lexgraph.data.keys import read_keys
    from lexgraph.models.encoders import QueryEncoder
    from lexgraph.models.st_folder import write_st_folder
    from lexgraph.systems.index_record import own_files
    from lexgraph.systems.registry import load_retriever

    check_system(system)
    workspace = Path(workspace)
    out = check_out(out, workspace)
    retriever = load_retriever(system, workspace, device)
    encoder = retriever.query_encoder
    if not isinstance(encoder, QueryEncoder):  # pragma: no cover - every dense loader makes one
        raise LexgraphError(f"{system}: its query encoder is a {type(encoder).__name__}, not a QueryEncoder")
    ids, vectors = article_vectors(retriever)
    keys = read_keys(layout.CLEAN.under(workspace))  # None: BSARD's layout, the integer ids are the user's
    similarity = "cosine" if retriever.normalize else "dot"
    source = os.path.relpath(retriever.source, workspace) if retriever.source else ""
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "system": system,
        "similarity": similarity,
        "dim": int(vectors.shape[1]),
        "articles": int(ids.size),
        "prefix": encoder.prefix,
        "token_pooling": encoder.token_pooling,
        "max_length": encoder.max_length,
        "article_vectors_from": source,
    }
    if keys is not None:
        manifest["article_keys"] = KEYS
    with atomic_path(out, directory=True) as tmp:
        tmp = Path(tmp)
        write_st_folder(tmp, encoder, article_side(system, workspace, device), system, retriever.normalize)
        tensors = {"ids": torch.from_numpy(ids), "vectors": torch.from_numpy(vectors)}
        save_tensors(tensors, tmp / VECTORS, metadata={"system": system, "similarity": similarity})
        if keys is not None:
            write_json([keys.articles[i] for i in ids.tolist()], tmp / KEYS)
        write_text(model_card(manifest, _metrics(workspace, system), _sections(workspace, system)), tmp / CARD)
        write_json({**manifest, **own_files(tmp, MANIFEST)}, tmp / MANIFEST, ensure_ascii=True)  # the last file
    log.info(
        "exported %s (%d article vectors of dim %d, %s) to %s", system, ids.size, vectors.shape[1], similarity, out
    )
    return out


def _usage(system: str) -> list[str]:
    """The model card's "Search in five lines" section."""
    own = (
        "Articles of your own: `model.encode_document(texts)` gives the vectors lexgraph gives "
        f"({ARTICLE_SIDE[system]})."
        if system not in GRAPH_SIDE
        else f"Articles of your own: `{system}`'s article vectors come from the statute graph, not from "
        "texts, so `model.encode_document` refuses; `lexgraph index` builds them for a corpus of yours."
    )
    return [
        "## Search in five lines",
        "",
        "```python",
        "from safetensors.numpy import load_file",
        "from sentence_transformers import SentenceTransformer  # 6 or later",
        'model = SentenceTransformer("OUT", trust_remote_code=True)  # articles: OUT/lexgraph_st.py',
        'articles = load_file("OUT/article_vectors.safetensors")',
        'scores = model.encode_query(["Qui paie la réparation du mur mitoyen ?"]) @ articles["vectors"].T',
        'top10 = articles["ids"][(-scores[0]).argsort(kind="stable")[:10]]  # ties: the lower id first',
        "```",
        "",
        own,
        "",
    ]


def model_card(manifest: dict[str, Any], metrics: dict[str, dict[str, float]], sections: dict[str, Any]) -> str:
    """The export's README.md: front matter for the hub, then metrics, params and usage."""
    import yaml

    system = manifest["system"]
    front = {
        "library_name": "sentence-transformers",
        "language": ["fr"],
        "pipeline_tag": "sentence-similarity",
        "tags": ["sentence-transformers", "feature-extraction", "legal", "statutory-article-retrieval", "lexgraph"],
        "datasets": ["maastrichtlawtech/bsard"],
    }
    names = sorted({metric for values in metrics.values() for metric in values})
    table = (
        ["| split | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        + [
            f"| {split} | " + " | ".join(f"{values.get(m, float('nan')):.4f}" for m in names) + " |"
            for split, values in metrics.items()
        ]
        if metrics
        else ["No metrics: `metrics/" + system + ".json` held none when this was exported."]
    )
    prefix = manifest["prefix"]
    params = yaml.safe_dump(sections, sort_keys=False, allow_unicode=True).strip() if sections else "(no params.yaml)"
    return "\n".join(
        [
            "---",
            yaml.safe_dump(front, sort_keys=False).strip(),
            "---",
            "",
            f"# lexgraph `{system}`: statutory article retrieval (French)",
            "",
            f"lexgraph's `{system}` system, both encoders, with the article vectors it searches "
            f"({manifest['articles']} articles, dim {manifest['dim']}, {manifest['similarity']} similarity).",
            "",
            f"- Query side: {manifest['token_pooling']} pooling, at most {manifest['max_length']} tokens"
            + (
                f", each question prefixed with {json.dumps(prefix)} (the `query` prompt, used by default)."
                if prefix
                else "."
            ),
            f"- Article side: {ARTICLE_SIDE[system]}; `{VECTORS}` holds them (`ids` int64, lexgraph's article ids, "
            f"and `vectors` float32{', L2-normalised' if manifest['similarity'] == 'cosine' else ''}), "
            f"from `{manifest['article_vectors_from']}`."
            + (
                f" `{KEYS}` lists the corpus's own id of each, in the order of `ids`."
                if "article_keys" in manifest
                else ""
            ),
            "",
            *_usage(system),
            "## Metrics (lexgraph's `evaluate` stage)",
            "",
            *table,
            "",
            "## The exact params",
            "",
            "The `params.yaml` sections these artefacts were built with (as the workspace held them at export; "
            "lexgraph refuses to export artefacts whose recorded inputs have changed since):",
            "",
            "```yaml",
            params,
            "```",
            "",
        ]
    )
