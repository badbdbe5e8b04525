"""MVCL re-ranker: frozen token states, triples, training with the multi-view losses.

The ``mvcl`` system re-ranks the top-``k`` articles of a first-stage system
(``rerank.first_stage``) with MVCL's interaction network (:mod:`lexgraph.models.mvcl`;
Wang et al., "Legal Element-oriented Modeling with Multi-view Contrastive Learning for
Legal Case Retrieval", IJCNN 2022, arXiv:2210.05188). Two stages:

* ``encode_rerank`` (:func:`build_features`): the base encoder (``models/pretrain``,
  multilingual-e5-small on the sample) stays **frozen**; its last-layer token states are
  cached once, in float16: every article's first ``max_article_length`` tokens
  (``passage: `` prefix), the train and dev questions' first ``max_query_length`` tokens
  (``query: ``), and the element view T+ (:func:`lexgraph.elements.element_view`) of the
  gold articles of the train questions. The test questions are never read here.
* ``rerank`` (:func:`train`): triples (A, B+, C-) pair each (train question, gold
  article) with ``negatives`` non-gold articles drawn, fresh every epoch, from the first
  stage's top-``k`` for that question. The loss is
  ``L + lambda_case * L_case + lambda_ele * L_ele`` (:mod:`lexgraph.losses`); AdamW
  with linear warm-up and decay. The case view's negatives are in-batch (its own C- and
  the other triples' B+ and C-, less the question's own gold articles); the element view
  contrasts the batch's distinct gold articles with their element views (2N - 2
  negatives). The re-ranker's score is interpolated with the first stage's (both
  z-normalised over the question's top-``k``): ``alpha * z(mvcl) + (1 - alpha) * z(first)``;
  alpha = 0 is the first stage itself. After every epoch (and before training, with
  ``warm_start``) the dev questions' top-``k`` are re-ranked and fused at every alpha of
  ``interpolation``; the epoch and alpha kept are the pair whose fused lists have the best
  ``metric`` (ties: the earlier epoch, the first listed alpha): what is selected is what
  the ``mvcl`` system returns.

A re-ranked list is the top-``k`` in fused order followed by the rest of the first
stage's list in its own order, scored below the top-``k``.

:class:`RerankTrainer` is a task of the shared training loop
(:func:`lexgraph.training.engine.fit`): ``batches(epoch)`` (a seeded iterator),
``step(batch) -> (loss, parts)`` and ``evaluate() -> dev metrics`` (of the fused lists at the epoch's best alpha).
"""


from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch

from lexgraph.data.schema import split_questions
from lexgraph.errors import LexgraphError
from lexgraph.metrics import evaluate_run
from lexgraph.models.mvcl import build_model, fuse_list, rerank_scores
from lexgraph.models.mvcl_config import RerankConfig
from lexgraph.models.mvcl_features import TokenStore

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
    """MVCL's training task in an engine's shape: ``batches``, ``step``, ``evaluate``."""

    def __init__(self, model, config: RerankConfig, articles: TokenStore, queries: TokenStore,
                 views: TokenStore, train: Lists, dev: Lists, device: torch.device, seed: int) -> None:
        from lexgraph.losses.CaseViewLoss import CaseViewLoss
        from lexgraph.losses.ElementViewLoss import ElementViewLoss
        from lexgraph.losses.PairwiseTripleLoss import PairwiseTripleLoss

        self.model, self.config, self.device, self.seed = model, config, device, seed
        self.articles, self.queries, self.views = articles, queries, views
        self.train_lists, self.dev_lists = train, dev
        self.triple_loss = PairwiseTripleLoss(swap=config.swap)
        self.case_loss = CaseViewLoss(config.t1)
        self.element_loss = ElementViewLoss(config.t2)
        self.pairs: list[tuple[int, int, np.ndarray]] = []  # (qid, gold, negative pool)
        self.epoch_log: list[dict[str, float]] = []  # per evaluate(): the best alpha, the re-ranker alone
        for qid, row in zip(train.qids, train.ids):
            gold = set(train.qrels[qid])
            pool = np.array([a for a in row[: config.k].tolist() if a >= 0 and a not in gold and a in articles],
                            dtype=np.int64)
            if pool.size == 0 or qid not in queries:
                continue
            for g in sorted(gold):
                if g in articles:
                    self.pairs.append((qid, g, pool))
        if not self.pairs:
            raise LexgraphError("no training triple: no train question has a gold article and a non-gold candidate")

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
            yield [triples[i] for i in order[start:start + size]]

    def modules(self) -> list[torch.nn.Module]:
        return [self.model]

    def train(self) -> None:
        self.model.train()

    def step(self, batch: Sequence[tuple[int, int, int]]) -> tuple[torch.Tensor, dict[str, float]]:
        """The engine's step: the total loss, and its parts for the history."""
        out = self.losses(batch)
        return out["loss"], {f"train_{k}": float(v.detach()) for k, v in out.items() if k != "loss"}

    def nan_error(self, value: float, epoch: int, step: int) -> LexgraphError:
        return LexgraphError(f"mvcl: the loss is {value} at epoch {epoch}, step {step}; lower rerank.lr "
                             "or rerank.max_grad_norm")

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
            out["case"] = self.case_loss(m.pool(q, q_mask), m.pool(b, b_mask), m.pool(c, c_mask),
                                         self.case_exclusions(qids, golds, negs))
            total = total + cfg.lambda_case * out["case"]
        unique = [g for g in dict.fromkeys(golds) if g in self.views]
        if cfg.lambda_ele > 0 and len(unique) >= 2:
            t, t_mask = self.articles.batch(unique, dev)  # (u, Lt, dim)
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

    def dev_scores(self) -> list[np.ndarray]:
        """The re-ranker's scores of every dev question's top-``k``."""
        from lexgraph.progress import progress

        out = []
        for qid, row in progress(list(zip(self.dev_lists.qids, self.dev_lists.ids)), "re-rank dev", unit="question"):
            cands = [int(a) for a in row[: self.config.k] if a >= 0]
            out.append(rerank_scores(self.model, self.queries.get(qid), cands, self.articles, self.device,
                                     self.config.eval_batch_size))
        return out

    def metrics_at(self, scores: Sequence[np.ndarray], alpha: float) -> dict[str, float]:
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
        """Dev metrics of the system that would be kept: the fused lists at this epoch's best
        alpha. Epoch and alpha are thus chosen together, by what ``mvcl`` returns, not by the
        re-ranker alone (which the history records too, as ``dev_<metric>_alone``)."""
        scores = self.dev_scores()
        alpha, metrics = self.by_alpha(scores)
        alone = metrics[1.0] if 1.0 in metrics else self.metrics_at(scores, 1.0)
        self.epoch_log.append({"alpha": alpha, f"dev_{self.config.metric}_alone": alone[self.config.metric]})
        return metrics[alpha]


