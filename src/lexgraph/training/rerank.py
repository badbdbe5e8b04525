"""The re-rankers ``mvcl`` and ``xrerank``: triples, training with MVCL's multi-view losses.

Both re-rank the top-``k`` articles of a first-stage system (``rerank.first_stage``) with
MVCL's interaction network (:mod:`lexgraph.models.rerank`; Zhaowei Wang, "Legal
Element-oriented Modeling with Multi-view Contrastive Learning for Legal Case Retrieval",
IJCNN 2022, arXiv:2210.05188). What differs is in ``rerank.<variant>``
(:mod:`lexgraph.training.rerank_config`):

* ``mvcl`` (as published): the PLM (``models/pretrain``) is **fine-tuned** inside the
  training step (:class:`lexgraph.training.rerank_plm.PLMTokens`: token ids in, gradients into
  the PLM; §IV-C: Adam at 2e-5, inputs of up to 512 tokens), and the re-ranked list is
  the network's order alone (``fusion: false``).
* ``xrerank`` (lexgraph's recipe): the PLM stays **frozen**; its token states are cached
  by ``encode_rerank`` (:func:`lexgraph.encoding.rerank_features.build_features`), the network
  starts as MaxSim and its scores are fused with the first stage's (``fusion: true``).

Triples (A, B+, C-) pair each (train question, gold article) with ``negatives`` non-gold
articles drawn, fresh every epoch, from the first stage's top-``k`` for that question. The
loss is ``L + lambda_case * L_case + lambda_ele * L_ele`` (:mod:`lexgraph.losses`); the
engine's AdamW with linear warm-up and decay (weight decay 0 is Adam). The case view's
negatives are in-batch (its own C- and the other triples' B+ and C-, less the question's
own gold articles); the element view contrasts the batch's distinct gold articles with
their element views (2N - 2 negatives). The element indicator is lexgraph's documented
regex (:mod:`lexgraph.text.elements`), not the paper's, which is trained on element labels that
statutes do not have.

With fusion the re-ranker's score is interpolated with the first stage's (both
z-normalised over the question's top-``k``): ``alpha * z(mvcl) + (1 - alpha) * z(first)``;
alpha = 0 is the first stage itself. After every epoch (and before training, with
``warm_start``) the dev questions' top-``k`` are re-ranked (and, with fusion, fused at
every alpha of ``interpolation``); the epoch (and alpha) kept are those whose lists have
the best ``metric`` (ties: the earlier epoch, the first listed alpha): what is selected is
what the system returns. A re-ranked list is the top-``k`` in that order followed by the
rest of the first stage's list in its own order, scored below the top-``k``.

:class:`RerankTrainer` is a task of the shared training loop
(:func:`lexgraph.training.engine.fit`): ``batches(epoch)`` (a seeded iterator),
``step(batch) -> (loss, parts)`` (under the runtime's autocast: mixed precision on CUDA)
and ``evaluate() -> dev metrics``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lexgraph.core.errors import LexgraphError
from lexgraph.core.provenance import output, stage_inputs, workspace
from lexgraph.data.schema import split_questions
from lexgraph.encoding.rerank_features import TokenStore
from lexgraph.metrics.ir import evaluate_run, rounded, rounded_all
from lexgraph.models.rerank import fuse_list, rerank_scores
from lexgraph.training.rerank_config import RerankConfig
from lexgraph.training.rerank_io import build_model
from lexgraph.training.rerank_plm import PLMTokens
from lexgraph.training.resume import resumable

log = logging.getLogger(__name__)


@dataclass
class Lists:
    """First-stage lists of one split: question ids, golds, ids/scores ``(n, depth)``."""

    qids: list[int]
    qrels: dict[int, list[int]]
    ids: np.ndarray
    scores: np.ndarray


def first_stage_lists(retriever, questions, split: str, depth: int) -> Lists:
    qids, texts, qrels = split_questions(questions, split)
    if not qids:
        raise LexgraphError(f"no '{split}' questions in the questions table; the re-ranker needs them")
    ids, scores = retriever.search(texts, depth)
    return Lists(qids, qrels, np.asarray(ids), np.asarray(scores))


class RerankTrainer:
    """A re-ranker's training task in an engine's shape: ``batches``, ``step``, ``evaluate``.
    ``articles``, ``queries`` and ``views`` are cached stores (a frozen PLM) or
    :class:`PLMTokens` (the PLM ``plm`` trains with the network)."""

    def __init__(
        self,
        model,
        config: RerankConfig,
        articles: TokenStore | PLMTokens,
        queries: TokenStore | PLMTokens,
        views: TokenStore | PLMTokens,
        train: Lists,
        dev: Lists,
        device: torch.device,
        seed: int,
        plm: torch.nn.Module | None = None,
        autocast=None,
    ) -> None:
        import contextlib

        from lexgraph.losses.CaseViewLoss import CaseViewLoss
        from lexgraph.losses.ElementViewLoss import ElementViewLoss
        from lexgraph.losses.PairwiseTripleLoss import PairwiseTripleLoss

        self.model, self.config, self.device, self.seed = model, config, device, seed
        self.plm, self.autocast = plm, autocast or contextlib.nullcontext
        self.articles, self.queries, self.views = articles, queries, views
        self.train_lists, self.dev_lists = train, dev
        self.triple_loss = PairwiseTripleLoss(swap=config.swap)
        self.case_loss = CaseViewLoss(config.t1)
        self.element_loss = ElementViewLoss(config.t2)
        self.pairs: list[tuple[int, int, np.ndarray]] = []  # (qid, gold, negative pool)
        self.epoch_log: list[dict[str, float]] = []  # per evaluate(): the best alpha, the re-ranker alone
        self.score_log: list[list[np.ndarray]] = []  # per evaluate(): the dev scores (the report reads the kept one's)
        for qid, row in zip(train.qids, train.ids):
            gold = set(train.qrels[qid])
            pool = np.array(
                [a for a in row[: config.k].tolist() if a >= 0 and a not in gold and a in articles], dtype=np.int64
            )
            if pool.size == 0 or qid not in queries:
                continue
            for g in sorted(gold):
                if g in articles:
                    self.pairs.append((qid, g, pool))
        if not self.pairs:
            raise LexgraphError("no training triple: no train question has a gold article and a non-gold candidate")

    def state_dict(self) -> dict:
        """What the report reads of the epochs done (a resumed run goes on with them)."""
        return {"epoch_log": self.epoch_log, "score_log": self.score_log}

    def load_state_dict(self, state: dict) -> None:
        self.epoch_log, self.score_log = state["epoch_log"], state["score_log"]

    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.pairs) * self.config.negatives / self.config.batch_size)

    def batches(self, epoch: int) -> Iterator[list[tuple[int, int, int]]]:
        """Triples ``(qid, B+, C-)`` of one epoch in batches, from a generator seeded by
        ``(seed, epoch)``."""
        rng = np.random.default_rng([self.seed, epoch])
        triples = []
        for qid, gold, pool in self.pairs:
            negs = rng.choice(pool, size=self.config.negatives, replace=pool.size < self.config.negatives)
            triples += [(qid, gold, int(c)) for c in negs]
        order = rng.permutation(len(triples))
        size = self.config.batch_size
        for start in range(0, len(order), size):
            yield [triples[i] for i in order[start : start + size]]

    def modules(self) -> list[torch.nn.Module]:
        return [self.model] + ([self.plm] if self.plm is not None else [])

    def train(self) -> None:
        for module in self.modules():
            module.train()

    def step(self, batch: Sequence[tuple[int, int, int]]) -> tuple[torch.Tensor, dict[str, float]]:
        """The engine's step: the total loss, and its parts for the history."""
        with self.autocast():
            out = self.losses(batch)
        return out["loss"], {f"train_{k}": float(v.detach()) for k, v in out.items() if k != "loss"}

    def nan_error(self, value: float, epoch: int, step: int) -> LexgraphError:
        v = self.config.variant
        return LexgraphError(
            f"{v}: the loss is {value} at epoch {epoch}, step {step}; lower rerank.{v}.lr or rerank.max_grad_norm"
        )

    def losses(self, batch: Sequence[tuple[int, int, int]]) -> dict[str, torch.Tensor]:
        """The losses of one batch of triples (``loss`` is the total to back-propagate)."""
        m, cfg, dev = self.model, self.config, self.device
        qids, golds, negs = zip(*batch)
        q, q_mask = self.queries.batch(qids, dev)  # (b, Lq, dim)
        b, b_mask = self.articles.batch(golds, dev)  # (b, Lb, dim)
        c, c_mask = self.articles.batch(negs, dev)  # (b, Lc, dim)
        h_ab = m.match(q, q_mask, b, b_mask)  # (b, 4 * hidden)
        h_ac = m.match(q, q_mask, c, c_mask)  # (b, 4 * hidden)
        out = {"triple": self.triple_loss(h_ab, h_ac, m.classifier)}
        total = out["triple"]
        if cfg.lambda_case > 0:
            out["case"] = self.case_loss(
                m.pool(q, q_mask), m.pool(b, b_mask), m.pool(c, c_mask), self.case_exclusions(qids, golds, negs)
            )
            total = total + cfg.lambda_case * out["case"]
        unique = [g for g in dict.fromkeys(golds) if g in self.views]
        if cfg.lambda_ele > 0 and len(unique) >= 2:
            t, t_mask = rows_of(b, b_mask, golds, unique)  # (u, Lt, dim): B's states, not encoded again
            v, v_mask = self.views.batch(unique, dev)  # (u, Lv, dim)
            out["element"] = self.element_loss(m.pool(t, t_mask), m.pool(v, v_mask))
            total = total + cfg.lambda_ele * out["element"]
        out["loss"] = total
        return out

    def case_exclusions(self, qids: Sequence[int], golds: Sequence[int], negs: Sequence[int]) -> torch.Tensor:
        """The case view's false negatives ``(N, 2N)``: column k of ``[B+; C-]`` is no
        negative of triple i when its article is a gold article of question i."""
        cases = list(golds) + list(negs)  # 2N articles: b_1..b_N, c_1..c_N
        qrels = self.train_lists.qrels
        rows = [[a in qrels[q] for a in cases] for q in qids]
        return torch.tensor(rows, dtype=torch.bool, device=self.device)  # (N, 2N)

    def scoring_stores(self) -> tuple[TokenStore, TokenStore]:
        """``(queries, articles)`` stores to score the dev lists with: the cache, or the current
        PLM's states of the dev questions and of every article in their top-``k``."""
        if isinstance(self.articles, TokenStore):
            return self.queries, self.articles
        d, k = self.dev_lists, self.config.k
        cands = sorted({int(a) for row in d.ids for a in row[:k] if a >= 0 and a in self.articles})
        size = self.config.eval_batch_size
        return (
            self.queries.encode_store(d.qids, size, self.device, self.autocast),
            self.articles.encode_store(cands, size, self.device, self.autocast),
        )

    def dev_scores(self) -> list[np.ndarray]:
        """The re-ranker's scores of every dev question's top-``k``."""
        from lexgraph.core.progress import progress

        queries, articles = self.scoring_stores()
        out = []
        for qid, row in progress(list(zip(self.dev_lists.qids, self.dev_lists.ids)), "re-rank dev", unit="question"):
            cands = [int(a) for a in row[: self.config.k] if a >= 0]
            out.append(
                rerank_scores(self.model, queries.get(qid), cands, articles, self.device, self.config.eval_batch_size)
            )
        return out

    def metrics_at(self, scores: Sequence[np.ndarray], alpha: float | None) -> dict[str, float]:
        """Dev metrics of the lists fused at ``alpha`` (None: the re-ranked lists alone)."""
        d = self.dev_lists
        run = {}
        for qid, ids, first, s in zip(d.qids, d.ids, d.scores, scores):
            fused, _ = fuse_list(ids, first, s, alpha, self.config.k)
            run[qid] = [int(a) for a in fused if a >= 0]
        return evaluate_run(run, d.qrels)

    def by_alpha(self, scores: Sequence[np.ndarray]) -> tuple[float, dict[float, dict[str, float]]]:
        """Dev metrics of the fused lists at every ``interpolation`` weight, and the weight
        with the best ``metric`` (ties: the first listed)."""
        grid = list(self.config.interpolation)
        metrics = {a: self.metrics_at(scores, a) for a in grid}
        best = max(grid, key=lambda a: (metrics[a][self.config.metric], -grid.index(a)))
        return best, metrics

    def evaluate(self) -> dict[str, float]:
        """Dev metrics of the system that would be kept: the re-ranked lists alone without
        fusion; with fusion, the fused lists at this epoch's best alpha (epoch and alpha are
        thus chosen together, by what the system returns, not by the re-ranker alone, which
        the history records too, as ``dev_<metric>_alone``)."""
        scores = self.dev_scores()
        self.score_log.append(scores)
        if not self.config.fusion:
            self.epoch_log.append({})
            return self.metrics_at(scores, None)
        alpha, metrics = self.by_alpha(scores)
        alone = metrics[1.0] if 1.0 in metrics else self.metrics_at(scores, 1.0)
        self.epoch_log.append({"alpha": alpha, f"dev_{self.config.metric}_alone": alone[self.config.metric]})
        return metrics[alpha]


