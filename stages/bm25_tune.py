"""bm25_tune: grid search of BM25's k1 x b on the dev split (grid written as a DVC plot)."""

from __future__ import annotations

import sys

from lexgraph.core.stage import add_paths, paths_from
from lexgraph.systems.bm25_pipeline import Bm25TuneConfig, Bm25TunePaths, run_bm25_tune


def configure(parser):
    add_paths(parser, Bm25TunePaths)


def main(args, base, config):
    run_bm25_tune(paths_from(Bm25TunePaths, args), config)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("bm25_tune", main, configure, config=Bm25TuneConfig.from_params, uses_torch=False))
