"""hprior: choose on dev how far DSR's article vectors are propagated through the hierarchy
(the parameter-free `hprior` system) -> models/hprior/, metrics/hprior_tune.json."""

from __future__ import annotations

import sys

from lexgraph.core.stage import Stage, run_stage
from lexgraph.methods.hprior.system import HpriorConfig, HpriorPaths, run_hprior

STAGE = Stage("hprior", "hprior", HpriorPaths, HpriorConfig.from_params, run_hprior)

if __name__ == "__main__":
    sys.exit(run_stage(STAGE))
