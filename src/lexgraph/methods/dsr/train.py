"""Contrastive training of the dense statute retriever (DSR).

Follows G-DSR (Louis, van Dijck & Spanakis, EACL 2023, Sections 3.1–3.2 and 4):

* training pairs: every (train question, gold article) pair, plus the synthetic
  (doc2query question, article) pairs when ``dsr.synthetic`` is true — all of them
  every epoch (paper), or a fresh seeded subset of ``dsr.synthetic_per_epoch`` per
  epoch (keeps the CPU sample fast);
* for each pair, one BM25 hard negative drawn (seeded, redrawn every epoch) from that
  question's mined negatives — or, for a question without negatives, a random
  non-gold article;
* InfoNCE over in-batch negatives + the batch's hard negatives, cosine / temperature
  (``dsr.similarity: cosine``, G-DSR §4.2) or dot product / temperature (``dot``: QABISAR §2.1,
  ``train_dsr_qabisar``), other gold articles of a query masked out of its denominator
  (:class:`~lexgraph.losses.InfoNCELoss`);
* AdamW (betas 0.9/0.999, eps 1e-7, weight decay on all but biases and LayerNorm
  weights), linear warm-up over ``warmup_ratio`` of the steps then linear decay,
  gradient clipping, mixed precision on CUDA (bf16, or fp16 with a GradScaler);
* model selection: before training (epoch 0) and after each epoch the whole corpus is
  encoded and dev questions are ranked by exact top-200 of the same score; the epoch with the best
  dev recall@200 is kept — epoch 0 included, so training never ends below its start;
* refit (``dsr.refit``, G-DSR appendix B): once that epoch E is chosen, the model goes
  back to its start weights and trains on the train + dev pairs for exactly E epochs,
  the last one kept (:func:`train_and_refit`); dev then is no longer held out for it.

QABISAR's first stage (``train_dsr_qabisar``, :func:`run_train_dsr_qabisar`) is this training with
the ``dsr_qabisar`` keys in place of the ``dsr`` section's (the dot product, no synthetic pairs); with
``dsr_qabisar.enabled: false`` it writes a placeholder (:func:`lexgraph.models.dsr.write_disabled`).

``chunk_encoder: frozen`` (embedded sample, CPU): the article side's backbone does not
train; its chunk vectors come from the ``encode_chunks`` cache (:mod:`lexgraph.encoding.chunks`)
and only the chunk-level Transformer (``chunk_lr``) and the query encoder's top
``query_trainable_layers`` blocks train. ``finetune`` (paper): everything trains.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lexgraph.core.config import seed_everything
from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.core.io import atomic_path, write_json, write_text
from lexgraph.core.provenance import stage_inputs
from lexgraph.core.stage import StageContext, stage_paths
from lexgraph.losses.InfoNCELoss import InfoNCELoss
from lexgraph.methods.dsr.config import EVAL_CUTOFF, QABISAR_SECTION, SECTION, DSRConfig, QabisarDSRSettings, build_dsr
from lexgraph.methods.dsr.data import Pair, TrainingData, load_training_data, sample_negatives
from lexgraph.metrics.ir import rounded, rounded_all
from lexgraph.models.dsr import DSR
from lexgraph.models.packing import host_to_device, plan_chunks, trimmed_length
from lexgraph.training.engine import (
    FitConfig,
    ParamGroup,
    Runtime,
    TrainResult,
    build_optimizer,
    build_scheduler,
    fit,
)
from lexgraph.training.resume import Resume, resumable

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------


def evaluate_dsr(model: DSR, data: TrainingData, batch_size: int) -> dict[str, float]:
    """Dev metrics of ``model``: whole corpus encoded, exact top-:data:`~lexgraph.metrics.ir.DEEPEST`
    by the model's own score (cosine, or the dot product)."""
    from lexgraph.metrics.ir import dense_run_metrics

    order = np.argsort(np.asarray(data.article_ids, dtype=np.int64), kind="stable")
    if data.chunks is not None:  # frozen chunk encoder: aggregate the cached chunk vectors
        from lexgraph.encoding.chunks import embed_from_chunks

        rows = data.chunks.rows(np.asarray(data.article_ids, dtype=np.int64)[order])
        articles = embed_from_chunks(model.article_encoder, data.chunks, rows)  # (na, dim)
    else:
        articles = model.encode_articles(
            [data.article_texts[i] for i in order], batch_size=batch_size, desc="dev: encode corpus"
        )  # (na, dim)
    queries = model.encode_queries(data.dev_questions, batch_size=batch_size, desc="dev: encode questions")  # (nq, dim)
    ids = np.asarray(data.article_ids, dtype=np.int64)[order]
    cosine = model.similarity_name == "cosine"
    return dense_run_metrics(queries, articles, ids, data.dev_ids, data.dev_qrels, normalize=cosine)


