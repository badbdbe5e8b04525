"""Contrastive training of the dense statute retriever (DSR).

Follows G-DSR (Louis, van Dijck & Spanakis, EACL 2023, Sections 3.1–3.2 and 4):

* training pairs: every (train question, gold article) pair, plus the synthetic
  (doc2query question, article) pairs when ``dsr.synthetic`` is true — all of them
  every epoch (paper), or a fresh seeded subset of ``dsr.synthetic_per_epoch`` per
  epoch (keeps the CPU sample fast);
* for each pair, one BM25 hard negative drawn (seeded, redrawn every epoch) from that
  question's mined negatives — or, for a question without negatives, a random
  non-gold article;
* InfoNCE over in-batch negatives + the batch's hard negatives, cosine / temperature,
  other gold articles of a query masked out of its denominator
  (:class:`~lexgraph.losses.InfoNCELoss`);
* AdamW (betas 0.9/0.999, eps 1e-7, weight decay on all but biases and LayerNorm
  weights), linear warm-up over ``warmup_ratio`` of the steps then linear decay,
  gradient clipping, mixed precision on CUDA (bf16, or fp16 with a GradScaler);
* model selection: before training (epoch 0) and after each epoch the whole corpus is
  encoded and dev questions are ranked by exact cosine top-200; the epoch with the best
  dev recall@200 is kept — epoch 0 included, so training never ends below its start;
* refit (``dsr.refit``, G-DSR appendix B): once that epoch E is chosen, the model goes
  back to its start weights and trains on the train + dev pairs for exactly E epochs,
  the last one kept (:func:`train_and_refit`); dev then is no longer held out for it.

``chunk_encoder: frozen`` (embedded sample, CPU): the article side's backbone does not
train; its chunk vectors come from the ``encode_chunks`` cache (:mod:`lexgraph.chunks`)
and only the chunk-level Transformer (``chunk_lr``) and the query encoder's top
``query_trainable_layers`` blocks train. ``finetune`` (paper): everything trains.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from lexgraph.config import bad_value, expectation, section_config, seed_everything
from lexgraph.errors import ConfigError, DataError, LexgraphError
from lexgraph.io import atomic_path, read_parquet, write_json, write_text
from lexgraph.losses.InfoNCELoss import InfoNCELoss
from lexgraph.models.article_encoder import HierarchicalArticleEncoder
from lexgraph.models.dsr import DSR
from lexgraph.models.encoders import QueryEncoder
from lexgraph.models.packing import pack_chunks
from lexgraph.training.engine import FitConfig, ParamGroup, Runtime, build_optimizer, build_scheduler, fit

log = logging.getLogger(__name__)

SECTION = "dsr"
EVAL_CUTOFF = 200  # model selection: dev recall@200 (G-DSR)


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


_CHOICES = {
    "article_init": ("pretrain", "base"),
    "query_init": ("pretrain", "base"),
    "chunk_encoder": ("finetune", "frozen"),
    "pooling": ("max", "mean", "token_mean"),
    "token_pooling": ("cls", "mean"),
}
_POSITIVE = {"expected": "a positive integer"}


def _one_of(key: str) -> dict[str, str]:
    return {"expected": f"one of {', '.join(_CHOICES[key])}"}


@dataclass(frozen=True)
class DSRConfig:
    """The ``dsr`` section of ``params.yaml`` (see the comments there); every key is required."""

    article_init: str = field(default="pretrain", metadata=_one_of("article_init"))
    query_init: str = field(default="pretrain", metadata=_one_of("query_init"))
    base_model: str = "random"  # HF name/dir, or `random` (pretrain's config, random weights)
    synthetic: bool = True
    # synthetic pairs drawn per epoch (None: all)
    synthetic_per_epoch: int | None = field(default=None, metadata={"expected": "null or a positive integer"})
    chunk_encoder: str = field(default="finetune", metadata=_one_of("chunk_encoder"))  # frozen: cached chunk vectors
    # None: all weights; N: top N blocks (embeddings frozen)
    query_trainable_layers: int | None = field(default=None, metadata={"expected": "null or an integer >= 0"})
    chunk_identity_init: bool = False  # identity-initialised (pre-LN, zero residual) chunk Transformer
    chunk_lr: float | None = field(default=None, metadata={"expected": "null or a positive number"})  # None: lr
    pooling: str = field(default="max", metadata=_one_of("pooling"))  # over chunks
    token_pooling: str = field(default="cls", metadata=_one_of("token_pooling"))  # over a question's / chunk's tokens
    max_chunk_length: int = field(default=128, metadata=_POSITIVE)
    max_document_length: int = field(default=1024, metadata=_POSITIVE)
    max_query_length: int = field(default=512, metadata=_POSITIVE)
    chunk_layers: int = field(default=2, metadata=_POSITIVE)
    chunk_heads: int = field(default=12, metadata=_POSITIVE)
    temperature: float = field(default=0.01, metadata={"expected": "a positive number"})
    epochs: int = field(default=15, metadata=_POSITIVE)
    batch_size: int = field(default=24, metadata=_POSITIVE)
    lr: float = field(default=2e-5, metadata={"expected": "a positive number"})
    warmup_ratio: float = field(default=0.05, metadata={"expected": "a number in [0, 1]"})
    weight_decay: float = field(default=0.01, metadata={"expected": "a number >= 0"})
    max_grad_norm: float = field(default=1.0, metadata={"expected": "a number >= 0"})
    eval_batch_size: int = field(default=64, metadata=_POSITIVE)
    # micro-batches per batch (per process): same updates, less memory per forward
    accumulation_steps: int = field(default=1, metadata=_POSITIVE)
    # after choosing the epoch on dev, retrain from the same start on train+dev for that many epochs (G-DSR appendix B)
    refit: bool = field(default=False, metadata={"expected": "true or false"})

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> "DSRConfig":
        return section_config(cls, params, SECTION, require_all=True)

    def validate(self) -> None:
        def bad(key: str) -> ConfigError:
            return bad_value(SECTION, key, getattr(self, key), expectation(DSRConfig, key))

        for key, allowed in _CHOICES.items():
            if getattr(self, key) not in allowed:
                raise bad(key)
        if self.query_trainable_layers is not None and self.query_trainable_layers < 0:
            raise bad("query_trainable_layers")
        if self.chunk_lr is not None and not self.chunk_lr > 0:
            raise bad("chunk_lr")
        if self.synthetic_per_epoch is not None and self.synthetic_per_epoch < 1:
            raise bad("synthetic_per_epoch")
        for key in ("max_chunk_length", "max_document_length", "max_query_length", "chunk_layers", "chunk_heads",
                    "epochs", "batch_size", "eval_batch_size", "accumulation_steps"):
            if getattr(self, key) < 1:
                raise bad(key)
        for key in ("temperature", "lr"):
            if not getattr(self, key) > 0:
                raise bad(key)
        for key in ("weight_decay", "max_grad_norm"):
            if not getattr(self, key) >= 0:
                raise bad(key)
        if not 0 <= self.warmup_ratio <= 1:
            raise bad("warmup_ratio")
        if self.max_document_length < self.max_chunk_length:
            raise ConfigError(
                f"params.yaml: '{SECTION}.max_document_length' ({self.max_document_length}) must be >= "
                f"'{SECTION}.max_chunk_length' ({self.max_chunk_length})"
            )


# ---------------------------------------------------------------------------
# Model construction
# ---------------------------------------------------------------------------


def _source(init: str, config: DSRConfig, pretrained: str | os.PathLike) -> tuple[str, bool]:
    """(name_or_path, random_init) of the backbone for ``init`` = pretrain | base."""
    if init == "pretrain":
        return str(pretrained), False
    if config.base_model == "random":
        return str(pretrained), True
    return config.base_model, False


def build_dsr(config: DSRConfig, pretrained: str | os.PathLike) -> DSR:
    """A fresh DSR: both backbones from ``pretrained`` (the domain-adapted MLM) or the base model."""
    if config.chunk_encoder == "frozen" and config.article_init != "pretrain":
        raise ConfigError(
            f"params.yaml: '{SECTION}.chunk_encoder' = frozen caches the chunk vectors of models/pretrain; "
            f"it needs '{SECTION}.article_init' = pretrain (got {config.article_init!r})"
        )
    q_path, q_random = _source(config.query_init, config, pretrained)
    a_path, a_random = _source(config.article_init, config, pretrained)
    log.info("query encoder from %s%s, article encoder from %s%s",
             q_path, " (random init)" if q_random else "", a_path, " (random init)" if a_random else "")
    query = QueryEncoder.from_pretrained(
        q_path, max_length=config.max_query_length, token_pooling=config.token_pooling, random_init=q_random,
        trainable_layers=config.query_trainable_layers,
    )
    article = HierarchicalArticleEncoder.from_pretrained(
        a_path,
        random_init=a_random,
        identity_init=config.chunk_identity_init,
        freeze_backbone=config.chunk_encoder == "frozen",
        max_chunk_length=config.max_chunk_length,
        max_document_length=config.max_document_length,
        pooling=config.pooling,
        num_layers=config.chunk_layers,
        num_heads=config.chunk_heads,
        token_pooling=config.token_pooling,
    )
    return DSR(query, article, temperature=config.temperature)


# ---------------------------------------------------------------------------
# Training data
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    """One (question, gold article) training pair."""

    query: str
    key: tuple[str, int]  # (split, question id): the negatives' key
    gold: frozenset[int]  # all gold articles of the question
    positive: int
    negatives: tuple[int, ...]  # BM25 negatives of the question (never gold)


@dataclass
class TrainingData:
    pairs: list[Pair]  # real training pairs, used every epoch
    article_ids: list[int]  # corpus order
    article_texts: list[str]
    synthetic_pairs: list[Pair] = field(default_factory=list)  # sampled per epoch (synthetic_per_epoch)
    dev_questions: list[str] = field(default_factory=list)
    dev_qrels: dict[int, set[int]] = field(default_factory=dict)  # question id -> gold ids
    dev_ids: list[int] = field(default_factory=list)
    dev_pairs: list[Pair] = field(default_factory=list)  # (dev question, gold) pairs: the refit's extra pairs
    chunks: Any = None  # lexgraph.chunks.ChunkTable of the corpus (frozen chunk encoder), else None


def _negatives_index(negatives, corpus: set[int]) -> dict[tuple[str, int], list[int]]:
    index: dict[tuple[str, int], list[int]] = {}
    dropped = 0
    for qid, split, neg in zip(negatives["question_id"].to_list(), negatives["split"].to_list(),
                               negatives["negative_ids"].to_list()):
        kept = [int(a) for a in (neg or []) if int(a) in corpus]
        dropped += len(neg or []) - len(kept)
        index.setdefault((str(split), int(qid)), []).extend(kept)
    if dropped:
        log.warning("%d negative ids are not in the corpus and were dropped", dropped)
    return index


def build_pairs(questions, negatives, corpus: set[int], path="questions") -> list[Pair]:
    """Pairs (question, gold article) of a questions table, with their BM25 negatives.

    ``questions`` needs ``id``, ``question``, ``article_ids`` (list[int]), ``split``;
    ``negatives`` ``question_id``, ``split``, ``negative_ids``. Gold articles missing from
    ``corpus`` raise :class:`DataError`; negatives that are gold are dropped.
    """
    index = _negatives_index(negatives, corpus)
    pairs: list[Pair] = []
    rows = zip(questions["id"].to_list(), questions["question"].to_list(),
               questions["article_ids"].to_list(), questions["split"].to_list())
    for row, (qid, text, gold, split) in enumerate(rows):
        gold_ids = [int(a) for a in (gold or [])]
        if not gold_ids:
            raise DataError(path, "question without gold article", row=row, column="article_ids")
        missing = [a for a in gold_ids if a not in corpus]
        if missing:
            raise DataError(path, f"gold article ids {missing} are not in the corpus", row=row, column="article_ids")
        gold_set = frozenset(gold_ids)
        negs = tuple(dict.fromkeys(a for a in index.get((str(split), int(qid)), []) if a not in gold_set))
        for article in dict.fromkeys(gold_ids):
            pairs.append(Pair(str(text), (str(split), int(qid)), gold_set, article, negs))
    return pairs


def split_pairs(questions, negatives, corpus: set[int], splits: Sequence[str], path="questions") -> list[Pair]:
    """:func:`build_pairs` of the questions whose split is in ``splits``, split after split."""
    import polars as pl

    pairs: list[Pair] = []
    for split in splits:
        pairs += build_pairs(questions.filter(pl.col("split") == split), negatives, corpus, path)
    return pairs


def load_training_data(
    articles_path, questions_path, synthetic_path, negatives_path, use_synthetic: bool, refit: bool = False
) -> TrainingData:
    """Read the stage inputs into :class:`TrainingData` (train + optional synthetic pairs, dev qrels;
    with ``refit`` the dev pairs too)."""
    import polars as pl

    articles = read_parquet(articles_path, ["id", "article"])
    qcols = ["id", "question", "article_ids", "split"]
    questions = read_parquet(questions_path, qcols)
    negatives = read_parquet(negatives_path, ["question_id", "split", "negative_ids"])
    article_ids = [int(a) for a in articles["id"].to_list()]
    corpus = set(article_ids)
    if len(corpus) != len(article_ids):
        raise DataError(articles_path, "article ids are not unique", column="id")
    train = questions.filter(pl.col("split") == "train")
    if train.height == 0:
        raise DataError(questions_path, "no question with split 'train'", column="split")
    pairs = split_pairs(questions, negatives, corpus, ["train"], questions_path)
    log.info("%d training pairs from %d train questions", len(pairs), train.height)
    synthetic_pairs: list[Pair] = []
    if use_synthetic:
        synthetic = read_parquet(synthetic_path, qcols)
        synthetic_pairs = build_pairs(synthetic, negatives, corpus, synthetic_path)
        log.info("%d synthetic pairs from %s", len(synthetic_pairs), synthetic_path)
    dev = questions.filter(pl.col("split") == "dev")
    texts = ["" if t is None else str(t) for t in articles["article"].to_list()]
    data = TrainingData(pairs, article_ids, texts, synthetic_pairs)
    data.dev_ids = [int(q) for q in dev["id"].to_list()]
    data.dev_questions = [str(q) for q in dev["question"].to_list()]
    data.dev_qrels = {int(q): {int(a) for a in gold} for q, gold in zip(data.dev_ids, dev["article_ids"].to_list())}
    if refit:  # dev questions have BM25 negatives only when mined (negatives.splits lists dev)
        data.dev_pairs = split_pairs(questions, negatives, corpus, ["dev"], questions_path)
        log.info("%d dev pairs for the refit (%d with BM25 negatives, the others a random non-gold article)",
                 len(data.dev_pairs), sum(1 for p in data.dev_pairs if p.negatives))
    return data


def sample_negatives(pairs: Sequence[Pair], article_ids: Sequence[int], rng: np.random.Generator) -> list[int]:
    """One hard negative per pair (uniform over its BM25 negatives; a random non-gold
    article when it has none)."""
    out = []
    for pair in pairs:
        if pair.negatives:
            out.append(pair.negatives[int(rng.integers(len(pair.negatives)))])
            continue
        if len(pair.gold) >= len(article_ids):
            raise DataError("negatives", f"question {pair.key} cites every article; no negative exists")
        while True:
            candidate = int(article_ids[int(rng.integers(len(article_ids)))])
            if candidate not in pair.gold:
                out.append(candidate)
                break
    return out


# ---------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------


def evaluate_dsr(model: DSR, data: TrainingData, batch_size: int) -> dict[str, float]:
    """Dev metrics of ``model``: whole corpus encoded, exact cosine top-:data:`~lexgraph.metrics.DEEPEST`."""
    from lexgraph.metrics import dense_run_metrics

    order = np.argsort(np.asarray(data.article_ids, dtype=np.int64), kind="stable")
    if data.chunks is not None:  # frozen chunk encoder: aggregate the cached chunk vectors
        from lexgraph.chunks import embed_from_chunks

        rows = data.chunks.rows(np.asarray(data.article_ids, dtype=np.int64)[order])
        articles = embed_from_chunks(model.article_encoder, data.chunks, rows)  # (na, dim)
    else:
        articles = model.encode_articles([data.article_texts[i] for i in order], batch_size=batch_size,
                                         desc="dev: encode corpus")  # (na, dim)
    queries = model.encode_queries(data.dev_questions, batch_size=batch_size, desc="dev: encode questions")  # (nq, dim)
    return dense_run_metrics(queries, articles, np.asarray(data.article_ids, dtype=np.int64)[order], data.dev_ids,
                             data.dev_qrels)


# ---------------------------------------------------------------------------
# Training loop
# ---------------------------------------------------------------------------


@dataclass
class TrainResult:
    model: DSR
    best_epoch: int
    dev_metrics: dict[str, float] | None
    history: list[dict[str, float]]
    train_seconds: float
    n_pairs: int  # pairs seen per epoch


class DSRTask:
    """:class:`~lexgraph.training.engine.TrainingTask` of the DSR: seeded global batches
    of pairs, one BM25 hard negative per pair, InfoNCE; dev recall@200 selection."""

    def __init__(self, model: DSR, data: TrainingData, config: DSRConfig, runtime, seed: int) -> None:
        self.model, self.data, self.config, self.runtime, self.seed = model, data, config, runtime, seed
        self.device = runtime.device
        self.frozen = data.chunks is not None
        self.chunks = {} if self.frozen else dict(zip(data.article_ids, model.article_encoder.chunk(data.article_texts)))
        self.pad_id = model.article_encoder.tokenizer.pad_token_id
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
            pairs += [data.synthetic_pairs[i] for i in sorted(rng.choice(len(data.synthetic_pairs), self.n_synthetic,
                                                                          replace=False).tolist())]
        order = rng.permutation(len(pairs))
        for step in range(self.steps_per_epoch):
            yield [pairs[i] for i in order[step * config.batch_size : (step + 1) * config.batch_size]]

    def step(self, batch: list[Pair]) -> torch.Tensor:
        model, data, device = self.model, self.data, self.device
        negatives = sample_negatives(batch, data.article_ids, self.rng)
        columns = [p.positive for p in batch] + negatives
        queries = {k: v.to(device) for k, v in model.query_encoder.tokenize([p.query for p in batch]).items()}
        mask = InfoNCELoss.shared_positive_mask([p.gold for p in batch], columns, device=device)  # (B, 2B)
        with self.runtime.autocast():
            q = model.encode_query(**queries)  # (B, dim)
            if self.frozen:
                cached = data.chunks.padded(data.chunks.rows(columns))  # (2B, c, dim), (2B, c), (2B, c)
                a = model.article_encoder.aggregate(*(t.to(device) for t in cached))  # (2B, dim)
            else:
                articles = {k: v.to(device) for k, v in pack_chunks([self.chunks[a] for a in columns],
                                                                    self.pad_id).items()}
                a = model.encode_article(**articles)  # (2B, dim)
        return model.loss(q, a[: len(batch)], a[len(batch) :], other_positives=mask)

    def evaluate(self) -> dict[str, float]:
        return evaluate_dsr(self.model, self.data, self.config.eval_batch_size) if self.data.dev_qrels else {}

    def nan_error(self, value: float, epoch: int, step: int) -> LexgraphError:
        return LexgraphError(
            f"train_dsr: the loss became {value} at epoch {epoch}, step {step}; "
            f"lower '{SECTION}.lr' (now {self.config.lr}) or raise '{SECTION}.temperature'"
        )


def train_dsr(
    model: DSR, data: TrainingData, config: DSRConfig, device: torch.device, seed: int, runtime: Runtime | None = None,
    *, select: bool = True,
) -> TrainResult:
    """Train ``model`` in place on ``data`` (:func:`lexgraph.training.engine.fit`) and
    return it at its best dev epoch (``select`` false: no dev evaluation, the last epoch)."""
    if not data.pairs and not data.synthetic_pairs:
        raise DataError("questions", "no training pairs")
    runtime = runtime or Runtime(device)
    model.to(runtime.device)
    torch.manual_seed(seed)  # dropout masks
    start = time.perf_counter()
    task = DSRTask(model, data, config, runtime, seed)
    log.info("%d pairs per epoch (%d real, %d of %d synthetic)", task.epoch_size, len(data.pairs), task.n_synthetic,
             len(data.synthetic_pairs))
    total = task.steps_per_epoch * config.epochs
    chunk_level = {id(p) for n, p in model.article_encoder.named_parameters() if not n.startswith("backbone.")}
    params = list(model.parameters())
    optimizer = build_optimizer(
        [ParamGroup([p for p in params if id(p) not in chunk_level], config.lr, config.weight_decay),
         ParamGroup([p for p in params if id(p) in chunk_level], config.chunk_lr or config.lr, config.weight_decay)],
        [model], eps=1e-7,
    )
    scheduler = build_scheduler(optimizer, "linear", int(config.warmup_ratio * total), total)
    fit_config = FitConfig(
        name="train_dsr", epochs=config.epochs, steps_per_epoch=task.steps_per_epoch,
        max_grad_norm=config.max_grad_norm, accumulation_steps=config.accumulation_steps,
        selection_metric=f"recall@{EVAL_CUTOFF}" if select else None, select_epoch_zero=select,
    )
    result = fit(task, optimizer, scheduler, fit_config, runtime)
    seconds = time.perf_counter() - start
    log.info("trained in %.1f s", seconds)
    return TrainResult(model, result.best_epoch, result.dev_metrics or None, result.history, seconds, task.epoch_size)


def train_and_refit(
    model: DSR, data: TrainingData, config: DSRConfig, device: torch.device, seed: int, runtime: Runtime | None = None
) -> tuple[TrainResult, TrainResult | None]:
    """:func:`train_dsr` (the selection run: best epoch E on dev), then, with ``config.refit``
    and E >= 1, the refit of G-DSR (appendix B): ``model`` back at its start weights (a
    copy taken before the selection run), trained with the same seed on the train + dev
    pairs (``data.dev_pairs``; the synthetic ones as before) for exactly E epochs with no
    model selection, its schedule spanning the refit's steps. E = 0: the untrained model
    stays, no refit. Returns (selection run, refit run or None); ``model`` ends as the one to keep.
    """
    if not config.refit:
        return train_dsr(model, data, config, device, seed, runtime), None
    if not data.dev_pairs:
        raise DataError("questions", f"'{SECTION}.refit' is true but there is no dev question to refit on")
    start = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    selection = train_dsr(model, data, config, device, seed, runtime)
    if selection.best_epoch == 0:
        log.info("refit: the untrained model won on dev, it is kept as is")
        return selection, None
    model.load_state_dict(start)
    both = replace(data, pairs=[*data.pairs, *data.dev_pairs], dev_pairs=[], dev_questions=[], dev_qrels={},
                   dev_ids=[])
    log.info("refit on train + dev: %d pairs (%d train, %d dev) for %d epochs", len(both.pairs), len(data.pairs),
             len(data.dev_pairs), selection.best_epoch)
    refit = train_dsr(model, both, replace(config, epochs=selection.best_epoch), device, seed, runtime, select=False)
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


def run_train_dsr(
    *,
    articles: str | os.PathLike,
    questions: str | os.PathLike,
    synthetic: str | os.PathLike,
    negatives: str | os.PathLike,
    pretrained: str | os.PathLike,
    chunks: str | os.PathLike,
    out: str | os.PathLike,
    metrics: str | os.PathLike,
    plot: str | os.PathLike,
    params: dict[str, Any],
    device: torch.device,
    seed: int,
) -> dict[str, Any]:
    """The ``train_dsr`` stage: read inputs, train, write model/metrics/curve atomically.

    ``chunks``: the ``encode_chunks`` cache directory (read with a frozen chunk encoder).
    """
    config = DSRConfig.from_params(params)
    log.info("train_dsr config: %s", asdict(config))
    if not Path(pretrained).is_dir():
        raise DataError(pretrained, "pretrained model directory not found (run `dvc repro pretrain`)")
    data = load_training_data(articles, questions, synthetic, negatives, config.synthetic, config.refit)
    seed_everything(seed)
    model = build_dsr(config, pretrained)
    if config.chunk_encoder == "frozen":
        from lexgraph.chunks import check_settings, load_chunk_table

        cache = Path(chunks) / "articles.safetensors"
        data.chunks = load_chunk_table(cache)
        check_settings(data.chunks, model.article_encoder, cache)
        try:
            data.chunks.rows(data.article_ids)
        except KeyError as exc:
            raise DataError(cache, f"article {exc.args[0]} has no cached chunks; run `dvc repro`") from None
    runtime = Runtime(device)
    result, refit = train_and_refit(model, data, config, device, seed, runtime)
    summary: dict[str, Any] = {
        "best_epoch": result.best_epoch,
        f"dev_recall@{EVAL_CUTOFF}": round(result.dev_metrics[f"recall@{EVAL_CUTOFF}"], 4)
        if result.dev_metrics else None,
        "epochs": config.epochs,
        "pairs_per_epoch": result.n_pairs,
        "train_pairs": len(data.pairs),
        "synthetic_pairs": len(data.synthetic_pairs),
        "dev": {k: round(v, 4) for k, v in result.dev_metrics.items()} if result.dev_metrics else None,
    }
    if config.refit:  # dev numbers and curve: the selection run's; a refit model was trained on dev
        n_refit = len(data.pairs) + len(data.dev_pairs)
        summary["refit"] = {"epochs": result.best_epoch, "pairs": n_refit} if refit else None
        summary["dev_metrics_of"] = "selection run"
        summary["dev_held_out"] = refit is None  # for the written model
    if runtime.is_main:  # one writer; the others wait for it
        with atomic_path(out, directory=True) as tmp:
            (refit or result).model.save(tmp, backbone_source=pretrained if config.chunk_encoder == "frozen" else None)
        write_json(summary, metrics)
        write_text(curve_csv(result.history), plot)
    runtime.wait()
    return summary
