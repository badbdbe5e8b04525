"""train_dsr: contrastive training of the dense statute retriever (query encoder +
hierarchical article encoder), best epoch by dev recall@200."""

from __future__ import annotations

import logging
import sys

from lexgraph.config import resolve_device
from lexgraph.training.dsr import run_train_dsr
from lexgraph.training.dsr_config import DSRConfig

log = logging.getLogger("lexgraph.train_dsr")


def configure(parser):
    parser.add_argument("--articles", default="data/clean/articles.parquet")
    parser.add_argument("--questions", default="data/clean/questions.parquet")
    parser.add_argument("--synthetic", default="data/queries/synthetic.parquet", help="read when dsr.synthetic is true")
    parser.add_argument("--negatives", default="data/negatives/negatives.parquet")
    parser.add_argument("--pretrained", default="models/pretrain", help="domain-adapted MLM checkpoint")
    parser.add_argument("--chunks", default="data/chunks", help="encode_chunks cache (frozen chunk encoder)")
    parser.add_argument("--out", default="models/dsr")
    parser.add_argument("--metrics", default="metrics/train_dsr.json")
    parser.add_argument("--plot", default="metrics/train_dsr_curve.csv", help="per-epoch loss and dev recall@200")


def main(args, base, params):
    summary = run_train_dsr(
        articles=args.articles,
        questions=args.questions,
        synthetic=args.synthetic,
        negatives=args.negatives,
        pretrained=args.pretrained,
        chunks=args.chunks,
        out=args.out,
        metrics=args.metrics,
        plot=args.plot,
        params=params,
        device=resolve_device(base.device),
        seed=base.seed,
    )
    log.info("train_dsr: best epoch %s, dev recall@200 %s", summary["best_epoch"], summary["dev_recall@200"])


if __name__ == "__main__":
    from lexgraph.stage import run_stage

    sys.exit(run_stage("dsr", main, configure, name="train_dsr", config=DSRConfig.from_params))
