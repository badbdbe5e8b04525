"""Domain-adaptive MLM pre-training on the cleaned articles (params section `pretrain`)."""

from __future__ import annotations

import sys

from lexgraph.core.stage import add_paths, paths_from
from lexgraph.training.pretrain_model import PretrainConfig, PretrainPaths


def configure(parser):
    add_paths(parser, PretrainPaths)


def main(args, base, config):
    """Domain-adaptive MLM pre-training on the cleaned articles."""
    from lexgraph.training.pretrain import run

    paths = paths_from(PretrainPaths, args)
    run(paths.articles, paths.out, paths.metrics, config, seed=base.seed, device=base.device, plot=paths.plot)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("pretrain", main, configure, config=PretrainConfig.from_params))
