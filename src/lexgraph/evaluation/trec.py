"""TREC run files (``qid Q0 docid rank score tag`` lines, written and read back) and qrels files
(``qid 0 docid rel`` lines): what ``trec_eval``, ``ranx`` and ``ir_measures`` read. Both spell
an id through :func:`trec_id`, so a run and its qrels name every query and article alike."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from pathlib import Path

import numpy as np

from lexgraph.core.errors import DataError
from lexgraph.core.io import atomic_path

log = logging.getLogger(__name__)


def _check_token(value: str, what: str) -> str:
    if not value or any(ch.isspace() for ch in value):
        raise ValueError(f"TREC {what} must be a non-empty string without whitespace, got {value!r}")
    return value


def trec_id(value: Hashable, what: str = "id") -> str:
    """How runs and qrels spell a query or article id: an integer in decimal digits, anything
    else as ``str(value)``, non-empty and without whitespace (``ValueError`` otherwise)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    return _check_token(str(value), what)


def write_trec(
    path: str | os.PathLike,
    qids: Sequence[Hashable],
    ids: np.ndarray,
    scores: np.ndarray,
    tag: str,
    docids: Mapping[int, str] | None = None,
) -> None:
    """Write a TREC run file atomically.

    ``qids`` has one entry per row of ``ids`` / ``scores`` (both shaped (n, k), each row
    best first). Entries with a negative id are padding (fewer than k hits) and are
    skipped; ranks count the written entries from 1. ``docids`` spells each article id (the
    user's string ids of ``fetch.source: corpus``; the integer otherwise). Note that trec_eval orders by
    score, so ties that ``%.6f`` creates may be re-ordered there; :func:`read_trec`
    orders by the rank column.
    """
    _check_token(tag, "tag")
    ids = np.asarray(ids)
    scores = np.asarray(scores, dtype=np.float64)
    if ids.ndim != 2 or scores.shape != ids.shape:
        raise ValueError(f"ids and scores must both be (n, k) arrays, got {ids.shape} and {scores.shape}")
    if len(qids) != ids.shape[0]:
        raise ValueError(f"got {len(qids)} qids for {ids.shape[0]} rows of ids")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be integers, got dtype {ids.dtype}")
    ids = ids.astype(np.int64, copy=False)
    valid = ids >= 0  # (n, k)
    before = np.where(valid[:, :-1], scores[:, :-1], -np.inf)  # (n, k - 1); no -inf - -inf (a numpy warning)
    if np.any((scores[:, 1:] > before) & valid[:, 1:]):
        log.warning("%s: scores are not non-increasing along some rows; ranks follow the array order", path)
    suffix = f" {tag}\n"
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            for qid, row_ids, row_scores, row_valid in zip(qids, ids, scores, valid):
                q = trec_id(qid, "qid")
                rank = 0
                lines = []
                for doc, score in zip(row_ids[row_valid].tolist(), row_scores[row_valid].tolist()):
                    rank += 1
                    name = docids[doc] if docids is not None else doc
                    lines.append(f"{q} Q0 {trec_id(name, 'docid')} {rank} {score:.6f}{suffix}")
                fh.writelines(lines)
    log.debug("wrote TREC run %s (%d queries)", path, len(qids))


def write_qrels(
    path: str | os.PathLike, qrels: Mapping[Hashable, Collection[int]], docids: Mapping[int, str] | None = None
) -> None:
    """Write TREC qrels atomically: a ``qid 0 docid 1`` line per relevant article.

    Queries in the order of ``qrels``, each one's articles ascending and once; ids spelt by
    :func:`trec_id`, as :func:`write_trec` spells them, so ``trec_eval QRELS RUN`` (and
    ``ranx``, ``ir_measures``, ``pytrec_eval``) scores a run with them. A query without a
    relevant article is refused (``ValueError``): every metric divides by their number.
    """
    lines = []
    for qid, relevant in qrels.items():
        q = trec_id(qid, "qid")
        docs = sorted({int(doc) for doc in relevant})
        if not docs:
            raise ValueError(f"query {q} has no relevant article; qrels need at least one per query")
        lines += [f"{q} 0 {trec_id(docids[doc] if docids is not None else doc, 'docid')} 1\n" for doc in docs]
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            fh.writelines(lines)
    log.debug("wrote TREC qrels %s (%d queries)", path, len(qrels))


def read_trec(
    path: str | os.PathLike,
    *,
    qid_type: Callable[[str], Hashable] = int,
    docids: Mapping[str, int] | None = None,
) -> dict[Hashable, list[int]]:
    """Read a TREC run file into ``{qid: [docid, ...]}`` ordered by the rank column.

    Query ids are converted with ``qid_type`` (``int`` by default, as question ids are
    integers in this project; pass ``str`` for free-form ids). Raises
    :class:`~lexgraph.core.errors.DataError` naming the line for a line without six fields,
    a non-integer docid or rank, a non-numeric score, an unconvertible qid or a docid
    or rank repeated within a query. ``docids`` reads the user's string ids of a run that
    :func:`write_trec` wrote with them back into lexgraph's integer ids.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "TREC run file not found")
    entries: dict[Hashable, list[tuple[int, int, int]]] = {}
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 6:
                raise DataError(
                    path, f"expected 6 fields 'qid Q0 docid rank score tag', found {len(fields)}", row=line_no
                )
            q_raw, _, doc_raw, rank_raw, score_raw, _ = fields
            try:
                qid = qid_type(q_raw)
            except ValueError as exc:
                raise DataError(path, f"query id {q_raw!r} is not a valid {qid_type.__name__}", row=line_no) from exc
            if docids is not None and doc_raw in docids:
                doc_raw = str(docids[doc_raw])
            try:
                doc, rank = int(doc_raw), int(rank_raw)
            except ValueError as exc:
                raise DataError(
                    path, f"docid and rank must be integers, found {doc_raw!r} and {rank_raw!r}", row=line_no
                ) from exc
            try:
                float(score_raw)
            except ValueError as exc:
                raise DataError(path, f"score must be a number, found {score_raw!r}", row=line_no) from exc
            entries.setdefault(qid, []).append((rank, line_no, doc))
    run: dict[Hashable, list[int]] = {}
    for qid, rows in entries.items():
        rows.sort()
        docs = [doc for _, _, doc in rows]
        if len(set(docs)) != len(docs):
            seen: set[int] = set()
            for _, line_no, doc in rows:
                if doc in seen:
                    raise DataError(path, f"docid {doc} appears twice for query {qid!r}", row=line_no)
                seen.add(doc)
        for (rank_a, _, _), (rank_b, line_no, _) in zip(rows, rows[1:]):
            if rank_a == rank_b:
                raise DataError(path, f"rank {rank_b} appears twice for query {qid!r}", row=line_no)
        run[qid] = docs
    return run