def rows_of(
    states: torch.Tensor, mask: torch.Tensor, keys: Sequence[int], wanted: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of ``wanted`` (each among ``keys``, the rows of ``states`` ``(n, L, dim)`` and
    ``mask`` ``(n, L)``), cut to their own longest length: what ``store.batch(wanted)`` gives
    from a store, without a second PLM pass over the same texts in a fine-tuning step."""
    first = {}
    for i, k in enumerate(keys):
        first.setdefault(int(k), i)
    index = torch.tensor([first[int(k)] for k in wanted], dtype=torch.long, device=states.device)
    sub_mask = mask.index_select(0, index)  # (u, L)
    length = max(int(sub_mask.sum(1).max()), 1) if len(wanted) else 1
    return states.index_select(0, index)[:, :length], sub_mask[:, :length]  # (u, Lt, dim), (u, Lt)


def train(
    config: RerankConfig,
    articles: TokenStore | PLMTokens,
    queries: TokenStore | PLMTokens,
    views: TokenStore | PLMTokens,
    train_lists: Lists,
    dev_lists: Lists,
    device: torch.device,
    seed: int,
    runtime=None,
    plm: torch.nn.Module | None = None,
    resume=None,
):
    """Train the interaction network (and ``plm``, fine-tuned, when given: the stores are then
    :class:`PLMTokens` over it); returns ``(model, report)`` with the kept epoch's weights."""
    from lexgraph.training.engine import FitConfig, ParamGroup, Runtime, fit

    runtime = runtime or Runtime(device)
    torch.manual_seed(seed)  # the initial weights and dropout follow the seed
    model = build_model(articles.dim, config).to(device)
    trainer = RerankTrainer(
        model,
        config,
        articles,
        queries,
        views,
        train_lists,
        dev_lists,
        device,
        seed,
        plm=plm,
        autocast=runtime.autocast,
    )
    steps = trainer.steps_per_epoch()
    # AdamW with weight decay on every parameter of the network, linear warm-up then decay
    groups = [ParamGroup(list(model.parameters()), config.lr, config.weight_decay, decay_exempt=False)]
    if plm is not None:
        groups.append(ParamGroup(list(plm.parameters()), config.plm_lr, config.weight_decay))
    optimizer, scheduler = _optimizer(groups, trainer.modules(), config, steps)
    first_grad = _first_grad_norm(optimizer, plm)
    log.info(
        "%s: %d (question, gold) pairs, %d negatives each, %d steps per epoch, PLM %s",
        config.variant,
        len(trainer.pairs),
        config.negatives,
        steps,
        config.plm,
    )
    result = fit(
        trainer,
        optimizer,
        scheduler,
        FitConfig(
            name=config.variant,
            epochs=config.epochs,
            steps_per_epoch=steps,
            max_grad_norm=config.max_grad_norm,
            selection_metric=config.metric,
            select_epoch_zero=model.warm_started,
        ),
        runtime,
        resume.next_fit() if resume else None,
    )
    report = _report(config, trainer, result)
    if plm is not None:
        report["plm_grad_norm_first_step"] = round(first_grad.get("norm", 0.0), 6)
    log.info(
        "%s: kept epoch %d, alpha %s: dev %s %.4f (first stage %.4f, re-ranker alone %.4f)",
        config.variant,
        result.best_epoch,
        report["alpha"],
        config.metric,
        report["dev"][config.metric],
        report["dev_first_stage"][config.metric],
        report["dev_mvcl_only"][config.metric],
    )
    return model, report


def _optimizer(groups, modules, config: RerankConfig, steps: int):
    from lexgraph.training.engine import build_optimizer, build_scheduler

    optimizer = build_optimizer(groups, modules)
    scheduler = build_scheduler(
        optimizer, "linear", int(config.warmup_ratio * steps * config.epochs), steps * config.epochs
    )
    return optimizer, scheduler


def _first_grad_norm(optimizer, plm) -> dict[str, float]:
    """Records (in the returned dict, key ``norm``) the L2 norm of the PLM's gradient at the
    first optimizer step (after clipping): the evidence that the PLM trains."""
    box: dict[str, float] = {}
    if plm is None:
        return box

    def hook(opt, args, kwargs):
        if "norm" not in box:
            norms = [p.grad.detach().float().norm() for p in plm.parameters() if p.grad is not None]
            box["norm"] = float(torch.stack(norms).norm()) if norms else 0.0

    optimizer.register_step_pre_hook(hook)
    return box


def kept_scores(trainer: RerankTrainer, result) -> list[np.ndarray]:
    """The dev scores of the kept epoch: those its evaluation recorded (one per history
    record), else scored again with the restored weights. With a fine-tuned PLM a scoring
    encodes every dev candidate article, so it is not done twice."""
    epochs = [int(h["epoch"]) for h in result.history]
    if len(trainer.score_log) == len(epochs) and result.best_epoch in epochs:
        return trainer.score_log[epochs.index(result.best_epoch)]
    return trainer.dev_scores()


def _report(config: RerankConfig, trainer: RerankTrainer, result) -> dict:
    """The training report (rerank_<variant>.json): the kept epoch (and alpha), the dev metrics, the history."""
    history = [
        {**h, **{k: rounded(v) if k != "alpha" else v for k, v in e.items()}}
        for h, e in zip(result.history, trainer.epoch_log)
    ]
    scores = kept_scores(trainer, result)
    report = {"first_stage": config.first_stage, "k": config.k, "epoch": result.best_epoch}
    if config.fusion:
        alpha, by_alpha = trainer.by_alpha(scores)
        report.update(alpha=alpha, split=config.split, metric=config.metric, dev=rounded_all(by_alpha[alpha]))
    else:
        report.update(
            alpha=None, split=config.split, metric=config.metric, dev=rounded_all(trainer.metrics_at(scores, None))
        )
    report["dev_mvcl_only"] = rounded_all(trainer.metrics_at(scores, 1.0 if config.fusion else None))
    report["dev_first_stage"] = rounded_all(trainer.metrics_at(scores, 0.0))
    if config.fusion:
        report["dev_by_alpha"] = {str(a): rounded(m[config.metric]) for a, m in by_alpha.items()}
    report.update(history=history, pairs=len(trainer.pairs), plm=config.plm, steps=len(result.step_losses))
    return report


@dataclass(frozen=True)
class RerankPaths:
    """The rerank stage's paths (dvc.yaml writes them all)."""

    questions: Path = field(metadata={"help": "the clean questions table"})
    articles: Path = field(metadata={"help": "the clean articles table"})
    features: Path = field(metadata={"help": "encode_rerank's cache of the frozen PLM's states (xrerank)"})
    pretrain: Path = field(metadata={"help": "the base checkpoint (the PLM)"})
    workspace: Path = workspace("where the first-stage system's artefacts are")
    out: Path = output("the re-ranker's directory")
    metrics: Path = output("the training report (JSON)")
    plot: Path = output("training curve: per-epoch loss and dev metric (CSV)")


def run_rerank(paths: RerankPaths, config: RerankConfig, device: torch.device, seed: int, load_first) -> None:
    """The rerank stage for one re-ranker: its inputs (cached or encoded frozen states, or
    token ids for a fine-tuned PLM), the first stage's lists (``load_first()``: the first
    stage's retriever, loaded by the caller's registry), training, and the outputs."""
    from lexgraph.core.io import read_parquet, write_json
    from lexgraph.encoding.rerank_features import DISABLED, frozen_stores, write_disabled
    from lexgraph.metrics.ir import DEEPEST
    from lexgraph.training.curves import write_curve
    from lexgraph.training.rerank_io import save_model

    columns = ("epoch", "loss", f"dev_{config.metric}")
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
    if config.plm == "finetune":
        stores, plm, tokenizer = _plm_inputs(articles, questions, config, paths.pretrain, device, seed)
    else:
        stores = frozen_stores(articles, questions, config, paths.features, paths.pretrain, device, seed)
    settings = {"config": config, "seed": seed, "first_stage": [train_lists, dev_lists]}
    with resumable(paths.out, settings, stage_inputs(paths)) as resume:
        model, report = train(config, *stores, train_lists, dev_lists, device, seed, plm=plm, resume=resume)
        save_model(model, config, report, paths.out, plm=plm, tokenizer=tokenizer, base_dir=paths.pretrain)
        write_json(report, paths.metrics)
        write_curve(report["history"], columns, paths.plot)


def _plm_inputs(articles, questions, config: RerankConfig, pretrain: Path, device: torch.device, seed: int):
    """``((articles, questions, views) as PLMTokens, plm, tokenizer)`` for a fine-tuned PLM."""
    from lexgraph.encoding.rerank_features import token_inputs
    from lexgraph.training.rerank_plm import load_plm

    plm, tokenizer, query_prefix, passage_prefix = load_plm(pretrain, device)
    inputs = token_inputs(articles, questions, config, tokenizer, query_prefix, passage_prefix, seed)
    log.info("%s: fine-tuning the PLM %s; element indicator: %s", config.variant, pretrain, inputs.stats)
    pad = tokenizer.pad_token_id
    stores = (
        PLMTokens(inputs.article_ids, inputs.articles, plm, pad),
        PLMTokens(inputs.question_ids, inputs.questions, plm, pad),
        PLMTokens(inputs.view_ids, inputs.views, plm, pad),
    )
    return stores, plm, tokenizer
