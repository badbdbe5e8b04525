"""train_gnn: train the graph encoder of G-DSR (--variant gdsr), QABISAR (qabisar) or lexgraph's
recipes (hgraph, hgraph_qa)."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, StageContext, run_stage
from lexgraph.methods.gnn.config import VARIANTS, GNNSettings
from lexgraph.methods.gnn.io import TrainGnnPaths


def run(paths: TrainGnnPaths, config: GNNSettings, context: StageContext) -> None:
    """Train the graph encoder of one variant (every variant's settings checked up front)."""
    from lexgraph.methods.gnn.stage import run_train_gnn

    run_train_gnn(paths, config, context)


STAGE = Stage("train_gnn", "gnn", TrainGnnPaths, GNNSettings.per_variant, run, variants=VARIANTS)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
