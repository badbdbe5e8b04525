"""A BM25 index's files (:meth:`lexgraph.search.bm25.BM25.save` / ``load``): ``index.npz`` (the
raw counts as CSR arrays, the document ids and lengths; no pickle, fixed member timestamps so equal
indexes give equal bytes), ``bm25.json`` (the format, the scoring settings, the counts) and
``vocab.json`` (the terms). Reading checks every file and names the one that is missing, truncated
or inconsistent in one line.

Format versions: 2 (issue 41) holds ``idf`` (``"robertson"`` or ``"lucene"``) and an
``idf_floor`` that may be ``"lucene-min"``; 1, written before, has no ``idf`` (Robertson's) and
its numeric floor (``0.0`` by default then), and is read as such.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from lexgraph.core.errors import LexgraphError
from lexgraph.core.inputs import DuplicateKeyError, json_object
from lexgraph.search.bm25_kernels import ROBERTSON

FORMAT = "lexgraph-bm25"
FORMAT_VERSION = 2  # 2: ``idf`` and a floor that may be "lucene-min" (issue 41); 1 (Robertson's idf) still loads
READABLE = (1, FORMAT_VERSION)
ARRAYS, META, VOCAB = "index.npz", "bm25.json", "vocab.json"
RESTORE = "rerun `dvc repro bm25` (or `dvc checkout`) to restore it"
_NEEDED = {"doc_ids", "doc_len", "tf_indptr", "tf_indices", "tf_data"}
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed member timestamps: byte-identical saves


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """``np.savez`` with fixed member timestamps, so equal arrays give equal bytes."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE)
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


def _json(path: Path, what: str) -> Any:
    try:
        return json_object(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, DuplicateKeyError) as exc:
        raise LexgraphError(f"{path}: truncated or corrupt {what} ({exc}); {RESTORE}") from None


def _check_format(meta, path: Path) -> None:
    """``bm25.json``'s ``format`` and a ``version`` this code reads (:data:`READABLE`), else one line naming it."""
    version = meta.get("version") if isinstance(meta, dict) else None
    if isinstance(meta, dict) and meta.get("format") == FORMAT and type(version) is int and version in READABLE:
        return
    got = meta if not isinstance(meta, dict) else f"{meta.get('format')!r} v{version!r}"
    raise LexgraphError(
        f"{path}: unsupported index format {got}, expected {FORMAT!r} v{' or v'.join(map(str, READABLE))}"
    )


def _check_doc_ids(doc_ids: np.ndarray, doc_len: np.ndarray, path: Path) -> None:
    """Ids as :meth:`BM25.fit` stores them: strictly ascending integers (distinct; column ``j`` is
    ``doc_ids[j]``), one length each. Rotated or permuted ids would score one article, name another."""
    bad = np.flatnonzero(np.diff(doc_ids) <= 0) + 1 if doc_ids.dtype.kind in "iu" and doc_ids.ndim == 1 else [0]
    if len(bad) or doc_len.shape != doc_ids.shape:
        where = f"out of order at position {bad[0]} of {doc_ids.size}" if len(bad) else "not one per 'doc_len'"
        raise LexgraphError(f"{path}: 'doc_ids' {where}, expected strictly ascending article ids; {RESTORE}")


def read_index(directory: Path, settings: Sequence[str]) -> tuple[dict, list[str], dict[str, Any]]:
    """``(the settings named by settings, terms, {"tf", "doc_ids", "doc_len"})`` of the index in
    ``directory``, every file checked (a format-1 ``bm25.json`` read with Robertson's idf)."""
    for name in (ARRAYS, META, VOCAB):
        if not (directory / name).is_file():
            raise LexgraphError(f"{directory}: not a BM25 index (missing {name}); run `dvc repro bm25` first")
    meta = _json(directory / META, "index metadata")
    _check_format(meta, directory / META)
    terms = _json(directory / VOCAB, "vocabulary")
    try:
        with np.load(directory / ARRAYS, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise LexgraphError(f"{directory / ARRAYS}: truncated or corrupt index arrays ({exc}); {RESTORE}") from None
    if _NEEDED - set(arrays):
        raise LexgraphError(f"{directory / ARRAYS}: missing arrays {sorted(_NEEDED - set(arrays))}; {RESTORE}")
    if meta["version"] == 1:  # before issue 41: Robertson's idf, the floor it holds (0.0 by default then)
        meta = {**meta, "idf": ROBERTSON}
    try:
        n_docs, n_terms = int(meta["n_docs"]), int(meta["n_terms"])
        if len(terms) != n_terms or arrays["doc_ids"].size != n_docs:
            raise ValueError("the files disagree on the number of terms or documents")
        chosen = {key: meta[key] for key in settings}
        tf = sp.csr_matrix((arrays["tf_data"], arrays["tf_indices"], arrays["tf_indptr"]), shape=(n_terms, n_docs))
    except (KeyError, TypeError, ValueError) as exc:
        raise LexgraphError(f"{directory}: inconsistent BM25 index ({exc}); {RESTORE}") from None
    _check_doc_ids(arrays["doc_ids"], arrays["doc_len"], directory / ARRAYS)
    return chosen, terms, {"tf": tf, "doc_ids": arrays["doc_ids"], "doc_len": arrays["doc_len"]}
