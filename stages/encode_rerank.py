"""encode_rerank: the frozen base encoder's token states for the xrerank re-ranker -> data/rerank/
(articles, train and dev questions, element views of the train questions' gold articles),
metrics/encode_rerank.json (the legal element indicator's counts)."""

from __future__ import annotations

import sys

from lexgraph.core.config import resolve_device
from lexgraph.core.stage import add_paths, paths_from
from lexgraph.encoding.rerank_features import EncodeRerankPaths, run_encode_rerank
from lexgraph.training.rerank_config import RerankConfig


def configure(parser):
    add_paths(parser, EncodeRerankPaths)


def main(args, base, config):
    run_encode_rerank(paths_from(EncodeRerankPaths, args), config["xrerank"], resolve_device(base.device), base.seed)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("rerank", main, configure, name="encode_rerank", config=RerankConfig.per_variant))