def _round(d: dict[str, float]) -> dict[str, float]:
    return {k: round(float(v), 4) for k, v in d.items()}


def train(config: RerankConfig, articles: TokenStore, queries: TokenStore, views: TokenStore,
          train_lists: Lists, dev_lists: Lists, device: torch.device, seed: int, runtime=None):
    """Train the interaction network; returns ``(model, report)`` with the kept epoch's
    weights, alpha and the dev metrics."""
    from lexgraph.training.engine import FitConfig, ParamGroup, Runtime, build_optimizer, build_scheduler, fit

    torch.manual_seed(seed)  # the initial weights and dropout follow the seed
    model = build_model(articles.dim, config).to(device)
    trainer = RerankTrainer(model, config, articles, queries, views, train_lists, dev_lists, device, seed)
    steps = trainer.steps_per_epoch()
    # AdamW with weight decay on every parameter, linear warm-up then decay (lexgraph.training.engine)
    optimizer = build_optimizer([ParamGroup(list(model.parameters()), config.lr, config.weight_decay,
                                            decay_exempt=False)], [model])
    scheduler = build_scheduler(optimizer, "linear", int(config.warmup_ratio * steps * config.epochs),
                                steps * config.epochs)
    log.info("mvcl: %d (question, gold) pairs, %d negatives each, %d steps per epoch",
             len(trainer.pairs), config.negatives, steps)
    result = fit(trainer, optimizer, scheduler,
                 FitConfig(name="mvcl", epochs=config.epochs, steps_per_epoch=steps,
                           max_grad_norm=config.max_grad_norm, selection_metric=config.metric,
                           select_epoch_zero=model.warm_started),
                 runtime or Runtime(device))
    best_epoch = result.best_epoch
    history = [{**h, **{k: round(float(v), 4) if k != "alpha" else v for k, v in e.items()}}
               for h, e in zip(result.history, trainer.epoch_log)]
    scores = trainer.dev_scores()  # of the kept epoch's weights (fit restored them)
    alpha, by_alpha = trainer.by_alpha(scores)
    report = {
        "first_stage": config.first_stage,
        "k": config.k,
        "epoch": best_epoch,
        "alpha": alpha,
        "split": config.split,
        "metric": config.metric,
        "dev": _round(by_alpha[alpha]),
        "dev_mvcl_only": _round(trainer.metrics_at(scores, 1.0)),
        "dev_first_stage": _round(trainer.metrics_at(scores, 0.0)),
        "dev_by_alpha": {str(a): round(float(m[config.metric]), 4) for a, m in by_alpha.items()},
        "history": history,
        "pairs": len(trainer.pairs),
    }
    log.info("mvcl: kept epoch %d, alpha %.2f: dev %s %.4f (first stage %.4f, re-ranker alone %.4f)", best_epoch, alpha,
             config.metric, report["dev"][config.metric], report["dev_first_stage"][config.metric],
             report["dev_mvcl_only"][config.metric])
    return model, report
