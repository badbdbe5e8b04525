"""build_graph: cleaned articles, headings and train questions -> typed legislative graph."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, run_stage
from lexgraph.graph.build import GraphConfig, GraphPaths, run_build_graph

STAGE = Stage("build_graph", "graph", GraphPaths, GraphConfig.from_params, run_build_graph)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
