"""clean: data/raw -> data/clean (articles, headings, questions) + metrics/data.json."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, run_stage
from lexgraph.data.clean import CleanConfig, CleanPaths, run_clean

STAGE = Stage("clean", "clean", CleanPaths, CleanConfig.from_params, run_clean, uses_torch=False)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
