"""hybrid: choose, on the dev split, the dense system and the fusion (RRF or weighted score sum)
with which the `hybrid` system fuses BM25 with it -> models/hybrid/hybrid.json, metrics/hybrid_tune.json."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, StageContext, run_stage
from lexgraph.methods.hybrid.system import HybridConfig
from lexgraph.methods.hybrid.tune import HybridPaths


def run(paths: HybridPaths, config: HybridConfig, context: StageContext) -> None:
    """Choose on dev the dense system and the fusion the ``hybrid`` system fuses BM25 with."""
    from lexgraph.methods.hybrid.tune import run_hybrid
    from lexgraph.systems.registry import load_retriever

    run_hybrid(paths, config, context, load_retriever)


STAGE = Stage("hybrid", "hybrid", HybridPaths, HybridConfig.from_params, run)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
