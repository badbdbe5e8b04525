"""train_dsr: contrastive training of the dense statute retriever (query encoder +
hierarchical article encoder), best epoch by dev recall@200."""

from __future__ import annotations

import logging
import sys

from lexgraph.core.config import resolve_device
from lexgraph.core.stage import add_paths, paths_from
from lexgraph.training.dsr import TrainDsrPaths, run_train_dsr
from lexgraph.training.dsr_config import DSRConfig

log = logging.getLogger("lexgraph.train_dsr")


def configure(parser):
    add_paths(parser, TrainDsrPaths)


def main(args, base, config):
    summary = run_train_dsr(paths_from(TrainDsrPaths, args), config, resolve_device(base.device), base.seed)
    log.info("train_dsr: best epoch %s, dev recall@200 %s", summary["best_epoch"], summary["dev_recall@200"])


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("dsr", main, configure, name="train_dsr", config=DSRConfig.from_params))
