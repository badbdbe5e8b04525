"""The ``rerank`` stage (one re-ranker: ``--variant mvcl | xrerank``): its paths, its inputs
(the frozen PLM's cached states, or token ids for a fine-tuned PLM), the first stage's lists,
training (:mod:`lexgraph.methods.rerank.train`) and its outputs."""

from __future__ import annotations

import logging

import torch

from lexgraph.core.provenance import stage_inputs
from lexgraph.core.stage import StageContext, stage_paths
from lexgraph.methods.rerank.config import RerankConfig
from lexgraph.methods.rerank.features import StoreSource
from lexgraph.methods.rerank.report import curve_columns
from lexgraph.methods.rerank.train import first_stage_lists, train
from lexgraph.training.resume import resumable

log = logging.getLogger("lexgraph.methods.rerank.train")


RerankPaths = stage_paths("rerank")


def run_rerank(paths: RerankPaths, config: RerankConfig, context: StageContext, load_first) -> None:
    """The rerank stage for one re-ranker: its inputs (cached or encoded frozen states, or
    token ids for a fine-tuned PLM), the first stage's lists (``load_first()``: the first
    stage's retriever, loaded by the caller's registry), training, and the outputs."""
    device, seed = context.torch_device(), context.seed
    from lexgraph.core.io import read_parquet, write_json
    from lexgraph.methods.rerank.features import DISABLED, frozen_stores, write_disabled
    from lexgraph.methods.rerank.io import save_model
    from lexgraph.metrics.ir import DEEPEST
    from lexgraph.training.curves import write_curve

    columns = curve_columns(config)
    if not config.enabled:
        write_disabled(paths.out, config.variant)
        write_json(dict(DISABLED), paths.metrics)
        write_curve([], columns, paths.plot)
        return
    questions = read_parquet(paths.questions, ["id", "question", "article_ids", "split"])
    articles = read_parquet(paths.articles, ["id", "article"])
    first = load_first()
    train_lists = first_stage_lists(first, questions, "train", config.k)
    dev_lists = first_stage_lists(first, questions, config.split, max(config.k, DEEPEST))
    plm = tokenizer = None
    source = StoreSource(articles, questions, config, paths.pretrain, seed)
    if config.plm == "finetune":
        stores, plm, tokenizer = _plm_inputs(source, device)
    else:
        stores = frozen_stores(source, paths.features, device)
    settings = {"config": config, "seed": seed, "first_stage": [train_lists, dev_lists]}
    with resumable(paths.out, settings, stage_inputs(paths)) as resume:
        model, report = train(config, *stores, train_lists, dev_lists, device, seed, plm=plm, resume=resume)
        save_model(model, config, report, paths.out, plm=plm, tokenizer=tokenizer, base_dir=paths.pretrain)
        write_json(report, paths.metrics)
        write_curve(report["history"], columns, paths.plot)


def _plm_inputs(source: StoreSource, device: torch.device):
    """``((articles, questions, views) as PLMTokens, plm, tokenizer)`` of ``source`` for a fine-tuned
    PLM (with ``plm_layers``, its top blocks only, the states below them cached: :func:`plm_stores`)."""
    from lexgraph.core.settings import settings_of
    from lexgraph.methods.rerank.config import SECTION
    from lexgraph.methods.rerank.plm import load_plm, plm_stores

    config = source.config
    plm, tokenizer, query_prefix, passage_prefix = load_plm(source.pretrain_dir, device)
    inputs = source.token_inputs(tokenizer, query_prefix, passage_prefix, config.truncation)
    log.info("%s: fine-tuning the PLM %s; element indicator: %s", config.variant, source.pretrain_dir, inputs.stats)
    with settings_of(SECTION, {"plm_layers": config.key("plm_layers")}):  # more than the PLM's blocks
        stores = plm_stores(inputs, plm, tokenizer.pad_token_id, config.plm_layers, config.encode_batch_size, device)
    return stores, plm, tokenizer
