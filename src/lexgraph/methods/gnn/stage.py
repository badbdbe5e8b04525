"""The ``train_gnn`` stage: read its inputs, train a graph encoder (and refit it on train +
dev, G-DSR appendix B), write the model, metrics and curve; resumable after a kill
(:mod:`lexgraph.training.resume`)."""

from __future__ import annotations

import functools
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from lexgraph.core import layout
from lexgraph.core.errors import DataError
from lexgraph.core.io import write_json
from lexgraph.core.provenance import stage_inputs
from lexgraph.core.stage import StageContext
from lexgraph.graph.hierarchy import best_weight, read_hprior
from lexgraph.methods.gnn.config import GNNSettings
from lexgraph.methods.gnn.data import prepare_training_set
from lexgraph.methods.gnn.io import (
    CURVE,
    QUERY_ENCODER,
    TrainGnnPaths,
    load_query_encoder,
    save_trained,
    training_metrics,
)
from lexgraph.methods.gnn.train import train_graph_encoder
from lexgraph.training.curves import write_curve
from lexgraph.training.engine import Runtime
from lexgraph.training.resume import resumable

log = logging.getLogger("lexgraph.methods.gnn.train")


def refit_epochs(settings: GNNSettings, best_epoch: int) -> int:
    """How many epochs the train+dev refit runs (0: none), each decision logged with its
    reason: the full fixed schedule (``selection: fixed``, G-DSR appendix B) or the epochs
    dev chose (``selection: dev``; none when the untrained model won)."""
    key = f"gnn.{settings.variant}.refit"
    if not settings.refit:
        log.info("%s: no refit on train+dev (%s is false)", settings.variant, key)
        return 0
    if settings.selection == "fixed":
        log.info("%s: refit on train+dev with the full fixed schedule (%d epochs)", settings.variant, settings.epochs)
        return settings.epochs
    if best_epoch < 1:
        log.info(
            "%s: refit skipped: dev chose the untrained encoder (epoch 0), so there are no epochs to refit",
            settings.variant,
        )
        return 0
    log.info("%s: refit on train+dev for the %d epoch(s) dev chose", settings.variant, best_epoch)
    return best_epoch


def first_stage(paths: TrainGnnPaths, variant: str) -> tuple[Path, Path]:
    """``(DSR, its vectors)`` the graph encoder starts from: ``--dsr`` and ``--embed``, or, when both
    are a switched-off stage's placeholders (QABISAR's first stage with ``dsr_qabisar.enabled:
    false``), G-DSR's (``--fallback-dsr``, ``--fallback-embed``), with one log line saying so."""
    from lexgraph.models.dsr import is_disabled

    off = {path: is_disabled(path) for path in (paths.dsr, paths.embed)}
    if len(set(off.values())) > 1:  # one placeholder, one trained: from two different runs
        placeholder, other = (paths.dsr, paths.embed) if off[paths.dsr] else (paths.embed, paths.dsr)
        raise DataError(
            placeholder,
            f"a switched-off stage's placeholder while {other} holds a trained model's output; "
            f"{layout.restore_hint(placeholder)}",
        )
    if not off[paths.dsr]:
        return paths.dsr, paths.embed
    log.info(
        "%s: %s is a placeholder (its stage is switched off: dsr_qabisar.enabled is false); "
        "starting from G-DSR's DSR, %s and %s",
        variant,
        paths.dsr,
        paths.fallback_dsr,
        paths.fallback_embed,
    )
    return paths.fallback_dsr, paths.fallback_embed


