"""train_dsr_qabisar: QABISAR's first stage (Santosh et al., COLING 2025, §2.1 and App. A), the
dense bi-encoder its graph encoder starts from: train_dsr's recipe (the ``dsr`` section) with the
``dsr_qabisar`` keys in its place (the dot product, no synthetic pairs); a placeholder in seconds
with ``dsr_qabisar.enabled: false``."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, run_stage
from lexgraph.methods.dsr.config import QabisarDSRSettings
from lexgraph.methods.dsr.train import TrainDsrPaths, run_train_dsr_qabisar

STAGE = Stage(
    "train_dsr_qabisar", "dsr_qabisar", TrainDsrPaths, QabisarDSRSettings.from_sections, run_train_dsr_qabisar
)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
