"""build_graph: cleaned articles, headings and train questions -> typed legislative graph."""

from __future__ import annotations

import sys

from lexgraph.core.stage import add_paths, paths_from
from lexgraph.graph.build import GraphConfig, GraphPaths, run_build_graph


def configure(parser):
    add_paths(parser, GraphPaths)


def main(args, base, config):
    run_build_graph(paths_from(GraphPaths, args), config)


if __name__ == "__main__":
    from lexgraph.core.stage import run_stage

    sys.exit(run_stage("graph", main, configure, name="build_graph", config=GraphConfig.from_params))
