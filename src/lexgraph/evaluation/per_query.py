"""Per-question results and recall curves of the ``evaluate`` stage.

``metrics/per_query/<split>.csv``: one row per question of the split, sorted by id, with
``id``, ``n_relevant`` (gold articles) and, for every system, ``<system>_recall@100``,
``<system>_ap`` (average precision) and ``<system>_first_rank`` (rank of the first gold
article in the system's top ``evaluate.k``, empty when there is none), then the
``question``. The values are :func:`lexgraph.metrics.ir.per_query`'s, so the mean of a
``<system>_recall@100`` or ``<system>_ap`` column is that system's ``recall@100`` or
``map`` in ``metrics/<system>.json`` (up to rounding).

``metrics/recall_curve_test.csv``: ``k, system, recall`` for k = 1 … 500 and every system
on the test split (mean recall@k over its questions, the same definition as
:func:`lexgraph.metrics.ir.recall_at_k`), drawn by ``dvc plots show`` as one line per system.
Floats are written with 6 decimals; the files are byte-deterministic.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Hashable, Mapping, Sequence
from pathlib import Path

import numpy as np
import polars as pl

from lexgraph.core.io import atomic_path
from lexgraph.data.schema import split_questions
from lexgraph.evaluation.trec import read_trec
from lexgraph.metrics.ir import DEEPEST, per_query

log = logging.getLogger(__name__)

#: Per-question columns of each system, after the system's name and ``_``.
COLUMNS: tuple[str, ...] = ("recall@100", "ap", "first_rank")
CURVE_SPLIT = "test"


def _ranked(ranked: Sequence[int]) -> np.ndarray:
    """``ranked`` as int64 with every id after its first occurrence dropped (as lexgraph.metrics.ir does)."""
    arr = np.asarray(ranked, dtype=np.int64).reshape(-1)
    if arr.size > 1:
        _, first = np.unique(arr, return_index=True)
        arr = arr[np.sort(first)]
    return arr


def first_relevant_rank(ranked: Sequence[int], relevant: Collection[int], k: int) -> int | None:
    """1-based rank of the first relevant article within the top ``k`` of ``ranked``, or ``None``."""
    hits = np.flatnonzero(np.isin(_ranked(ranked)[:k], np.asarray(list(relevant), dtype=np.int64)))
    return int(hits[0]) + 1 if hits.size else None


def per_query_table(
    runs: Mapping[str, Mapping[Hashable, Sequence[int]]],
    qrels: Mapping[Hashable, Collection[int]],
    k: int,
    questions: Mapping[Hashable, str] | None = None,
) -> pl.DataFrame:
    """One row per query of ``qrels`` (sorted by id): ``id``, ``n_relevant``, then
    ``<system>_recall@100``, ``<system>_ap``, ``<system>_first_rank`` for each system of
    ``runs`` (in its order), then ``question`` when ``questions`` is given. A query absent
    from a system's run scores 0 with no first rank."""
    qids = sorted(qrels)
    data: dict[str, list] = {"id": qids, "n_relevant": [len(set(qrels[q])) for q in qids]}
    schema: dict[str, pl.DataType] = {"id": pl.Int64, "n_relevant": pl.Int64}
    for system, run in runs.items():
        scores = per_query(run, {q: qrels[q] for q in qids})
        data[f"{system}_recall@100"] = [scores[q]["recall@100"] for q in qids]
        data[f"{system}_ap"] = [scores[q]["map"] for q in qids]
        data[f"{system}_first_rank"] = [first_relevant_rank(run.get(q, []), qrels[q], k) for q in qids]
        schema |= {f"{system}_recall@100": pl.Float64, f"{system}_ap": pl.Float64, f"{system}_first_rank": pl.Int64}
    if questions is not None:
        data["question"] = [questions[q] for q in qids]
        schema["question"] = pl.String
    return pl.DataFrame(data, schema=schema)


def recall_curve(
    runs: Mapping[str, Mapping[Hashable, Sequence[int]]],
    qrels: Mapping[Hashable, Collection[int]],
    depth: int = DEEPEST,
) -> pl.DataFrame:
    """``k, system, recall``: the mean over the queries of ``qrels`` of recall@k, for
    k = 1 … ``depth`` and each system of ``runs`` (in its order, then by k)."""
    qids = sorted(qrels)
    frames = []
    for system, run in runs.items():
        hits = np.zeros((len(qids), depth), dtype=np.float64)  # (n_queries, depth): 1 where gold
        n_rel = np.empty(len(qids), dtype=np.float64)  # (n_queries,)
        for row, qid in enumerate(qids):
            gold = np.unique(np.asarray(list(qrels[qid]), dtype=np.int64))
            if gold.size == 0:
                raise ValueError(f"query {qid!r} has no relevant articles in the qrels; recall is undefined")
            n_rel[row] = gold.size
            ranked = _ranked(run.get(qid, []))[:depth]
            hits[row, : ranked.size] = np.isin(ranked, gold)
        recall = (np.cumsum(hits, axis=1) / n_rel[:, None]).mean(axis=0) if qids else np.zeros(depth)  # (depth,)
        frames.append(
            pl.DataFrame({"k": np.arange(1, depth + 1, dtype=np.int64), "system": [system] * depth, "recall": recall})
        )
    if not frames:
        return pl.DataFrame(schema={"k": pl.Int64, "system": pl.String, "recall": pl.Float64})
    return pl.concat(frames)


def _write_csv(df: pl.DataFrame, target: str | os.PathLike) -> None:
    with atomic_path(target) as tmp:
        df.write_csv(tmp, float_precision=6, line_terminator="\n")


def write_per_query_reports(
    questions: pl.DataFrame,
    runs_dir: str | os.PathLike,
    systems: Sequence[str],
    splits: Sequence[str],
    k: int,
    out_dir: str | os.PathLike,
    curve_path: str | os.PathLike,
    curve_split: str = CURVE_SPLIT,
    read_run=read_trec,
    names: Mapping[int, str] | None = None,
) -> None:
    """Read the TREC runs ``runs_dir/<system>/<split>.trec`` and write ``out_dir/<split>.csv``
    for every split (the whole directory replaced) and the ``curve_split`` recall curve to
    ``curve_path`` (only its header, with a warning, when that split is not evaluated); ``read_run``
    reads a run (:func:`lexgraph.evaluation.evaluate.run_reader`); ``names``: the user's question ids
    (``fetch.source: corpus``), written in the ``id`` column (rows stay in lexgraph's id order: the file's)."""
    curve = None
    with atomic_path(out_dir, directory=True) as tmp:
        for split in splits:
            qids, texts, qrels = split_questions(questions, split)
            if not qids:
                continue
            runs = {s: read_run(Path(runs_dir) / s / f"{split}.trec") for s in systems}
            table = per_query_table(runs, qrels, k, dict(zip(qids, texts)))
            if names is not None:
                table = table.with_columns(pl.Series("id", [names[q] for q in table["id"].to_list()], dtype=pl.String))
            _write_csv(table, Path(tmp) / f"{split}.csv")
            if split == curve_split:
                curve = recall_curve(runs, qrels, min(DEEPEST, k))
    if curve is None:
        log.warning(
            "split %r is not evaluated (evaluate.splits = %s); %s has no curve", curve_split, list(splits), curve_path
        )
        curve = recall_curve({}, {})
    _write_csv(curve, curve_path)
    log.info("wrote per-question results to %s/ and the %s recall curve to %s", out_dir, curve_split, curve_path)


__all__ = ["COLUMNS", "first_relevant_rank", "per_query_table", "recall_curve", "write_per_query_reports"]
