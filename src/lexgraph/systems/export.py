"""Trained dense systems for others to load: ``lexgraph export``.

:func:`export_system` writes one dense system of a workspace to a folder that
``sentence_transformers.SentenceTransformer(OUT, trust_remote_code=True)`` loads (sentence-transformers 6):

* both sides of the system as one sentence-transformers model (:mod:`lexgraph.models.st_folder`):
  ``encode_query`` runs the query encoder (a full copy of its backbone and tokenizer, its pooling and
  prefix: the ``query`` prompt, used by default), ``encode_document`` the system's article text
  encoder (its declaration's ``article_encoder``: DSR's hierarchical encoder, zeroshot's windowed mean), whose code
  travels in the folder (``lexgraph_st.py``, :mod:`lexgraph.models.st_article`: the reason for
  ``trust_remote_code``), so a client that encodes articles itself gets lexgraph's vectors. A
  system whose article vectors need the statute graph (its declaration has no ``article_encoder``) has
  an article side that refuses in one line instead of giving another encoder's vectors;
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
the hybrid and the re-rankers have no dense query encoder and are refused (:func:`check_system`).
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


def check_system(system: str):
    """The declaration of ``system``; one that cannot be exported (not dense, or unknown) is refused in
    one sentence."""
    from lexgraph.methods.catalog import names, systems

    spec = systems().get(system)
    if spec is None:
        raise LexgraphError(f"unknown system '{system}'; expected one of {', '.join(names('dense'))}")
    if not spec.dense:
        raise LexgraphError(
            f"--system {system} is {spec.kind} ({spec.summary}), not a dense encoder; "
            f"expected one of {', '.join(names('dense'))}"
        )
    return spec


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


def _sections(workspace: Path, spec) -> dict[str, Any]:
    """The params.yaml sections the system ``spec`` declares it is built from, as written (``gnn``:
    the shared keys and the variant's mapping only); empty when the workspace has no params.yaml."""
    from lexgraph.core.config import read_params

    path = workspace / "params.yaml"
    if not path.is_file():
        return {}
    params = read_params(path)
    picked = {name: params[name] for name in spec.sections if name in params}
    if isinstance(picked.get("gnn"), dict):  # the shared keys and this variant's own mapping
        picked["gnn"] = {k: v for k, v in picked["gnn"].items() if k not in layout.GNN or k == spec.name}
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
    """The text encoder of ``system``'s articles, as its stage encoded them (its declaration's
    ``article_encoder``: DSR's hierarchical encoder, zeroshot's windowed mean); ``None`` for a system
    whose article vectors need the statute graph."""
    spec = check_system(system)
    return spec.article_encoder(Path(workspace), device) if spec.article_encoder is not None else None


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

    spec = check_system(system)
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
        card = model_card(manifest, spec, _metrics(workspace, system), _sections(workspace, spec))
        write_text(card, tmp / CARD)
        write_json({**manifest, **own_files(tmp, MANIFEST)}, tmp / MANIFEST, ensure_ascii=True)  # the last file
    log.info(
        "exported %s (%d article vectors of dim %d, %s) to %s", system, ids.size, vectors.shape[1], similarity, out
    )
    return out


def _usage(spec) -> list[str]:
    """The model card's "Search in five lines" section."""
    own = (
        f"Articles of your own: `model.encode_document(texts)` gives the vectors lexgraph gives ({spec.article_side})."
        if not spec.graph_side
        else f"Articles of your own: `{spec.name}`'s article vectors come from the statute graph, not from "
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


def model_card(manifest: dict[str, Any], spec, metrics: dict[str, dict[str, float]], sections: dict[str, Any]) -> str:
    """The export's README.md (``spec``: the system's declaration): front matter for the hub, then
    metrics, params and usage."""
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
            f"- Article side: {spec.article_side}; `{VECTORS}` holds them (`ids` int64, lexgraph's article ids, "
            f"and `vectors` float32{', L2-normalised' if manifest['similarity'] == 'cosine' else ''}), "
            f"from `{manifest['article_vectors_from']}`."
            + (
                f" `{KEYS}` lists the corpus's own id of each, in the order of `ids`."
                if "article_keys" in manifest
                else ""
            ),
            "",
            *_usage(spec),
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