def run_train_gnn(paths: TrainGnnPaths, config: GNNSettings, context: StageContext) -> dict[str, Any]:
    """Read the stage inputs, train, write ``paths.out`` (atomic dir) and ``paths.metrics``.

    ``paths.hprior``: the ``hprior`` stage's directory; with ``init: prior`` the encoder starts
    from its best deepest-heading weight on dev (0, i.e. the identity, when dev prefers DSR)."""
    device, seed = context.torch_device(), context.seed
    from lexgraph.core.io import read_parquet
    from lexgraph.encoding.embed import load_embeddings
    from lexgraph.graph.build import load_graph

    variant = config.variant
    questions, negatives = paths.questions, paths.negatives
    dsr, embed = first_stage(paths, variant)
    names = ("articles", "headings", "questions") + (("synthetic",) if config.synthetic else ())
    files = {f"{name}_embeddings": embed / f"{name}.safetensors" for name in names}
    files.update(questions=questions, negatives=negatives, graph=paths.graph / "graph.pt", synthetic=paths.synthetic)
    # hprior's report first: a damaged one stops the stage before the graph and embeddings load
    prior_weight = best_weight(read_hprior(paths.hprior)) if config.encoder.init == "prior" else 0.0
    full_graph = load_graph(paths.graph)
    question_table = read_parquet(questions, ["id", "question", "article_ids", "split"])
    negative_table = None
    if config.hard_negatives:
        negative_table = read_parquet(negatives, ["question_id", "split", "negative_ids"])
    tables = {name: load_embeddings(files[f"{name}_embeddings"]) for name in names}
    synthetic = None
    if config.synthetic:  # G-DSR's augmented set: train + synthetic queries
        synthetic = read_parquet(paths.synthetic, ["id", "question", "article_ids", "split"])
    ts = prepare_training_set(full_graph, question_table, negative_table, tables, config, files, synthetic=synthetic)
    log.info(
        "%s: %d nodes, %d edges, %d train pairs (%d of them synthetic), %d dev questions, device %s",
        variant,
        ts.graph.num_nodes,
        ts.graph.edge_index.size(1),
        ts.pairs.size(0),
        ts.synthetic_pairs,
        len(ts.dev_ids),
        device,
    )
    encoder = load_query_encoder(dsr, ts.x.size(1)) if config.uses_questions else None
    if config.encoder.init == "prior":
        log.info(
            "%s starts as the hierarchy prior with weight %g (hprior's best deepest-heading weight on dev)",
            variant,
            prior_weight,
        )
    runtime = Runtime(device)
    refit_set = functools.partial(  # G-DSR appendix B: train+dev, dev pairs with their BM25 negatives
        prepare_training_set,
        full_graph,
        question_table,
        negative_table,
        tables,
        config,
        files,
        ("train", "dev"),
        synthetic=synthetic,
    )
    with resumable(paths.out, {"config": config, "seed": seed}, stage_inputs(paths), runtime) as resume:
        return _train_and_write(paths, dsr, config, seed, ts, encoder, prior_weight, runtime, resume, refit_set)


def _train_and_write(paths, dsr, settings, seed, ts, encoder, prior_weight, runtime, resume, refit_set):
    """Train (and refit), then write the model, metrics and curve; the summary."""
    variant = settings.variant
    result = train_graph_encoder(
        ts, settings, seed=seed, query_encoder=encoder, runtime=runtime, prior_weight=prior_weight, resume=resume
    )
    summary = training_metrics(result, ts, settings)
    curve = result.history  # the selection run's, as in the summary (a refit has no dev)
    summary["refit"] = None
    epochs = refit_epochs(settings, result.best_epoch)
    if epochs:
        refit_ts = refit_set()
        log.info(
            "%s refit: %d epoch(s) on %d train+dev pairs (%d train and dev questions)",
            variant,
            epochs,
            refit_ts.pairs.size(0),
            len(refit_ts.train_ids),
        )
        result = train_graph_encoder(
            refit_ts,
            replace(settings, epochs=epochs),
            seed=seed,
            runtime=runtime,
            prior_weight=prior_weight,
            select=False,
            resume=resume,
        )
        summary["refit"] = {
            "epochs": epochs,
            "pairs": int(refit_ts.pairs.size(0)),
            "questions": int(len(refit_ts.train_ids)),
            "dev_metrics_of": "the run before the refit (dev is trained on by the refit)",
        }
    if runtime.is_main:  # one writer; the others wait for it
        save_trained(result, ts, settings, paths.out, query_source=dsr / QUERY_ENCODER, first_stage=dsr)
        write_json(summary, paths.metrics)
        write_curve(curve, CURVE, paths.plot)
    runtime.wait()
    return summary
