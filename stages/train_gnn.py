"""train_gnn: train the graph encoder of G-DSR (--variant gdsr), QABISAR (qabisar) or lexgraph's
recipes (hgraph, hgraph_qa)."""

from __future__ import annotations

import sys

from lexgraph.core.stage import add_paths, paths_from
from lexgraph.training.gnn_config import VARIANTS, GNNSettings
from lexgraph.training.gnn_io import TrainGnnPaths


def configure(parser):
    parser.add_argument("--variant", required=True, choices=VARIANTS)
    add_paths(parser, TrainGnnPaths)


def main(args, base, config):
    """Train the graph encoder of one variant (``config``: both variants' settings, checked up front)."""
    from lexgraph.core.config import resolve_device
    from lexgraph.training.gnn_stage import run_train_gnn

    run_train_gnn(paths_from(TrainGnnPaths, args), config[args.variant], resolve_device(base.device), base.seed)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("gnn", main, configure, name="train_gnn", config=GNNSettings.per_variant))
