"""Domain-adaptive MLM pre-training on the cleaned articles (params section `pretrain`)."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, StageContext, run_stage
from lexgraph.methods.pretrain.model import PretrainConfig, PretrainPaths


def run(paths: PretrainPaths, config: PretrainConfig, context: StageContext) -> None:
    """Domain-adaptive MLM pre-training on the cleaned articles."""
    from lexgraph.methods.pretrain.train import run_pretrain

    run_pretrain(paths, config, context)


STAGE = Stage("pretrain", "pretrain", PretrainPaths, PretrainConfig.from_params, run)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
