"""encode_rerank: the frozen base encoder's token states for the xrerank re-ranker -> data/rerank/
(articles, train and dev questions, element views of the train questions' gold articles),
metrics/encode_rerank.json (the legal element indicator's counts)."""

from __future__ import annotations

import sys

from lexgraph.core.config import resolve_device
from lexgraph.core.io import read_parquet, write_json
from lexgraph.encoding.rerank_features import build_features
from lexgraph.training.rerank_config import RerankConfig


def configure(parser):
    parser.add_argument("--articles", required=True)
    parser.add_argument("--questions", required=True)
    parser.add_argument("--pretrain", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--metrics", required=True)


def main(args, base, config):
    articles = read_parquet(args.articles, ["id", "article"])
    questions = read_parquet(args.questions, ["id", "question", "article_ids", "split"])
    stats = build_features(
        articles, questions, config["xrerank"], args.pretrain, args.out, resolve_device(base.device), base.seed
    )
    write_json(stats, args.metrics)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("rerank", main, configure, name="encode_rerank", config=RerankConfig.per_variant))
