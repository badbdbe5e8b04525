"""bm25: the BM25 baseline index over the clean corpus (k1, b given or tuned)."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, run_stage
from lexgraph.methods.bm25.system import Bm25Config, Bm25Paths, run_bm25

STAGE = Stage("bm25", "bm25", Bm25Paths, Bm25Config.from_params, run_bm25, uses_torch=False)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
