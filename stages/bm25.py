"""bm25: the BM25 baseline index over the clean corpus (k1, b given or tuned)."""

from __future__ import annotations

import logging
import sys

from lexgraph.core.io import atomic_path, read_parquet
from lexgraph.systems.bm25_pipeline import Bm25Config, build_index, read_tuned, resolve_k1_b

log = logging.getLogger("lexgraph.bm25")


def configure(parser):
    parser.add_argument("--articles", required=True)
    parser.add_argument("--tuned", required=True, help="bm25_tune's best pair")
    parser.add_argument("--out", required=True)


def main(args, base, config):
    k1, b = resolve_k1_b(config, read_tuned(args.tuned, config))
    log.info("bm25: k1=%.2f b=%.2f", k1, b)
    index = build_index(read_parquet(args.articles, ["id", "article"]), k1, b)
    with atomic_path(args.out, directory=True) as tmp:
        index.save(tmp)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("bm25", main, configure, config=Bm25Config.from_params))
