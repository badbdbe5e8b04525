"""encode_rerank: the frozen base encoder's token states for the xrerank re-ranker -> data/rerank/
(articles, train and dev questions, element views of the train questions' gold articles),
metrics/encode_rerank.json (the legal element indicator's counts)."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, StageContext, run_stage
from lexgraph.methods.rerank.config import RerankConfig
from lexgraph.methods.rerank.features import EncodeRerankPaths, run_encode_rerank


def run(paths: EncodeRerankPaths, config: dict, context: StageContext) -> None:
    """The frozen base encoder's token states for the xrerank re-ranker (``config``: each
    re-ranker's, checked up front)."""
    run_encode_rerank(paths, config["xrerank"], context)


STAGE = Stage("encode_rerank", "rerank", EncodeRerankPaths, RerankConfig.per_variant, run)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
