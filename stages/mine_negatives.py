"""mine_negatives: BM25 hard negatives for the training (and synthetic) questions.

    python stages/mine_negatives.py --articles data/clean/articles.parquet \
        --questions data/clean/questions.parquet --synthetic data/queries/synthetic.parquet \
        --hub-negatives data/raw/negatives.parquet --out data/negatives/negatives.parquet

Parameters: ``negatives`` section of params.yaml (k1, b, depth, k, splits).
"""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, run_stage
from lexgraph.methods.dsr.negatives import NegativesConfig, NegativesPaths, run_mine_negatives

STAGE = Stage("mine_negatives", "negatives", NegativesPaths, NegativesConfig.from_params, run_mine_negatives)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
