"""bm25: the BM25 baseline index over the clean corpus (k1, b given or tuned)."""

from __future__ import annotations

import sys

from lexgraph.core.stage import add_paths, paths_from
from lexgraph.systems.bm25_pipeline import Bm25Config, Bm25Paths, run_bm25


def configure(parser):
    add_paths(parser, Bm25Paths)


def main(args, base, config):
    run_bm25(paths_from(Bm25Paths, args), config)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("bm25", main, configure, config=Bm25Config.from_params, uses_torch=False))
