"""A re-ranker's training report (``metrics/rerank_<variant>.json``) and curve columns: the
kept epoch (and alpha), its dev metrics against the first stage's, the history."""

from __future__ import annotations

import logging

import numpy as np

from lexgraph.methods.rerank.config import ACCURACY, RerankConfig
from lexgraph.metrics.ir import rounded, rounded_all

log = logging.getLogger("lexgraph.methods.rerank.train")


def log_kept(config: RerankConfig, epoch: int, report: dict) -> None:
    """One line on the kept epoch: its dev IR metric against the first stage's (and its accuracy)."""
    ir = config.metric if config.metric != ACCURACY else "map"  # the IR metric compared with the first stage
    log.info(
        "%s: kept epoch %d, alpha %s: dev %s %.4f (first stage %.4f, re-ranker alone %.4f)%s",
        config.variant,
        epoch,
        report["alpha"],
        ir,
        report["dev"][ir],
        report["dev_first_stage"][ir],
        report["dev_mvcl_only"][ir],
        f", pairwise accuracy {report['dev'][ACCURACY]:.4f}" if config.metric == ACCURACY else "",
    )


def kept_scores(trainer, result) -> list[np.ndarray]:
    """The dev scores of the kept epoch: those its evaluation recorded (one per history
    record), else scored again with the restored weights. With a fine-tuned PLM a scoring
    encodes every dev candidate article, so it is not done twice."""
    epochs = [int(h["epoch"]) for h in result.history]
    if len(trainer.score_log) == len(epochs) and result.best_epoch in epochs:
        return trainer.score_log[epochs.index(result.best_epoch)]
    return trainer.dev_scores()


def training_report(config: RerankConfig, trainer, result) -> dict:
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
    if config.metric == ACCURACY:  # the kept epoch's, on its dev triples (in both orders)
        report["dev"][ACCURACY] = rounded(result.dev_metrics[ACCURACY])
        report["dev_triples"] = sum(len(t) for t in trainer.dev_pairs)
    report["dev_mvcl_only"] = rounded_all(trainer.metrics_at(scores, 1.0 if config.fusion else None))
    report["dev_first_stage"] = rounded_all(trainer.metrics_at(scores, 0.0))
    if config.fusion:
        report["dev_by_alpha"] = {str(a): rounded(m[config.metric]) for a, m in by_alpha.items()}
    report.update(history=history, pairs=len(trainer.pairs), plm=config.plm, steps=len(result.step_losses))
    return report


def curve_columns(config: RerankConfig) -> tuple[str, ...]:
    """The training curve's columns: the epoch, the loss, the selection metric and, when that
    is the pairwise accuracy, the re-ranked dev lists' IR metrics."""
    from lexgraph.metrics.ir import METRICS

    ir = tuple(f"dev_{m}" for m in METRICS) if config.metric == ACCURACY else ()
    return ("epoch", "loss", f"dev_{config.metric}", *ir)
