"""mine_negatives: BM25 hard negatives for the training (and synthetic) questions.

    python stages/mine_negatives.py --articles data/clean/articles.parquet \
        --questions data/clean/questions.parquet --synthetic data/queries/synthetic.parquet \
        --hub-negatives data/raw/negatives.parquet --out data/negatives/negatives.parquet

Parameters: ``negatives`` section of params.yaml (k1, b, depth, k, splits).
"""

from __future__ import annotations

import sys

from lexgraph.core.stage import add_paths, paths_from
from lexgraph.training.negatives import NegativesConfig, NegativesPaths, run_mine_negatives


def configure(parser):
    add_paths(parser, NegativesPaths)


def main(args, base, config):
    run_mine_negatives(paths_from(NegativesPaths, args), config)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("negatives", main, configure, name="mine_negatives", config=NegativesConfig.from_params))