# ---------------------------------------------------------------------------
# Training loop
# ---------------------------------------------------------------------------


@dataclass
class DSRTrainResult(TrainResult):
    """:class:`~lexgraph.training.engine.TrainResult` of ``train_dsr`` (``model``: the
    :class:`DSR`), with its training time and epoch size."""

    train_seconds: float
    n_pairs: int  # pairs seen per epoch


def default_layout(device: torch.device) -> str:
    """The article side's layout of the training step on ``device`` (docs/scale.md): length
    buckets (``packed``) on a CPU, where they compute less and each call costs little; one call
    over the real chunks (``padded``) on a GPU, where the step is launch-bound (issue 43: on an
    H100, ``real`` 208 pairs/s against 111 for buckets at batch 24)."""
    return "padded" if torch.device(device).type == "cuda" else "packed"


class DSRTask:
    """:class:`~lexgraph.training.engine.TrainingTask` of the DSR: seeded global batches
    of pairs, one BM25 hard negative per pair, InfoNCE; dev recall@200 selection."""

    def __init__(self, model: DSR, data: TrainingData, config: DSRConfig, runtime, seed: int) -> None:
        self.model, self.data, self.config, self.runtime, self.seed = model, data, config, runtime, seed
        self.device = runtime.device
        self.frozen = data.chunks is not None
        self.chunks = (
            {} if self.frozen else dict(zip(data.article_ids, model.article_encoder.chunk(data.article_texts)))
        )
        self.pad_id = model.article_encoder.tokenizer.pad_token_id
        self.layout = default_layout(self.device)  # the article side's layout (lexgraph.models.packing.LAYOUTS)
        self.stable_queries = self.device.type == "cuda"  # questions padded to few lengths (docs/scale.md)
        n_synthetic = len(data.synthetic_pairs)
        if config.synthetic_per_epoch is not None:
            n_synthetic = min(n_synthetic, config.synthetic_per_epoch)
        self.n_synthetic = n_synthetic
        self.epoch_size = len(data.pairs) + n_synthetic
        self.steps_per_epoch = math.ceil(self.epoch_size / config.batch_size)
        self.rng: np.random.Generator | None = None
        self.epoch = 0

    def modules(self) -> list[nn.Module]:
        return [self.model]

    def train(self) -> None:
        self.model.train()

    def batches(self, epoch: int):
        """Pairs in a seeded order (a fresh synthetic subset when ``synthetic_per_epoch``);
        the same generator then draws the negatives of this process's pairs."""
        data, config = self.data, self.config
        self.epoch = epoch
        self.rng = rng = np.random.default_rng([self.seed, epoch])
        pairs = list(data.pairs)
        if self.n_synthetic == len(data.synthetic_pairs):
            pairs += data.synthetic_pairs
        else:  # a fresh seeded subset every epoch
            pairs += [
                data.synthetic_pairs[i]
                for i in sorted(rng.choice(len(data.synthetic_pairs), self.n_synthetic, replace=False).tolist())
            ]
        order = rng.permutation(len(pairs))
        for step in range(self.steps_per_epoch):
            yield [pairs[i] for i in order[step * config.batch_size : (step + 1) * config.batch_size]]

    def query_inputs(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """The questions' ``input_ids``/``attention_mask`` ``(B, seq)`` on the host; with
        ``stable_queries`` padded to a multiple of 32 tokens (at most the query length), so that
        the query backbone sees few shapes."""
        inputs = self.model.query_encoder.tokenize(texts)  # (B, seq) each
        if not self.stable_queries:
            return inputs
        seq = inputs["input_ids"].size(1)
        width = max(seq, trimmed_length(seq, self.model.query_encoder.max_length, 32))
        pad = self.model.query_encoder.tokenizer.pad_token_id
        return {
            "input_ids": torch.nn.functional.pad(inputs["input_ids"], (0, width - seq), value=pad),
            "attention_mask": torch.nn.functional.pad(inputs["attention_mask"], (0, width - seq), value=0),
        }

    def step(self, batch: list[Pair]) -> torch.Tensor:
        """The loss of ``batch``; every input is laid out on the host (the article side by
        :func:`~lexgraph.models.packing.plan_chunks` in ``self.layout``) and sent to the device
        without waiting, so the step reads nothing back from it."""
        model, data, device = self.model, self.data, self.device
        negatives = sample_negatives(batch, data.article_ids, self.rng)
        columns = [p.positive for p in batch] + negatives
        queries = host_to_device(self.query_inputs([p.query for p in batch]), device)
        mask = host_to_device(InfoNCELoss.shared_positive_mask([p.gold for p in batch], columns), device)  # (B, 2B)
        encoder = model.article_encoder
        with self.runtime.autocast():
            q = model.encode_query(**queries)  # (B, dim)
            if self.frozen:  # a chunk table holds at least one chunk per text: nothing to check on the device
                cached = data.chunks.padded(data.chunks.rows(columns))  # (2B, c, dim), (2B, c), (2B, c)
                a = encoder.aggregate(*host_to_device(cached, device), check=False)  # (2B, dim)
            else:
                docs = [self.chunks[a] for a in columns]
                plan = plan_chunks(docs, self.pad_id, encoder.max_chunk_length, encoder.max_chunks, self.layout)
                a = encoder.forward_planned(host_to_device(plan, device))  # (2B, dim)
        return model.criterion(q, a[: len(batch)], a[len(batch) :], other_positives=mask)

    def evaluate(self) -> dict[str, float]:
        return evaluate_dsr(self.model, self.data, self.config.eval_batch_size) if self.data.dev_qrels else {}

    def nan_error(self, value: float, epoch: int, step: int) -> LexgraphError:
        return LexgraphError(
            f"train_dsr: the loss became {value} at epoch {epoch}, step {step}; "
            f"lower '{SECTION}.lr' (now {self.config.lr}) or raise '{SECTION}.temperature'"
        )


def dsr_optimization(task: DSRTask, select: bool = True):
    """``train_dsr``'s optimizer (AdamW: the chunk-level module at ``chunk_lr``), its schedule
    and :class:`~lexgraph.training.engine.FitConfig` for ``task``."""
    model, config = task.model, task.config
    total = task.steps_per_epoch * config.epochs
    chunk_level = {id(p) for n, p in model.article_encoder.named_parameters() if not n.startswith("backbone.")}
    params = list(model.parameters())
    optimizer = build_optimizer(
        [
            ParamGroup([p for p in params if id(p) not in chunk_level], config.lr, config.weight_decay),
            ParamGroup([p for p in params if id(p) in chunk_level], config.chunk_lr or config.lr, config.weight_decay),
        ],
        [model],
        eps=1e-7,
    )
    scheduler = build_scheduler(optimizer, "linear", int(config.warmup_ratio * total), total)
    fit_config = FitConfig(
        name="train_dsr",
        epochs=config.epochs,
        steps_per_epoch=task.steps_per_epoch,
        max_grad_norm=config.max_grad_norm,
        accumulation_steps=config.accumulation_steps,
        selection_metric=f"recall@{EVAL_CUTOFF}" if select else None,
        select_epoch_zero=select,
    )
    return optimizer, scheduler, fit_config


def train_dsr(
    model: DSR,
    data: TrainingData,
    config: DSRConfig,
    device: torch.device,
    seed: int,
    runtime: Runtime | None = None,
    *,
    select: bool = True,
    resume: Resume | None = None,
) -> DSRTrainResult:
    """Train ``model`` in place on ``data`` (:func:`lexgraph.training.engine.fit`) and
    return it at its best dev epoch (``select`` false: no dev evaluation, the last epoch)."""
    if not data.pairs and not data.synthetic_pairs:
        raise DataError("questions", "no training pairs")
    runtime = runtime or Runtime(device)
    model.to(runtime.device)
    torch.manual_seed(seed)  # dropout masks
    start = time.perf_counter()
    task = DSRTask(model, data, config, runtime, seed)
    log.info(
        "%d pairs per epoch (%d real, %d of %d synthetic)",
        task.epoch_size,
        len(data.pairs),
        task.n_synthetic,
        len(data.synthetic_pairs),
    )
    optimizer, scheduler, fit_config = dsr_optimization(task, select)
    result = fit(task, optimizer, scheduler, fit_config, runtime, resume.next_fit() if resume else None)
    seconds = time.perf_counter() - start
    log.info("trained in %.1f s", seconds)
    return DSRTrainResult(
        model, result.best_epoch, result.dev_metrics or None, result.history, seconds, task.epoch_size
    )


def train_and_refit(
    model: DSR, data: TrainingData, config: DSRConfig, runtime: Runtime, seed: int, resume: Resume | None = None
) -> tuple[DSRTrainResult, DSRTrainResult | None]:
    """:func:`train_dsr` (the selection run), then, with ``config.refit``, the refit of G-DSR
    (appendix B): ``model`` back at its start weights (a copy taken before the selection run),
    trained with the same seed on the train + dev pairs (``data.dev_pairs``; the synthetic ones
    as before) for E epochs with no model selection, its schedule spanning the refit's steps.
    E is ``config.epochs`` with ``selection: fixed`` (Table 5's fixed schedule; the selection run
    keeps its last epoch and dev is scored for the report), else the best dev epoch; E = 0 (the
    untrained model won on dev): it stays, no refit. Every refit and skipped refit is logged.
    Returns (selection run, refit run or None); ``model`` ends as the one to keep. Both runs share
    ``runtime`` (the stage's, which its resume points use too) and train on its device.
    """
    device = runtime.device
    select = config.selection == "dev"
    if not config.refit:
        log.info("refit: skipped, '%s.refit' is false (the model kept is the selection run's)", SECTION)
        return train_dsr(model, data, config, device, seed, runtime, select=select, resume=resume), None
    if not data.dev_pairs:
        raise DataError("questions", f"'{SECTION}.refit' is true but there is no dev question to refit on")
    start = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    selection = train_dsr(model, data, config, device, seed, runtime, select=select, resume=resume)
    epochs = selection.best_epoch if select else config.epochs
    if epochs == 0:
        log.info("refit: skipped, the untrained model won on dev (best epoch 0): it is kept as is")
        return selection, None
    model.load_state_dict(start)
    both = replace(data, pairs=[*data.pairs, *data.dev_pairs], dev_pairs=[], dev_questions=[], dev_qrels={}, dev_ids=[])
    log.info(
        "refit: on train + dev, %d pairs (%d train, %d dev, %d of them with BM25 negatives) for %d epochs (%s)",
        len(both.pairs),
        len(data.pairs),
        len(data.dev_pairs),
        sum(1 for p in data.dev_pairs if p.negatives),
        epochs,
        "chosen on dev" if select else f"'{SECTION}.selection' is fixed: the full schedule",
    )
    refit = train_dsr(
        model, both, config.model_copy(update={"epochs": epochs}), device, seed, runtime, select=False, resume=resume
    )
    return selection, refit


# ---------------------------------------------------------------------------
# Stage entry point
# ---------------------------------------------------------------------------


def curve_csv(history: Sequence[dict[str, float]]) -> str:
    """Per-epoch ``epoch,loss,dev_recall@200`` CSV (for ``dvc plots``)."""
    key = f"dev_recall@{EVAL_CUTOFF}"
    lines = [f"epoch,loss,{key}"]
    lines += [f"{int(r['epoch'])},{r['loss']:.6f},{r.get(key, float('nan')):.6f}" for r in history]
    return "\n".join(lines) + "\n"


TrainDsrPaths = stage_paths("train_dsr")


def run_train_dsr(paths: TrainDsrPaths, config: DSRConfig, context: StageContext) -> dict[str, Any]:
    """The ``train_dsr`` stage: read inputs, train, write model/metrics/curve atomically."""
    device, seed = context.torch_device(), context.seed
    log.info("train_dsr config: %s", config.model_dump())
    pretrained = paths.pretrained
    if not Path(pretrained).is_dir():
        raise DataError(pretrained, "pretrained model directory not found (run `dvc repro pretrain`)")
    data = load_training_data(
        paths.articles, paths.questions, paths.synthetic, paths.negatives, config.synthetic, config.refit
    )
    seed_everything(seed)
    model = build_dsr(config, pretrained)
    if config.chunk_encoder == "frozen":
        from lexgraph.encoding.chunks import check_settings, load_chunk_table

        cache = Path(paths.chunks) / "articles.safetensors"
        data.chunks = load_chunk_table(cache)
        check_settings(data.chunks, model.article_encoder, cache)
        try:
            data.chunks.rows(data.article_ids)
        except KeyError as exc:
            raise DataError(cache, f"article {exc.args[0]} has no cached chunks; run `dvc repro`") from None
    runtime = Runtime(device)
    with resumable(paths.out, {"config": config, "seed": seed}, stage_inputs(paths), runtime) as resume:
        return _train_and_write(paths, config, data, model, seed, runtime, resume)


def _train_and_write(paths, config, data, model, seed, runtime, resume) -> dict[str, Any]:
    """Train (and refit), then write the model, metrics and curve; the summary."""
    result, refit = train_and_refit(model, data, config, runtime, seed, resume)
    summary: dict[str, Any] = {
        "best_epoch": result.best_epoch,
        f"dev_recall@{EVAL_CUTOFF}": rounded(result.dev_metrics[f"recall@{EVAL_CUTOFF}"])
        if result.dev_metrics
        else None,
        "epochs": config.epochs,
        "pairs_per_epoch": result.n_pairs,
        "train_pairs": len(data.pairs),
        "synthetic_pairs": len(data.synthetic_pairs),
        "dev": rounded_all(result.dev_metrics) if result.dev_metrics else None,
    }
    if config.refit:  # dev numbers and curve: the selection run's; a refit model was trained on dev
        n_refit = len(data.pairs) + len(data.dev_pairs)
        summary["refit"] = {"epochs": refit.best_epoch, "pairs": n_refit} if refit else None
        summary["dev_metrics_of"] = "selection run"
        summary["dev_held_out"] = refit is None  # for the written model
    if runtime.is_main:  # one writer; the others wait for it
        with atomic_path(paths.out, directory=True) as tmp:
            (refit or result).model.save(
                tmp, backbone_source=paths.pretrained if config.chunk_encoder == "frozen" else None
            )
        write_json(summary, paths.metrics)
        write_text(curve_csv(result.history), paths.plot)
    runtime.wait()
    return summary


def run_train_dsr_qabisar(paths: TrainDsrPaths, config: QabisarDSRSettings, context: StageContext) -> dict[str, Any]:
    """The ``train_dsr_qabisar`` stage: :func:`run_train_dsr` with QABISAR's recipe, or, with
    ``dsr_qabisar.enabled: false``, a placeholder model directory, ``{"enabled": false}`` metrics and
    the curve's header alone (in seconds; ``train_gnn@qabisar`` then starts from G-DSR's DSR).
    ``base.device`` is checked either way."""
    context.torch_device()  # a device the machine lacks is refused even when the stage writes placeholders
    if config.enabled:
        return run_train_dsr(paths, config.recipe, context)
    from lexgraph.models.dsr import write_disabled

    key = f"{QABISAR_SECTION}.enabled"
    write_disabled(paths.out, f"'{key}' is false (`dvc exp run -S {key}=true` trains it)")
    summary: dict[str, Any] = {"enabled": False}
    write_json(summary, paths.metrics)
    write_text(curve_csv([]), paths.plot)
    return summary
