"""bm25_tune: grid search of BM25's k1 x b on the dev split (grid written as a DVC plot)."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, run_stage
from lexgraph.methods.bm25.system import Bm25TuneConfig, Bm25TunePaths, run_bm25_tune

STAGE = Stage("bm25_tune", "bm25_tune", Bm25TunePaths, Bm25TuneConfig.from_params, run_bm25_tune, uses_torch=False)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
