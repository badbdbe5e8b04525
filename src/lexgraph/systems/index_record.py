"""``index.json``: what an index of another corpus (``lexgraph index``) holds and which of the
workspace's models built it.

An index directory has the workspace's layout for the corpus side only (``data/clean``,
``models/bm25``, ``data/embed``, ...: :mod:`lexgraph.systems.corpus_index`); the systems that
search it take everything else (query encoders, graph settings, fusion, re-ranker weights) from
the workspace. ``index.json`` records, per system, the digest of each workspace artefact its
vectors were made with (:data:`MODELS`, :func:`lexgraph.core.provenance.identity`), so that
:func:`check_index` refuses, in one line naming ``index.json`` and the artefact, to search an
index with models that changed after it was built (their vectors would not match the questions').
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lexgraph.core import layout
from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.core.inputs import DuplicateKeyError, json_object
from lexgraph.core.provenance import identity

INDEX_FILE = "index.json"
FORMAT = "lexgraph-index"
VERSION = 1

#: system -> the workspace artefacts (files or directories) its side of an index is made with
MODELS: dict[str, tuple[str, ...]] = {
    "bm25": (layout.BM25.path.as_posix(),),  # k1, b and the analyzer
    "zeroshot": (layout.PRETRAIN.path.as_posix(), layout.ZEROSHOT.path.as_posix() + "/zeroshot.json"),
    "dsr": (layout.DSR.path.as_posix(),),
    "hprior": (layout.DSR.path.as_posix(), layout.HPRIOR.path.as_posix() + "/hprior.json"),
    **{v: (layout.DSR.path.as_posix(), a.path.as_posix()) for v, a in layout.GNN.items()},
    "hybrid": (layout.HYBRID.path.as_posix() + "/hybrid.json",),  # its systems are checked as themselves
    **{v: (layout.PRETRAIN.path.as_posix(), a.path.as_posix()) for v, a in layout.RERANKERS.items()},
}


def model_digests(system: str, workspace: str | Path) -> dict[str, str]:
    """``{artefact: digest}`` of the workspace artefacts ``system`` is indexed with."""
    return {path: identity(Path(workspace, path)) for path in MODELS[system]}


def index_record(corpus: Path, sha256: str, counts: dict[str, Any], systems: dict[str, dict[str, str]]) -> dict:
    """The content of ``index.json``: the corpus file's name and digest, counts, and per system the
    digests of :func:`model_digests`."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "corpus": {"file": corpus.name, "sha256": sha256},
        **counts,
        "systems": systems,
    }


def read_index(directory: str | Path) -> dict[str, Any]:
    """``directory/index.json``, checked (a directory without one is not an index)."""
    path = Path(directory) / INDEX_FILE
    fix = "run `lexgraph index --corpus FILE --out DIR` to build it"
    if not path.is_file():
        raise DataError(path, f"not found; expected an index written by `lexgraph index` ({fix})")
    try:
        record = json_object(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, DuplicateKeyError) as exc:
        raise DataError(path, f"unreadable ({type(exc).__name__}); {fix} again") from None
    systems = record.get("systems") if isinstance(record, dict) else None
    if record.get("format") != FORMAT or record.get("version") != VERSION or not isinstance(systems, dict):
        raise DataError(path, f"not an index record (expected format {FORMAT!r} v{VERSION}); {fix} again")
    return record


def check_index(directory: str | Path, system: str, workspace: str | Path) -> None:
    """Refuse (one line naming ``index.json``) to search ``system`` over the index ``directory``
    when the index lacks it or was built by other models than ``workspace`` holds now."""
    from lexgraph.systems.rerank import is_switched_off

    record = read_index(directory)
    path = Path(directory) / INDEX_FILE
    built = record["systems"]
    if system not in built:
        if system in layout.RERANKERS and is_switched_off(Path(workspace), system):
            why = f"{system} is switched off in the workspace (params.yaml 'rerank.{system}.enabled': false)"
            raise LexgraphError(f"{path}: no {system} in this index: {why}")
        raise LexgraphError(
            f"{path}: no {system} in this index (it holds {', '.join(built) or 'no system'}); "
            f"run `lexgraph index` with --systems {system}"
        )
    for artefact, digest in sorted(built[system].items()):
        current = identity(Path(workspace, artefact))
        if current != digest:
            raise LexgraphError(
                f"{path}: {system} was indexed with another {artefact} than the workspace {workspace} holds now "
                "(a different model built this index); run `lexgraph index` again with this workspace"
            )
