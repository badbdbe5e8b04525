"""The re-rankers ``mvcl`` and ``xrerank``: triples, training with MVCL's multi-view losses.

Both re-rank the top-``k`` articles of a first-stage system (``rerank.first_stage``) with
MVCL's interaction network (:mod:`lexgraph.methods.rerank.model`; Zhaowei Wang, "Legal
Element-oriented Modeling with Multi-view Contrastive Learning for Legal Case Retrieval",
IJCNN 2022, arXiv:2210.05188). What differs is in ``rerank.<variant>``
(:mod:`lexgraph.methods.rerank.config`):

* ``mvcl`` (as published): the PLM (``models/pretrain``) is **fine-tuned** inside the
  training step (:class:`lexgraph.methods.rerank.plm.PLMTokens`: token ids in, gradients into
  the PLM; §IV-C: Adam at 2e-5, inputs of up to 512 tokens; on the sample its top
  ``plm_layers`` blocks only, over cached states of the blocks below), and the re-ranked list is
  the network's order alone (``fusion: false``), each candidate scored by the sum of its
  probabilities in all its pairs (``ranking: probability``, MVCL's Appendix B).
* ``xrerank`` (lexgraph's recipe): the PLM stays **frozen**; its token states are cached
  by ``encode_rerank`` (:func:`lexgraph.methods.rerank.features.build_features`), the network
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
the best ``rerank.<variant>.metric`` (ties: the earlier epoch, the first listed alpha): what
is selected is what the system returns. ``metric: accuracy`` (``mvcl``; MVCL §IV-C: "best model
is selected in the training process according to the accuracy measure on the validation set")
selects by the classifier's pairwise accuracy on fixed dev triples instead
(:meth:`RerankTrainer.dev_triples`), the re-ranked lists' IR metrics recorded beside it.
A re-ranked list is the top-``k`` in that order followed by the
rest of the first stage's list in its own order, scored below the top-``k``.

``epochs`` may be fractional (``mvcl``: MVCL trains "3500 (about 5.5 epochs) iterations"):
training runs ``round(epochs * steps_per_epoch)`` optimizer steps, the warm-up
``warmup_ratio`` of those, the last epoch partial. The shared engine counts whole epochs,
so the partial one is cut inside :meth:`RerankTrainer.batches` (its first batches of a
full epoch's seeded draw) and the engine runs ``ceil`` of the epochs: the dev selection runs
after every whole epoch and after the partial last one (numbered as the next epoch).

:class:`RerankTrainer` is a task of the shared training loop
(:func:`lexgraph.training.engine.fit`): ``batches(epoch)`` (a seeded iterator),
``step(batch) -> (loss, parts)`` (under the runtime's autocast: mixed precision on CUDA)
and ``evaluate() -> dev metrics``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lexgraph.core.errors import LexgraphError
from lexgraph.data.schema import split_questions
from lexgraph.methods.rerank.config import ACCURACY, RerankConfig
from lexgraph.methods.rerank.features import TokenStore
from lexgraph.methods.rerank.io import build_model
from lexgraph.methods.rerank.model import Tournament, fuse_list
from lexgraph.methods.rerank.plm import PLMTokens
from lexgraph.methods.rerank.report import log_kept, training_report
from lexgraph.metrics.ir import evaluate_run

log = logging.getLogger(__name__)

#: the stream of the dev triples' draw, ``numpy.random.default_rng([seed, DEV_TRIPLES])`` (the
#: epochs draw from ``[seed, epoch]``, epoch 1, 2, ...)
DEV_TRIPLES = 0x646576


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
        for store in (articles, queries, views):  # what trains of the PLM is the stores' (plm_stores)
            if isinstance(store, PLMTokens) and store.layers != config.plm_layers:
                raise ValueError(f"a store runs the PLM's top {store.layers} blocks, plm_layers is {config.plm_layers}")
        self.dev_pairs = self.dev_triples() if config.metric == ACCURACY else None

    def state_dict(self) -> dict:
        """What the report reads of the epochs done (a resumed run goes on with them)."""
        return {"epoch_log": self.epoch_log, "score_log": self.score_log}

    def load_state_dict(self, state: dict) -> None:
        self.epoch_log, self.score_log = state["epoch_log"], state["score_log"]

    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.pairs) * self.config.negatives / self.config.batch_size)

    def total_steps(self) -> int:
        """The optimizer steps of the whole training: ``round(epochs * steps_per_epoch)``."""
        steps = round(self.config.epochs * self.steps_per_epoch())
        if steps < 1:
            v = self.config.variant
            raise LexgraphError(
                f"{v}: rerank.{v}.epochs = {self.config.epochs} of {self.steps_per_epoch()} steps is no "
                "optimizer step; raise it"
            )
        return steps

    def fit_epochs(self) -> int:
        """The epochs the engine runs: the whole ones and, if any, the partial last one."""
        return math.ceil(self.total_steps() / self.steps_per_epoch())

    def batches(self, epoch: int) -> Iterator[list[tuple[int, int, int]]]:
        """Triples ``(qid, B+, C-)`` of one epoch in batches, from a generator seeded by
        ``(seed, epoch)``; the last epoch of a fractional ``epochs`` yields only the first
        batches of its draw, up to :meth:`total_steps` in all."""
        rng = np.random.default_rng([self.seed, epoch])
        triples = []
        for qid, gold, pool in self.pairs:
            negs = rng.choice(pool, size=self.config.negatives, replace=pool.size < self.config.negatives)
            triples += [(qid, gold, int(c)) for c in negs]
        order = rng.permutation(len(triples))
        size = self.config.batch_size
        left = self.total_steps() - (epoch - 1) * self.steps_per_epoch()  # steps still to run
        for start in range(0, min(len(order), left * size), size):
            yield [triples[i] for i in order[start : start + size]]

    def dev_triples(self) -> list[list[tuple[int, int]]]:
        """The dev triples of the pairwise accuracy, per dev question: ``(b, c)`` positions in its
        first-stage top-``k`` candidates (those :meth:`dev_pass` scores), one per gold article B
        there, with a non-gold C of that top-``k`` drawn from ``default_rng([seed, DEV_TRIPLES])``:
        fixed for the run, so that every epoch is measured on the same triples."""
        rng = np.random.default_rng([self.seed, DEV_TRIPLES])
        d, k, out = self.dev_lists, self.config.k, []
        for qid, row in zip(d.qids, d.ids):
            cands = [int(a) for a in row[:k] if a >= 0]
            gold = set(d.qrels[qid])
            pos = [i for i, a in enumerate(cands) if a in gold]
            neg = [i for i, a in enumerate(cands) if a not in gold]
            out.append([(b, int(rng.choice(neg))) for b in pos] if neg else [])
        if not any(out):
            v = self.config.variant
            raise LexgraphError(
                f"{v}: no dev triple for rerank.{v}.metric = {ACCURACY}: no dev question has a gold article and a "
                f"non-gold one in the first stage's top-{k}"
            )
        return out

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
        return self.dev_pass()[0]

    def dev_pass(self) -> tuple[list[np.ndarray], float | None]:
        """The re-ranker's scores of every dev question's top-``k`` and, with ``metric: accuracy``,
        the classifier's pairwise accuracy on :meth:`dev_triples` from the same games: each triple
        (A, B, C) counted in both orders, (B, C) right when it prefers B (``logit_0 >= logit_1``:
        class 0 on a tie, as an argmax), (C, B) right when it prefers B too."""
        from lexgraph.core.progress import progress

        queries, articles = self.scoring_stores()
        tournament = Tournament(self.model, articles, self.device, self.config.eval_batch_size)
        out, right, played = [], 0, 0
        rows = progress(list(zip(self.dev_lists.qids, self.dev_lists.ids)), "re-rank dev", unit="question")
        for index, (qid, row) in enumerate(rows):
            cands = [int(a) for a in row[: self.config.k] if a >= 0]
            if self.dev_pairs is None:
                out.append(tournament.scores(queries.get(qid), cands))
                continue
            # (n,), (n, n): [b, c] = logit_0 - logit_1 of (B=b, C=c)
            scores, margins = tournament.games(queries.get(qid), cands)
            out.append(scores)
            for b, c in self.dev_pairs[index]:
                right += int(margins[b, c] >= 0) + int(margins[c, b] < 0)
                played += 2
        return out, (right / played if self.dev_pairs is not None else None)

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
        the history records too, as ``dev_<metric>_alone``). With ``metric: accuracy`` they
        come with the pairwise ``accuracy`` that selects, and the history records the lists'
        IR metrics too (``dev_map``, ...)."""
        scores, accuracy = self.dev_pass()
        self.score_log.append(scores)
        if not self.config.fusion:
            metrics = self.metrics_at(scores, None)
            if accuracy is None:
                self.epoch_log.append({})
                return metrics
            self.epoch_log.append({f"dev_{name}": value for name, value in metrics.items()})
            return {**metrics, ACCURACY: accuracy}
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
        "%s: %d (question, gold) pairs, %d negatives each, %d steps per epoch, %d in all (%s epochs), PLM %s",
        config.variant,
        len(trainer.pairs),
        config.negatives,
        steps,
        trainer.total_steps(),
        f"{config.epochs:g}",
        config.plm,
    )
    result = fit(
        trainer,
        optimizer,
        scheduler,
        FitConfig(
            name=config.variant,
            epochs=trainer.fit_epochs(),
            steps_per_epoch=steps,
            max_grad_norm=config.max_grad_norm,
            selection_metric=config.metric,
            select_epoch_zero=model.warm_started,
        ),
        runtime,
        resume.next_fit() if resume else None,
    )
    report = training_report(config, trainer, result)
    if plm is not None:
        report["plm_grad_norm_first_step"] = round(first_grad.get("norm", 0.0), 6)
    log_kept(config, result.best_epoch, report)
    return model, report


def schedule_steps(config: RerankConfig, steps: int) -> tuple[int, int]:
    """``(warm-up steps, total steps)`` of ``config`` at ``steps`` per epoch: ``round(epochs * steps)``
    in all, the first ``int(warmup_ratio * total)`` warming up (computed as ``warmup_ratio * steps *
    epochs`` when that product is the total, the float rounding of integer epochs before fractions)."""
    total = round(config.epochs * steps)
    whole = total == steps * config.epochs
    return int(config.warmup_ratio * steps * config.epochs) if whole else int(config.warmup_ratio * total), total


def _optimizer(groups, modules, config: RerankConfig, steps: int):
    from lexgraph.training.engine import build_optimizer, build_scheduler

    optimizer = build_optimizer(groups, modules)
    scheduler = build_scheduler(optimizer, "linear", *schedule_steps(config, steps))
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
