"""fetch: BSARD (hub or local copy) or the embedded sample -> data/raw (BSARD schema, Parquet)."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, run_stage
from lexgraph.data.fetch import FetchConfig, FetchPaths, run_fetch

STAGE = Stage("fetch", "fetch", FetchPaths, FetchConfig.from_params, run_fetch, uses_torch=False)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
