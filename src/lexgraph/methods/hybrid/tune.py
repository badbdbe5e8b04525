"""Choosing the ``hybrid`` system on dev (the ``hybrid`` stage).

Choosing the fusion (:func:`tune`, the ``hybrid`` stage): every candidate of the grid
(RRF for each ``k``; ``wsum`` for each normalisation and weight) fuses the same
top-``depth`` lists of the questions of ``hybrid.split`` (never ``test``), the fused
list is scored with :func:`lexgraph.metrics.ir.evaluate_run` at depth
:data:`DEEPEST` (500, what ``evaluate.k`` reads), and the best
``hybrid.metric`` wins; ties go to the first candidate in grid order (RRF by
increasing ``k``, then min-max, then z-scores, by increasing ``w``, then, with
``hybrid.alone``, BM25 alone and the dense system alone: one system is chosen only when
it beats every fusion on dev, and ``hybrid.json`` then says so (``uses`` names the one
system whose ranking ``hybrid`` returns; ``label`` is ``<system> alone``). The dense system
is ``hybrid.dense``, or with ``best`` the dense system with the best ``hybrid.metric``
on that split (ties: the order of :func:`lexgraph.methods.hybrid.system.dense_systems`). The grid is searched here,
not with ``ranx.optimize_fusion``: that one takes ``k`` and weights only as
``range``-like steps, keeps the *last* of tied candidates, scores with ranx's own
metrics on ranx's tie order, and drops weight pairs whose float sum is not exactly 1.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lexgraph.core.config import params_error, refuse_held_out
from lexgraph.core.stage import StageContext, stage_paths
from lexgraph.data.schema import split_questions
from lexgraph.methods.hybrid.system import (
    FORMAT,
    FORMAT_VERSION,
    SECTION,
    SPARSE,
    SPLIT,
    HybridConfig,
    dense_systems,
    grid,
)
from lexgraph.metrics.ir import DEEPEST, evaluate_run, rounded_all
from lexgraph.search.fusion import Fusion, Prepared

log = logging.getLogger(__name__)


def dense_systems_needed(config: HybridConfig) -> tuple[str, ...]:
    """The dense systems the stage must load: ``hybrid.dense``, or all of them for ``best``."""
    return dense_systems() if config.dense == "best" else (config.dense,)


def _score(ids: np.ndarray, qids: Sequence[int], qrels: Mapping[int, Sequence[int]]) -> dict[str, float]:
    """All metrics of a run cut at :data:`DEEPEST` (padding dropped)."""
    run = {q: [d for d in row[:DEEPEST].tolist() if d >= 0] for q, row in zip(qids, ids)}
    return evaluate_run(run, qrels)


def tune(questions, sparse, dense: Mapping[str, Any], config: HybridConfig) -> dict[str, Any]:
    """Choose the dense system and the fusion on ``config.split`` (never the test split).

    ``questions`` is the clean questions table; only the rows of ``config.split`` are
    read. ``sparse`` is the BM25 retriever, ``dense`` maps each name of
    :func:`dense_systems_needed` to its retriever. Returns the content of ``hybrid.json``:
    the choice (``dense``, ``fusion``, ``depth``, ``score``, ``dev`` metrics of the chosen
    fusion), the whole ``grid`` (every candidate with its metrics, in grid order) and the
    ``references`` (BM25 and each dense system alone, same split and depth).
    """
    refuse_held_out(SECTION, "split", config.split, SPLIT)  # also a config that skipped HybridConfig (model_copy)
    qids, texts, qrels = split_questions(questions, config.split)
    if not qids:
        raise params_error(f"'{SECTION}.split' = {config.split!r}, but that split has no questions")
    missing = [name for name in dense_systems_needed(config) if name not in dense]
    if missing:
        raise ValueError(f"tune needs the dense systems {', '.join(missing)}")
    log.info("hybrid: %d %s questions, each system searched to depth %d", len(qids), config.split, config.depth)
    sparse_top = sparse.search(texts, config.depth)  # (n, depth) ids and scores
    dense_tops = {name: dense[name].search(texts, config.depth) for name in dense_systems_needed(config)}
    references = {SPARSE: rounded_all(_score(sparse_top[0], qids, qrels))}
    references |= {name: rounded_all(_score(top[0], qids, qrels)) for name, top in dense_tops.items()}
    for name, values in references.items():
        log.info("hybrid: %s alone on %s: %s %.4f", name, config.split, config.metric, values[config.metric])

    if config.dense == "best":
        # ties: the registry's order of the dense systems (max keeps the first maximum)
        chosen = max(dense_tops, key=lambda name: references[name][config.metric])
        log.info("hybrid: best dense system on %s: %s", config.split, chosen)
    else:
        chosen = config.dense

    prepared = Prepared(sparse_top, dense_tops[chosen])
    rows: list[dict[str, Any]] = []
    for fusion in grid(config):
        ids, _ = prepared.fuse(fusion, DEEPEST)  # (n, DEEPEST)
        metrics = _score(ids, qids, qrels)
        rows.append(
            {
                **fusion.as_dict(),
                "label": fusion.label,
                "score": round(metrics[config.metric], 4),
                config.split: rounded_all(metrics),
                "_exact": metrics[config.metric],
            }
        )
        log.info("hybrid: %-20s %s %.4f", fusion.label, config.metric, metrics[config.metric])
    best = max(rows, key=lambda row: row["_exact"])  # ties: the first in grid order
    for row in rows:
        del row["_exact"]
    fusion = Fusion.from_dict(best)
    uses = [SPARSE] if fusion.method == "bm25" else [chosen] if fusion.method == "dense" else [SPARSE, chosen]
    _log_choice(fusion, uses, best, rows, config)
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "sparse": SPARSE,
        "dense": chosen,
        "dense_param": config.dense,
        "fusion": fusion.as_dict(),
        "label": f"{uses[0]} alone" if fusion.alone else fusion.label,
        "uses": uses,
        "depth": config.depth,
        "split": config.split,
        "metric": config.metric,
        "score": best["score"],
        "score_depth": DEEPEST,
        "n_questions": len(qids),
        config.split: best[config.split],
        "grid": rows,
        "references": references,
    }


def _log_choice(
    fusion: Fusion, uses: list[str], best: Mapping[str, Any], rows: list[dict[str, Any]], config: HybridConfig
) -> None:
    """One line: the choice, and when it is one system alone, the best fusion it beat."""
    if not fusion.alone:
        log.info("hybrid: chose %s, %s on %s %.4f", " + ".join(uses), fusion.label, config.split, best["score"])
        return
    fused = [row for row in rows if not Fusion.from_dict(row).alone]
    runner = max(fused, key=lambda row: row["score"]) if fused else None
    log.info(
        "hybrid: chose %s alone: %s on %s %.4f%s",
        uses[0],
        config.metric,
        config.split,
        best["score"],
        f", above the best fusion ({runner['label']}, {runner['score']:.4f})" if runner else "",
    )


def tune_metrics(report: Mapping[str, Any]) -> dict[str, Any]:
    """The ``metrics/hybrid_tune.json`` summary of a :func:`tune` report."""
    split, metric, dense = report["split"], report["metric"], report["dense"]
    return {
        "split": split,
        "metric": metric,
        "dense": dense,
        **{key: value for key, value in report["fusion"].items() if value is not None},  # no nulls for DVC
        "score": report["score"],
        split: report[split],
        "alone": {SPARSE: report["references"][SPARSE][metric], dense: report["references"][dense][metric]},
    }


HybridPaths = stage_paths("hybrid")


def run_hybrid(paths: HybridPaths, config: HybridConfig, context: StageContext, load) -> None:
    """The ``hybrid`` stage: the fusion chosen on dev -> ``paths.out``/hybrid.json, its grid ->
    ``paths.metrics``."""
    device = str(context.torch_device())
    from lexgraph.core.io import atomic_path, read_parquet, write_json
    from lexgraph.methods.dense import shared_query_encoders
    from lexgraph.methods.hybrid.system import SETTINGS

    questions = read_parquet(paths.questions, ["id", "question", "article_ids", "split"])
    with shared_query_encoders():  # dsr, hprior and gdsr: one DSR query encoder, the questions encoded once
        sparse = load(SPARSE, paths.workspace, device)
        dense = {name: load(name, paths.workspace, device) for name in dense_systems_needed(config)}
        report = tune(questions, sparse, dense, config)
    with atomic_path(paths.out, directory=True) as tmp:
        write_json(report, Path(tmp) / SETTINGS, sort_keys=True)
    write_json(tune_metrics(report), paths.metrics, sort_keys=True)
