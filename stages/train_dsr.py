"""train_dsr: contrastive training of the dense statute retriever (query encoder +
hierarchical article encoder), best epoch by dev recall@200."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, run_stage
from lexgraph.methods.dsr.config import DSRConfig
from lexgraph.methods.dsr.train import TrainDsrPaths, run_train_dsr

STAGE = Stage("train_dsr", "dsr", TrainDsrPaths, DSRConfig.from_params, run_train_dsr)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
