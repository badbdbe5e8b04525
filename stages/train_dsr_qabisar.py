"""train_dsr_qabisar: QABISAR's first stage (Santosh et al., COLING 2025, §2.1 and App. A), the
dense bi-encoder its graph encoder starts from: train_dsr's recipe (the ``dsr`` section) with the
``dsr_qabisar`` keys in its place (the dot product, no synthetic pairs); a placeholder in seconds
with ``dsr_qabisar.enabled: false``."""

from __future__ import annotations

import sys

from lexgraph.core.config import resolve_device
from lexgraph.core.stage import add_paths, paths_from
from lexgraph.training.dsr import TrainDsrPaths, run_train_dsr_qabisar
from lexgraph.training.dsr_config import QabisarDSRSettings


def configure(parser):
    add_paths(parser, TrainDsrPaths)


def main(args, base, config):
    run_train_dsr_qabisar(paths_from(TrainDsrPaths, args), config, resolve_device(base.device), base.seed)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(
        run_stage("dsr_qabisar", main, configure, name="train_dsr_qabisar", config=QabisarDSRSettings.from_sections)
    )
