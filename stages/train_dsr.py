"""train_dsr: contrastive training of the dense statute retriever (query encoder +
hierarchical article encoder), best epoch by dev recall@200."""

from __future__ import annotations

import logging
import sys

from lexgraph.core.stage import Stage, StageContext, run_stage
from lexgraph.methods.dsr.config import DSRConfig
from lexgraph.methods.dsr.train import TrainDsrPaths, run_train_dsr

log = logging.getLogger("lexgraph.train_dsr")


def run(paths: TrainDsrPaths, config: DSRConfig, context: StageContext) -> None:
    """Contrastive training of the dense statute retriever, best epoch by dev recall@200."""
    summary = run_train_dsr(paths, config, context)
    log.info("train_dsr: best epoch %s, dev recall@200 %s", summary["best_epoch"], summary["dev_recall@200"])


STAGE = Stage("train_dsr", "dsr", TrainDsrPaths, DSRConfig.from_params, run)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
