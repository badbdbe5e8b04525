"""Synthetic queries per article: the fetched ones kept, the rest random crops, doc2query or none (params section
`queries`)."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, run_stage
from lexgraph.data.queries import QueriesConfig, QueriesPaths, run_generate_queries

STAGE = Stage("generate_queries", "queries", QueriesPaths, QueriesConfig.from_params, run_generate_queries)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
